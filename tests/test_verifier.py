"""The verifier service end to end: real math-verify, real worker processes, real gRPC on loopback."""

from __future__ import annotations

import random
import signal
import socket
import threading
import time
import urllib.request

import grpc
import pytest
from killed_caller import kill_mid_call
from math_verify import parse, verify
from verifier_cases import CASES

from cooper.runtime.client import ServiceUnavailable
from cooper.runtime.processes import ServiceStartError, start_service
from cooper.services.verifier.client import Verdict, VerifierClient, VerifyItem
from cooper.services.verifier.rules import looks_bare

TOWER = "So the value is \\boxed{9^{9^{9^{9}}}}."
NESTED = "\\boxed{" + "(" * 60 + "1+x" + ")" * 60 + "^{" * 30 + "2" + "}" * 30 + "}"


def _items(pairs):
    return [VerifyItem(id=f"i{n}", completion=c, reference=r) for n, (c, r) in enumerate(pairs)]


@pytest.fixture(scope="module")
def client(verifier_address):
    with VerifierClient(verifier_address) as c:
        c.wait_ready(60)
        yield c


def test_verdict_table(client):
    assert len(CASES) >= 60
    results = client.verify(_items([(c, r) for _, c, r, _ in CASES]))
    assert [r.id for r in results] == [f"i{n}" for n in range(len(CASES))]
    wrong = [
        (cat, c[:50], r[:50], exp, Verdict.Name(res.verdict))
        for (cat, c, r, exp), res in zip(CASES, results, strict=True)
        if Verdict.Name(res.verdict) != exp
    ]
    assert not wrong, wrong
    for (_, _, _, exp), res in zip(CASES, results, strict=True):
        assert (res.extracted != "") == (exp in ("CORRECT", "INCORRECT"))  # raw text, present iff an answer was found
        assert res.ms > 0


def _direct(completion: str, reference: str) -> str:
    """math-verify called directly, on this process's main thread, with its own default timeouts."""
    gold = parse(f"${reference.strip()}$") if looks_bare(reference.strip()) else []
    gold = gold or parse(reference.strip())
    if not gold:
        return "ERROR"
    pred = parse(completion)
    if not pred:
        return "NO_ANSWER"
    return "CORRECT" if verify(gold, pred) else "INCORRECT"


def test_service_equals_math_verify_called_directly(client):
    results = client.verify(_items([(c, r) for _, c, r, _ in CASES]))
    direct = [_direct(c, r) for _, c, r, _ in CASES]
    assert [Verdict.Name(r.verdict) for r in results] == direct


def test_pathological_items_time_out_and_the_rest_of_the_batch_is_right(client):
    timeout_s = 2.0  # the fixture's verifier.timeout_s
    pairs = [("\\boxed{4}", "4"), (TOWER, "5"), ("The answer is 7", "7"), (NESTED, "3"), ("\\boxed{2}", "3")]
    start = time.perf_counter()
    results = client.verify(_items(pairs))
    elapsed = time.perf_counter() - start
    verdicts = [Verdict.Name(r.verdict) for r in results]
    assert verdicts[0] == "CORRECT" and verdicts[2] == "CORRECT" and verdicts[4] == "INCORRECT"
    assert verdicts[1] == "TIMEOUT", results[1]
    for r in (results[1], results[3]):
        if r.verdict == Verdict.TIMEOUT:
            assert r.ms <= 2 * timeout_s * 1000
            assert r.detail
    assert elapsed < 2 * timeout_s * 2 + 1.0  # two slow items, two workers, plus scheduling slack
    # the service keeps serving
    assert Verdict.Name(client.verify(_items([("\\boxed{1}", "1")]))[0].verdict) == "CORRECT"


def _random_string(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return ""
    if kind == 1:  # any code point outside the surrogates (protobuf strings must be valid UTF-8)
        return "".join(chr(c if c < 0xD800 or c > 0xDFFF else 0x2603) for c in
                       (rng.randint(1, 0x10FFFF) for _ in range(rng.randint(1, 200))))
    if kind == 2:
        return "".join(rng.choice("0123456789+-*/^{}()[]\\$ =.,xyz") for _ in range(rng.randint(1, 300)))
    if kind == 3:
        return rng.choice(["\\boxed{", "$$", "\\frac{", "####", "The answer is", "\\boxed{\\boxed{}}"]) * rng.randint(1, 50)
    if kind == 4:
        return "x" * rng.randint(100_000, 300_000) + " \\boxed{3}"  # huge
    return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 100)))


def test_a_thousand_random_strings_never_crash_the_service(client):
    rng = random.Random(1234)
    pairs = [(_random_string(rng), _random_string(rng) if rng.random() < 0.5 else "3") for _ in range(1000)]
    for start in range(0, len(pairs), 250):
        results = client.verify(_items(pairs[start : start + 250]))
        assert len(results) == 250
        assert all(r.verdict in (Verdict.CORRECT, Verdict.INCORRECT, Verdict.NO_ANSWER, Verdict.TIMEOUT,
                                 Verdict.ERROR) for r in results)
    assert client.healthy()
    assert Verdict.Name(client.verify(_items([("\\boxed{\\frac12}", "0.5")]))[0].verdict) == "CORRECT"


def test_huge_completion_keeps_its_answer(client):
    result = client.verify(_items([("words " * 50_000 + "The answer is \\boxed{12}.", "12")]))[0]
    assert Verdict.Name(result.verdict) == "CORRECT"


def test_empty_request_gets_empty_response(client):
    assert client.verify([]) == []


def test_health_and_metrics(verifier_service, client):
    assert client.healthy()
    client.verify(_items([("\\boxed{1}", "1")]))
    port = verifier_service.info["metrics_port"]
    assert port, "metrics port missing from the ready file"
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'cooper_verifier_verdicts_total{verdict="CORRECT"}' in body
    assert 'cooper_rpc_seconds_count{code="OK",method="Verify",service="verifier"}' in body


def test_sigusr1_prints_every_thread_and_the_service_goes_on(verifier_service, client):
    """docs/operations.md, "A process seems stuck": the stacks land in the service's log; it keeps serving."""
    start = verifier_service.log_path.stat().st_size
    verifier_service.process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    # The main thread (serving) and the pool's driver thread, each with its stack.
    while not all(part in (dump := verifier_service.log_path.read_bytes()[start:].decode(errors="replace"))
                  for part in ("Current thread", "in run_service", "verifier/pool.py")):
        assert time.monotonic() < deadline, dump[-3000:]
        time.sleep(0.05)
    assert verifier_service.process.poll() is None
    assert [Verdict.Name(r.verdict) for r in client.verify(_items([("\\boxed{2}", "2")]))] == ["CORRECT"]


def test_client_retries_only_unavailable():
    from cooper.config import ServerConfig

    config = ServerConfig(unavailable_timeout_s=0.3, retry_backoff_s=0.05, retry_backoff_max_s=0.1)
    with VerifierClient("127.0.0.1:1", config) as dead:
        start = time.perf_counter()
        with pytest.raises(ServiceUnavailable, match="verifier service at 127.0.0.1:1 stayed unavailable for 0.3 s"):
            dead.verify(_items([("1", "1")]))
        assert time.perf_counter() - start >= 0.3  # retried for the whole budget, not a count of tries


def test_client_does_not_retry_a_deadline(client):
    start = time.perf_counter()
    with pytest.raises(grpc.RpcError) as err:
        client.verify(_items([(TOWER, "5")] * 4), deadline_s=0.2)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.perf_counter() - start < 1.0


def test_sigterm_drains_in_flight_calls_then_exits():
    service = start_service("verifier", overrides=["verifier.workers=1", "verifier.timeout_s=2",
                                                   "verifier.server.metrics_port=null"])
    from cooper.config import ServerConfig

    # A short UNAVAILABLE budget: the last call must fail fast once the service is gone (default: minutes).
    with VerifierClient(service.address, ServerConfig(unavailable_timeout_s=1.0, retry_backoff_s=0.05)) as c:
        c.wait_ready(60)
        outcome = {}

        def slow_call():
            try:
                outcome["results"] = c.verify(_items([(TOWER, "5"), ("\\boxed{1}", "1")]))
            except grpc.RpcError as err:
                outcome["error"] = err

        thread = threading.Thread(target=slow_call)
        thread.start()
        time.sleep(0.5)  # the call is in flight: the tower takes ~2 s
        service.process.send_signal(signal.SIGTERM)
        thread.join(timeout=15)
        assert "error" not in outcome, outcome.get("error")
        assert [Verdict.Name(r.verdict) for r in outcome["results"]] == ["TIMEOUT", "CORRECT"]
        assert service.process.wait(timeout=15) == 0
        with pytest.raises(ServiceUnavailable):
            c.verify(_items([("\\boxed{1}", "1")]))


def test_a_caller_killed_mid_call_leaves_the_service_answering():
    """With one worker slot, a client that dies while its Verify call is in the worker must not take the slot with
    it: the next call is answered (before the fix, the slot's thread died on the cancelled call's result, and every
    later call waited for its deadline while health said SERVING)."""
    service = start_service("verifier", overrides=["verifier.workers=1", "verifier.timeout_s=2",
                                                   "verifier.server.metrics_port=null"])
    try:
        kill_mid_call(
            setup=f"from cooper.services.verifier.client import VerifierClient\n"
                  f"c = VerifierClient({service.address!r}); c.wait_ready(60)",
            call=f"c.verify_pairs([({TOWER!r}, '5'), ('\\\\boxed{{1}}', '1')])",  # the tower takes the 2 s timeout
            served_for_s=0.7)
        with VerifierClient(service.address) as c:
            results = c.verify(_items([("\\boxed{2}", "2")]), deadline_s=20)
            assert [Verdict.Name(r.verdict) for r in results] == ["CORRECT"]
            assert c.healthy()
        assert service.process.poll() is None
    finally:
        service.stop()


def test_a_service_that_cannot_start_fails_with_the_reason_from_its_log():
    """Its metrics port is taken: the error carries the service's own log (read before stopping removes it)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ServiceStartError, match=r"(?s)service verifier exited with 1:.*Address already in use"):
            start_service("verifier", overrides=["verifier.workers=1", f"verifier.server.metrics_port={port}"])
        assert time.monotonic() - started < 60


def test_boxed_only_answers_refuse_a_repeated_question_expression():
    from cooper.services.verifier.rules import Verdict as V
    from cooper.services.verifier.rules import check, last_boxed

    echo = "We compute 7 * 8 = }."  # what rule-mode GRPO learned to write on the tiny task
    assert check(echo, "56", 3).verdict == V.CORRECT  # math-verify's default reads the expression "7 * 8"
    assert check(echo, "56", 3, answer="boxed").verdict == V.NO_ANSWER
    worked = "We compute 7 * 8 = 56. The answer is \\boxed{56}."
    assert check(worked, "56", 3, answer="boxed").verdict == V.CORRECT
    assert check("The answer is \\boxed{55}.", "56", 3, answer="boxed").verdict == V.INCORRECT
    assert check("\\boxed{}", "56", 3, answer="boxed").verdict == V.NO_ANSWER
    # The last complete box counts: nested braces are matched, an unclosed box at the end is not an answer.
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\frac{1}{2}} and \\boxed{12") == "\\frac{1}{2}"
    assert last_boxed("no box here") is None


def test_the_service_reads_only_boxes_when_configured(tmp_path):
    service = start_service("verifier", overrides=["verifier.workers=1", "verifier.answer=boxed",
                                                   "verifier.server.metrics_port=null"])
    try:
        with VerifierClient(service.address) as client:
            client.wait_ready(60)
            verdicts = client.verify(_items([("We compute 3 + 5 = }.", "8"), ("\\boxed{8}", "8")]))
        assert [v.verdict for v in verdicts] == [Verdict.NO_ANSWER, Verdict.CORRECT]
    finally:
        service.stop()
