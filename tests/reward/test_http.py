"""The HTTP API through a real uvicorn on loopback, over the real service and tiny model.

The service and uvicorn run in an event loop on a background thread, as in `cooper serve reward`; the tests are
plain HTTP clients. The loop handle lets a test hold the model thread, to fill the queue deterministically.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from reward_testkit import Served, make_config, serve_http, tiny_items

from cooper.config import BatchingConfig, HttpConfig

TOKEN = "test-token-1234"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    config = make_config(
        Path(tmp_path_factory.mktemp("reward-http")),
        http=HttpConfig(port=0, token=TOKEN, max_items=4, max_chars=2000, max_body_mb=0.05),
        batching=BatchingConfig(max_queue=6, max_wait_ms=5),
    )
    with serve_http(config) as served:
        yield served


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def body(items: list[Any]) -> dict[str, Any]:
    return {"items": [{"question": i.question, "reference": i.reference, "completion": i.completion} for i in items]}


def assert_error(reply: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    data = reply.json()
    assert set(data) == {"error"} and set(data["error"]) == {"type", "message"}  # the one error schema
    assert data["error"]["type"] == kind and data["error"]["message"]
    return data


def test_score_matches_the_model_and_says_its_version(served: Served) -> None:
    items = tiny_items(3)
    reply = httpx.post(f"{served.url}/v1/score", json=body(items), headers=auth())
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["version"] == served.service.core.rm.version
    direct = served.service.core.rm.score(items)
    for got, (probability, logit) in zip(data["scores"], direct, strict=True):
        assert abs(got["logit"] - logit) <= 1e-5 and abs(got["score"] - probability) <= 1e-5


def test_bearer_token_is_required_on_the_api_but_not_on_probes(served: Served) -> None:
    one = body(tiny_items(1))
    assert_error(httpx.post(f"{served.url}/v1/score", json=one), 401, "unauthorized")
    reply = httpx.post(f"{served.url}/v1/score", json=one, headers=auth("wrong-token-1234"))
    assert_error(reply, 401, "unauthorized")
    assert reply.headers["www-authenticate"] == "Bearer"
    assert_error(httpx.get(f"{served.url}/v1/model", headers={"Authorization": TOKEN}), 401, "unauthorized")
    assert_error(httpx.post(f"{served.url}/get_reward", json={}), 401, "unauthorized")
    for path in ("/healthz", "/readyz", "/metrics", "/docs", "/openapi.json"):
        assert httpx.get(f"{served.url}{path}").status_code == 200, path


def test_limits_and_malformed_bodies_get_clear_4xx(served: Served) -> None:
    assert_error(httpx.post(f"{served.url}/v1/score", json=body(tiny_items(5)), headers=auth()), 413, "too_large")
    long = body(tiny_items(1))
    long["items"][0]["completion"] = "x" * 2001
    data = assert_error(httpx.post(f"{served.url}/v1/score", json=long, headers=auth()), 413, "too_large")
    assert "max_chars" in data["error"]["message"]
    huge = httpx.post(f"{served.url}/v1/score", content=b"{" + b" " * 60_000 + b"}", headers=auth())
    assert "max_body_mb" in assert_error(huge, 413, "too_large")["error"]["message"]
    assert_error(httpx.post(f"{served.url}/v1/score", content=b"{not json", headers={**auth(), "Content-Type":
                                                                                      "application/json"}),
                 422, "invalid_request")
    missing = {"items": [{"question": "q", "reference": "1"}]}
    data = assert_error(httpx.post(f"{served.url}/v1/score", json=missing, headers=auth()), 422, "invalid_request")
    assert "completion" in data["error"]["message"]
    assert_error(httpx.post(f"{served.url}/v1/score", json={"items": [], "extra": 1}, headers=auth()), 422,
                 "invalid_request")
    assert_error(httpx.get(f"{served.url}/nowhere"), 404, "not_found")


def test_full_queue_answers_503_with_retry_after(served: Served) -> None:
    gate = threading.Event()
    blocker = asyncio.run_coroutine_threadsafe(served.service.batcher.run_exclusive(lambda: served.service.runner.run(gate.wait, 20)),
                                               served.loop)
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(httpx.post, f"{served.url}/v1/score", json=body(tiny_items(4)), headers=auth(),
                             timeout=30)
        deadline = time.monotonic() + 10
        while served.service.batcher.queued_items < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        reply = httpx.post(f"{served.url}/v1/score", json=body(tiny_items(3)), headers=auth())  # 4 + 3 > 6
        gate.set()
        blocker.result(10)
        assert queued.result().status_code == 200
    assert_error(reply, 503, "overloaded")
    assert int(reply.headers["retry-after"]) >= 1


def test_concurrent_clients_get_the_scores_of_one_at_a_time(served: Served) -> None:
    items = tiny_items(16, seed=3)
    with httpx.Client(headers=auth()) as client:
        alone = [client.post(f"{served.url}/v1/score", json=body([item])).json() for item in items]

    def one(item: Any) -> dict[str, Any]:
        with httpx.Client(headers=auth()) as client:
            reply = client.post(f"{served.url}/v1/score", json=body([item]), timeout=30)
            assert reply.status_code == 200, reply.text
            return reply.json()

    # Hold the model until the first six requests wait, so that they are certainly batched together; the other
    # ten come as six concurrent clients (max_queue is 6).
    gate = threading.Event()
    blocker = asyncio.run_coroutine_threadsafe(served.service.batcher.run_exclusive(lambda: served.service.runner.run(gate.wait, 20)),
                                               served.loop)
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(one, item) for item in items[:6]]  # within max_queue=6
        deadline = time.monotonic() + 10
        while served.service.batcher.queued_items < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()
        blocker.result(10)
        together = [f.result() for f in futures] + list(pool.map(one, items[6:]))
    for a, b in zip(alone, together, strict=True):
        assert a["version"] == b["version"]
        assert abs(a["scores"][0]["logit"] - b["scores"][0]["logit"]) <= 1e-5
        assert abs(a["scores"][0]["score"] - b["scores"][0]["score"]) <= 1e-5
    metrics = httpx.get(f"{served.url}/metrics").text
    assert 'cooper_reward_batch_items_bucket{le="4.0"}' in metrics and "cooper_reward_queue_seconds" in metrics
    assert "cooper_reward_tokenize_seconds" in metrics and "cooper_reward_model_seconds" in metrics


def test_openrlhf_get_reward_protocol(served: Served) -> None:
    items = tiny_items(2)
    prompts = [f"<|im_start|>user\n{i.question}<|im_end|>\n<|im_start|>assistant\n" for i in items]
    pad, eos = served.service.core.rm.tokenizer.pad_token, served.service.core.rm.tokenizer.eos_token
    request = {
        "query": [pad + pad + prompts[0] + items[0].completion + eos, prompts[1] + items[1].completion],
        "prompts": prompts, "labels": [i.reference for i in items],
    }
    reply = httpx.post(f"{served.url}/get_reward", json=request, headers=auth())
    assert reply.status_code == 200, reply.text
    data = reply.json()
    expected = served.service.core.rm.score([type(i)(p, i.reference, i.completion) for i, p in zip(items, prompts,
                                                                                                strict=True)])
    assert max(abs(r - e[0]) for r, e in zip(data["rewards"], expected, strict=True)) <= 1e-5
    assert data["scores"] == data["rewards"] and data["version"] == served.service.core.rm.version
    assert data["extra_logs"]["reward_version"] == [float(data["version"])] * 2
    bad = {**request, "query": ["something else", request["query"][1]]}
    assert_error(httpx.post(f"{served.url}/get_reward", json=bad, headers=auth()), 422, "invalid_request")
    short = {**request, "labels": ["1"]}
    assert_error(httpx.post(f"{served.url}/get_reward", json=short, headers=auth()), 422, "invalid_request")


def test_model_info_and_probes(served: Served) -> None:
    info = httpx.get(f"{served.url}/v1/model", headers=auth()).json()
    assert info["model"] == "tiny" and info["version"] == served.service.core.rm.version
    assert info["parameters"] == served.service.core.rm.parameters and info["device"] == "cpu"
    # The settings in effect: the wait as set (so no wait per spread batch), the batch chosen at start-up (the
    # fixture leaves it unset), and so batches spread over the slots; tokenizing in the serving process.
    chosen = served.service.config.batching.max_batch_size
    assert info["serving"] == {"model_copies": 1, "max_batch_size": chosen, "max_wait_ms": 5.0, "max_inflight": 2,
                               "spread": True, "spread_waits_ms": None, "tokenize_in_model": False,
                               "cpu_linear": "torch"}
    assert chosen in (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert httpx.get(f"{served.url}/readyz").json()["status"] == "ready"
    spec = httpx.get(f"{served.url}/openapi.json").json()
    assert {"/v1/score", "/v1/model", "/get_reward", "/healthz", "/readyz", "/metrics"} <= set(spec["paths"])
    assert "413" in spec["paths"]["/v1/score"]["post"]["responses"]


def test_get_reward_without_labels_takes_the_reference_from_the_template_in_the_query(served: Served) -> None:
    from cooper.services.reward.verify_rm import format_input

    items = tiny_items(2, seed=5)
    pad, eos = served.service.core.rm.tokenizer.pad_token, served.service.core.rm.tokenizer.eos_token
    # an older OpenRLHF client: only `query`, the prompt (here in chat markup) holding the template up to the
    # completion, the policy's completion after it, decoded with pads and eos
    prompts = ["<|im_start|>user\n" + format_input(i.question, i.reference, "").removesuffix("</completion>")
               for i in items]
    query = [pad + prompts[0] + items[0].completion + eos, prompts[1] + items[1].completion + "</completion>"]
    reply = httpx.post(f"{served.url}/get_reward", json={"query": query}, headers=auth())
    assert reply.status_code == 200, reply.text
    expected = served.service.core.rm.score(items)
    assert max(abs(r - e[0]) for r, e in zip(reply.json()["rewards"], expected, strict=True)) <= 1e-5
    data = assert_error(httpx.post(f"{served.url}/get_reward", json={"query": ["just text"]}, headers=auth()), 422,
                        "invalid_request")
    assert "labels" in data["error"]["message"] and "<reference_answer>" in data["error"]["message"]
    no_prompts = {"query": query, "labels": [i.reference for i in items]}
    assert_error(httpx.post(f"{served.url}/get_reward", json=no_prompts, headers=auth()), 422, "invalid_request")


def test_vllm_classify_shape_scores_template_texts(served: Served) -> None:
    from cooper.reward_rule import logit_to_reward
    from cooper.services.reward.verify_rm import format_input

    items = tiny_items(3, seed=7)
    texts = [format_input(i.question, i.reference, i.completion) for i in items]
    direct = served.service.core.rm.score(items)
    for path in ("/classify", "/v1/classify"):
        reply = httpx.post(f"{served.url}{path}", json={"model": "any-name", "input": texts}, headers=auth())
        assert reply.status_code == 200, reply.text
        data = reply.json()
        assert set(data) == {"id", "object", "created", "model", "data", "usage", "version"}
        assert data["object"] == "list" and data["id"].startswith("classify-") and data["model"] == "tiny"
        assert data["version"] == served.service.core.rm.version
        assert data["usage"]["prompt_tokens"] == data["usage"]["total_tokens"] > 0
        assert [d["index"] for d in data["data"]] == [0, 1, 2]
        for got, (probability, _) in zip(data["data"], direct, strict=True):
            assert got["num_classes"] == 1 and abs(got["probs"][0] - probability) <= 1e-5
            assert got["label"] == "LABEL_0"  # the model's id2label, as vLLM answers
    # verl's reward loop: one string, activation off, reads data[-1].probs[-1] as the raw score
    raw = httpx.post(f"{served.url}/classify", json={"model": "m", "input": texts[0], "use_activation": False},
                     headers=auth()).json()
    assert abs(raw["data"][-1]["probs"][-1] - direct[0][1]) <= 1e-5
    assert abs(logit_to_reward(raw["data"][-1]["probs"][-1]) - direct[0][0]) <= 1e-5
    # vLLM 0.32 ignores the older names of use_activation: so does the service
    ignored = httpx.post(f"{served.url}/classify", json={"input": texts[0], "activation": False, "softmax": False},
                         headers=auth()).json()
    assert abs(ignored["data"][0]["probs"][0] - direct[0][0]) <= 1e-5

    def assert_vllm_error(reply: httpx.Response, status: int, kind: str) -> dict[str, Any]:
        assert reply.status_code == status, reply.text
        data = reply.json()
        assert set(data) == {"error"} and set(data["error"]) == {"message", "type", "param", "code"}  # vLLM's
        assert data["error"]["type"] == kind and data["error"]["code"] == status and data["error"]["message"]
        return data["error"]

    error = assert_vllm_error(httpx.post(f"{served.url}/classify", json={"input": ["hello"]}, headers=auth()), 400,
                              "BadRequestError")
    assert "<reference_answer>" in error["message"]
    error = assert_vllm_error(httpx.post(f"{served.url}/classify", json={"input": 5}, headers=auth()), 400,
                              "Bad Request")
    assert error["param"] == "body.input"
    assert_vllm_error(httpx.post(f"{served.url}/classify", json={"input": texts[0], "normalize": True},
                                 headers=auth()), 400, "BadRequestError")
    assert_vllm_error(httpx.post(f"{served.url}/v1/classify", content=b"not json", headers=auth()), 400,
                      "Bad Request")
    reply = httpx.post(f"{served.url}/classify", json={"input": texts})
    assert_vllm_error(reply, 401, "Unauthorized")
    assert reply.headers["WWW-Authenticate"] == "Bearer"
    too_many = httpx.post(f"{served.url}/classify", json={"input": texts * 2}, headers=auth())  # max_items 4
    assert_vllm_error(too_many, 413, "Request Entity Too Large")
    # the other routes keep the service's own error schema
    assert_error(httpx.post(f"{served.url}/v1/score", json={"items": 5}, headers=auth()), 422, "invalid_request")


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def close(self) -> None:
        self.calls.append(("close", b""))

    def is_closing(self) -> bool:
        return any(call == "close" for call, _ in self.calls)

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


def test_a_response_head_and_body_go_out_in_one_write() -> None:
    from cooper.services.reward.serving.http import CoalescingTransport

    async def respond() -> RecordingTransport:
        inner = RecordingTransport()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"{}")
        assert inner.calls == []  # not yet: at the end of this loop iteration
        await asyncio.sleep(0)
        assert inner.calls == [("write", b"HTTP/1.1 200 OK\r\n\r\n{}")]
        transport.write(b"last")
        transport.close()  # flushes first
        assert transport.get_extra_info("peername") == "info peername"  # the rest is the transport's own
        await asyncio.sleep(0)
        return inner

    inner = asyncio.run(respond())
    assert inner.calls[1:] == [("write", b"last"), ("close", b"")]


def close(a: Any, b: Any) -> bool:
    """Equal JSON, floats within 1e-5 (the same item in another batch may round differently)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and abs(a - b) <= 1e-5
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_the_scoring_fast_path_answers_as_fastapi_does(served: Served) -> None:
    """Each request twice: with a Content-Length (the fast path takes the well-formed ones) and chunked (no length:
    FastAPI's route always). Same status, same body but for the request id and time, same headers a client reads.
    The routes' endpoints count their calls: the fast path must have answered the well-formed ones itself."""
    app = served.http.app
    reached: list[str] = []
    scoring = [r for r in app.routes if getattr(r, "path", None) in ("/v1/score", "/get_reward", "/classify",
                                                                     "/v1/classify")]
    originals = [route.app for route in scoring]
    for route, inner in zip(scoring, originals, strict=True):

        async def counting(scope: Any, receive: Any, send: Any, inner: Any = inner) -> None:
            reached.append(scope["path"])
            await inner(scope, receive, send)

        route.app = counting
    try:
        _compare_fast_and_fastapi(served, reached)
    finally:
        for route, inner in zip(scoring, originals, strict=True):
            route.app = inner


def _compare_fast_and_fastapi(served: Served, reached: list[str]) -> None:
    from cooper.services.reward.verify_rm import format_input

    items = tiny_items(3, seed=11)
    texts = [format_input(i.question, i.reference, i.completion) for i in items]
    one = body(items[:1])
    long = body(items[:1])
    long["items"][0]["completion"] = "x" * 2001
    cases: list[tuple[str, Any, dict[str, str], bool]] = [  # path, JSON body, headers, well-formed
        ("/v1/score", body(items), auth(), True),
        ("/v1/score", body(tiny_items(5)), auth(), True),  # 413 from the handler, after parsing
        ("/v1/score", long, auth(), True),
        ("/v1/score", {"items": 5}, auth(), False),
        ("/v1/score", {"items": [], "extra": 1}, auth(), False),
        ("/v1/score", one, {}, False),
        ("/v1/score", one, auth("wrong-token-1234"), False),
        ("/v1/score", one, {"Authorization": f"bearer   {TOKEN}"}, True),  # read as FastAPI's HTTPBearer reads it
        ("/get_reward", {"query": [texts[0]]}, auth(), True),
        ("/get_reward", {"query": ["no template"]}, auth(), True),  # 422 from the handler
        ("/get_reward", {"query": ["Q" + "A"], "prompts": ["Q"], "labels": ["1", "2"]}, auth(), True),
        ("/classify", {"model": "m", "input": texts, "use_activation": False}, auth(), True),
        ("/v1/classify", {"input": texts[0]}, auth(), True),
        ("/classify", {"input": ["hello"]}, auth(), True),
        ("/classify", {"input": texts[0], "normalize": True}, auth(), True),
        ("/classify", {"input": []}, auth(), True),
        ("/classify", {"input": texts * 2}, auth(), True),
        ("/classify", {"input": 5}, auth(), False),
        ("/classify", {"input": texts[0], "use_activation": "no"}, auth(), False),
        ("/classify", {"input": texts}, {}, False),
    ]
    for path, payload, headers, well_formed in cases:
        data = httpx.Request("POST", "/", json=payload).content
        answers = []
        for content in (data, iter([data])):  # bytes: Content-Length; an iterator: chunked
            reached.clear()
            reply = httpx.post(f"{served.url}{path}", content=content,
                               headers={"Content-Type": "application/json", **headers})
            answers.append(reply)
            assert reached == ([] if well_formed and isinstance(content, bytes) else [path]), (path, payload)
        fast, slow = answers
        assert fast.status_code == slow.status_code, (path, payload, fast.text, slow.text)
        fast_body, slow_body = fast.json(), slow.json()
        for answer in (fast_body, slow_body):
            answer.pop("id", None), answer.pop("created", None)
        assert close(fast_body, slow_body), (path, payload, fast_body, slow_body)
        for name in ("content-type", "retry-after", "www-authenticate", "x-cooper-stale"):
            assert fast.headers.get(name) == slow.headers.get(name), (path, name)
    assert httpx.post(f"{served.url}/v1/score", content=b"{", headers=auth()).status_code == 422  # not JSON


def test_an_unexpected_error_is_a_500_both_ways_and_the_service_serves_on(served: Served) -> None:
    one = body(tiny_items(1))
    data = httpx.Request("POST", "/", json=one).content

    async def broken(items: Any) -> Any:
        raise RuntimeError("the model went away")

    served.service.score = broken  # type: ignore[method-assign]
    try:
        for content in (data, iter([data])):  # the fast path, then FastAPI's route
            reply = httpx.post(f"{served.url}/v1/score", content=content,
                               headers={"Content-Type": "application/json", **auth()})
            error = assert_error(reply, 500, "internal")["error"]
            assert "RuntimeError: the model went away" in error["message"]
    finally:
        del served.service.score
    assert httpx.post(f"{served.url}/v1/score", json=one, headers=auth()).status_code == 200
