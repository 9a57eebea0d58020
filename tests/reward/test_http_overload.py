"""The reward HTTP API under overload: a real `cooper serve reward` process (uvicorn on loopback, the model in a
process of its own, as deployed) and many more concurrent clients than it can hold, for a bounded time and count.
Every request ends, and only in a documented way: 200 with one score per item and the version, 503 with Retry-After
(queue full), or the 413/422 of a request that breaks a limit. Afterwards the service serves as before, its queue
is empty, and the memory of its processes is back near where it was."""

from __future__ import annotations

import asyncio
import collections
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from reward_testkit import tiny_items

from cooper.runtime.processes import start_service

MAX_QUEUE, MAX_BATCH = 8, 4
"""Items the service holds waiting (reward.batching.max_queue), and at most in the batch being scored."""
CLIENTS = 48
"""Concurrent clients, each with one request of 1-2 items in flight: 4x the 12 items the service holds at once
(queue and batch), 6x its queue. Not more: on 2 busy cores the clients themselves become the bottleneck."""
SECONDS = 5.0
WARM_SECONDS = 2.0
MAX_REQUESTS = 150
"""Per client: the overload is bounded in count as well as in time."""
REQUEST_TIMEOUT_S = 30.0
"""Longer than anything the service may take (an item waits at most reward.batching.queue_timeout_s, 30 s, but
the queue holds 16 items): a request that reaches it hung."""
MEMORY_SLACK_MB = 64


@dataclass
class Outcomes:
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    latencies_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _body(items: list) -> dict:  # type: ignore[type-arg]
    return {"items": [{"question": i.question, "reference": i.reference, "completion": i.completion} for i in items]}


async def _client(url: str, index: int, until: float, outcomes: Outcomes) -> None:
    items = tiny_items(6, seed=index)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        for sent in range(MAX_REQUESTS):
            # The clock ends a client's requests after its first two, never before: on a loaded machine the clients
            # start late, and the oversize and malformed requests below must still be sent.
            if sent >= 2 and time.monotonic() >= until:
                return
            if index % 8 == 0 and sent in (0, 1):  # some clients also send one over the item limit, one malformed
                body = _body(items) if sent == 0 else {"items": "not a list"}
            else:
                body = _body(items[: 1 + sent % 2])
            started = time.monotonic()
            try:
                reply = await client.post(f"{url}/v1/score", json=body)
            except httpx.HTTPError as err:  # a hang ends here, as a timeout
                outcomes.problems.append(f"client {index}: {type(err).__name__}: {err}")
                return
            outcomes.latencies_s.append(time.monotonic() - started)
            status = reply.status_code
            outcomes.statuses[status] += 1
            if status == 200:
                data = reply.json()
                scores = data["scores"]
                if len(scores) != len(body["items"]) or not isinstance(data.get("version"), int) or \
                            not all(0.0 <= s["score"] <= 1.0 for s in scores):
                    outcomes.problems.append(f"client {index}: a 200 with scores {scores} for {len(body['items'])} "
                                             f"items, version {data.get('version')!r}")
            elif status == 503:
                if int(reply.headers.get("retry-after", "0")) < 1:
                    outcomes.problems.append(f"client {index}: 503 without Retry-After")
                await asyncio.sleep(0.01)  # a client that honoured Retry-After would not overload it
            elif status not in (413, 422):
                outcomes.problems.append(f"client {index}: HTTP {status}: {reply.text[:200]}")


def _rss_mb(pid: int) -> float:
    """The resident memory of the service and its children (the model process)."""
    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20


def _queued_items(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^cooper_reward_queued_items (\S+)$", metrics, re.MULTILINE)
    assert found, metrics[:2000]
    return float(found.group(1))


@pytest.fixture(params=["tiny", "smollm2-135m-instruct"])
def reward_process(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The tiny VerifyRM (a forward pass of a few milliseconds: the HTTP front decides), and a real model's, the
    SmolLM2-135M-Instruct base under a fresh head (tens of milliseconds a batch here: the forward decides)."""
    service = start_service("reward", overrides=[
        f"reward.model={request.param}", "reward.device=cpu", "reward.torch_threads=1", "reward.server.metrics_port=null",
        "reward.http.port=0", "reward.http.max_items=4", "reward.http.max_chars=4000",
        f"reward.batching.max_queue={MAX_QUEUE}", f"reward.batching.max_batch_size={MAX_BATCH}", "reward.batching.max_wait_ms=2",
        f"reward.checkpoint_dir={tmp_path / 'checkpoints'}"])
    yield service, f"http://127.0.0.1:{service.info['http_port']}"
    assert service.stop() == 0  # it drains and exits cleanly after the overload too


@pytest.mark.slow
def test_many_more_clients_than_capacity_get_answers_and_the_service_recovers(reward_process) -> None:
    service, url = reward_process
    warm = _body(tiny_items(3))
    for _ in range(20):
        assert httpx.post(f"{url}/v1/score", json=warm, timeout=30).status_code == 200

    async def overload(seconds: float, outcomes: Outcomes) -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(*(_client(url, i, until, outcomes) for i in range(CLIENTS)))

    # A first, short overload: the batches it forms (full ones, of every length) allocate what every later pass
    # reuses, so that what the measured one adds to the processes' memory is what it keeps.
    asyncio.run(overload(WARM_SECONDS, Outcomes()))
    before_mb = _rss_mb(service.process.pid)
    outcomes = Outcomes()
    started = time.monotonic()
    asyncio.run(overload(SECONDS, outcomes))
    elapsed = time.monotonic() - started
    statuses = outcomes.statuses
    print(f"\noverload: {CLIENTS} clients, {sum(statuses.values())} requests in {elapsed:.1f} s: {dict(statuses)}")
    assert not outcomes.problems, outcomes.problems[:5]
    assert statuses[200] > 0 and statuses[503] > 0, statuses  # served some, shed some: it was overloaded
    assert statuses[413] > 0 and statuses[422] > 0, statuses
    assert elapsed < SECONDS + REQUEST_TIMEOUT_S  # every request ended
    # Afterwards: a plain request is served, and nothing is left waiting.
    reply = httpx.post(f"{url}/v1/score", json=warm, timeout=30)
    assert reply.status_code == 200 and len(reply.json()["scores"]) == 3
    assert _queued_items(url) == 0
    after_mb = _rss_mb(service.process.pid)
    quantiles = statistics.quantiles(outcomes.latencies_s, n=100)
    print(f"latency p50 {quantiles[49] * 1000:.0f} ms, p99 {quantiles[98] * 1000:.0f} ms; service RSS "
          f"{before_mb:.0f} MB before, {after_mb:.0f} MB after")
    assert after_mb - before_mb < MEMORY_SLACK_MB, f"memory grew from {before_mb:.0f} to {after_mb:.0f} MB"
