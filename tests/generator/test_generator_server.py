"""`cooper serve generator` as a real process: health, Negatives and Judge over gRPC, concurrent requests."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from cooper.config import ServerConfig
from cooper.runtime.client import ServiceUnavailable
from cooper.services.generator.client import GeneratorClient, JudgeItem, Judgment, NegativeItem
from cooper.tiny.examples import example_tasks


@pytest.fixture
def generator(cooper_serve, verifier_address, chat_server):  # type: ignore[no-untyped-def]
    """A generator with the llm strategy behind the loopback chat server (concurrency 2), and its client."""
    base_url, _ = chat_server
    info = cooper_serve(
        ["generator", "--port", "0", f"verifier.server.address={verifier_address}",
         "generator.server.metrics_port=null", "generator.strategy=llm", "generator.assistant.backend=openai",
         f"generator.assistant.base_url={base_url}", "generator.assistant.concurrency=2",
         "generator.assistant.model_name=rewriter"],
    )
    client = GeneratorClient(f"127.0.0.1:{info['grpc_port']}", ServerConfig(deadline_s=60, unavailable_timeout_s=5))
    yield client, info
    client.close()


def test_negatives_and_judge_over_grpc_with_concurrent_requests(generator, chat_server):  # type: ignore[no-untyped-def]
    client, info = generator
    _, script = chat_server
    client.wait_ready(timeout_s=10)
    assert client.healthy() and info["service"] == "generator" and info["strategy"] == "llm"
    right = "We compute 5 + 6 = 11. The answer is \\boxed{11}."
    script.reset(
        replies={f"[n{i}]": ["We compute 5 + 6 = 12. The answer is \\boxed{12}."] for i in range(8)}
        | {"[j1]": ["Same value.\nFinal Judgment: Yes"], "[j2]": ["Final Judgment: No"],
           "[j4]": ["Both are 11 [j4].", " Yes"]},
        delay_s=0.1,
    )
    script.replies["[n0]"] = [right, "We compute 5 + 6 = 13. The answer is \\boxed{13}."]
    batches = [[NegativeItem(id=f"{b}{i}", question=f"[n{4 * b + i}] 5 + 6?", reference="11", positive=right)
                for i in range(4)] for b in range(2)]
    with ThreadPoolExecutor(2) as pool:  # two RPCs at once share the assistant's bound of 2 calls
        results = list(pool.map(client.negatives, batches))
    flat = [r for batch in results for r in batch]
    assert [r.id for r in flat] == [item.id for batch in batches for item in batch]
    assert all(r.valid for r in flat)
    first = flat[0]
    assert first.attempts == 2 and first.negative.endswith("\\boxed{13}.") and len(first.rejections) == 1
    assert first.reason.startswith("same_as_positive") and first.reason == first.rejections[0]
    assert all(r.attempts == 1 and r.reason == "" and not r.rejections for r in flat[1:])
    assert script.max_in_flight == 2

    asked = len(script.requests)
    verdicts = client.judge([JudgeItem(question=f"[j{i}] 5 + 6?", reference="11", completion=right)
                             for i in (1, 2, 3, 4)])
    assert [v.verdict for v in verdicts] == [Judgment.Value(v) for v in ("YES", "NO", "UNKNOWN", "YES")]
    assert verdicts[0].raw == "Same value.\nFinal Judgment: Yes"
    # The replies without a verdict line ([j3], [j4]) were continued from one, through vLLM's extension.
    assert verdicts[3].raw == "Both are 11 [j4].\n\nFinal Judgment: Yes"
    follow_ups = [r for r in script.requests[asked:] if r["messages"][-1]["role"] == "assistant"]
    assert len(script.requests) - asked == 6 and len(follow_ups) == 2
    assert all(r["continue_final_message"] is True and r["add_generation_prompt"] is False and r["max_tokens"] == 4
               and r["messages"][-1]["content"].endswith("\n\nFinal Judgment:") for r in follow_ups)


def test_unreachable_assistant_is_unavailable_not_a_silent_miss(cooper_serve, verifier_address):  # type: ignore[no-untyped-def]
    info = cooper_serve(
        ["generator", "--port", "0", f"verifier.server.address={verifier_address}",
         "generator.server.metrics_port=null", "generator.strategy=llm", "generator.assistant.backend=openai",
         "generator.assistant.base_url=http://127.0.0.1:9/v1", "generator.assistant.retries=0"],
    )
    with GeneratorClient(f"127.0.0.1:{info['grpc_port']}", ServerConfig(unavailable_timeout_s=0)) as client:
        # UNAVAILABLE (a stateless call, safe to retry), which the client raises once its retries are spent.
        with pytest.raises(ServiceUnavailable, match="assistant endpoint .* unreachable"):
            client.negatives([NegativeItem(id="x", question="q", reference="1", positive="\\boxed{1}")])
        with pytest.raises(ServiceUnavailable, match="assistant endpoint .* unreachable"):
            client.judge([JudgeItem(question="q", reference="1", completion="1")])


def test_serve_generator_without_a_verifier_address_says_what_to_set():
    out = subprocess.run(
        [sys.executable, "-m", "cooper.cli", "serve", "generator", "--port", "0", "generator.server.metrics_port=null"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2
    assert "verifier.server.address" in out.stderr


def test_serve_generator_perturb_answers_health_and_negatives(cooper_serve, verifier_address):  # type: ignore[no-untyped-def]
    info = cooper_serve(
        ["generator", "--port", "0", f"verifier.server.address={verifier_address}",
         "generator.server.metrics_port=null", "generator.strategy=perturb"],
    )
    tasks = example_tasks(per_style=3)
    with GeneratorClient(f"127.0.0.1:{info['grpc_port']}", ServerConfig(deadline_s=60)) as client:
        client.wait_ready(timeout_s=10)
        assert client.healthy()
        results = client.negatives(
            [NegativeItem(id=t.id, question=t.question, reference=t.reference, positive=t.positive) for t in tasks]
        )
    assert [r.id for r in results] == [t.id for t in tasks]
    assert all(r.valid and r.attempts >= 1 and r.negative != t.positive for r, t in zip(results, tasks, strict=True))
