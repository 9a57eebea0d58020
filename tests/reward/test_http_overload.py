"""The reward HTTP API under overload, on a real uvicorn on loopback: many more concurrent clients than the service
can serve, for a bounded time. Every request ends, and only in a documented way: 200 with one score per item and
the version, 503 with Retry-After (queue full), or the 413/422 of a request that breaks a limit. Afterwards the
service serves as before, and the process's memory is back near where it started."""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import httpx
import psutil
import pytest
from reward_testkit import make_config, serve_http, tiny_items

from cooper.config import BatchingConfig, HttpConfig

CLIENTS = 64
"""Concurrent clients: 8x what the queue holds when each sends 2 items (max_queue 16 items)."""
SECONDS = 4.0
REQUEST_TIMEOUT_S = 30.0


def _body(items: list) -> dict:  # type: ignore[type-arg]
    return {"items": [{"question": i.question, "reference": i.reference, "completion": i.completion} for i in items]}


async def _client(url: str, index: int, until: float, outcomes: collections.Counter, problems: list[str]) -> None:
    items = tiny_items(6, seed=index)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        sent = 0
        while time.monotonic() < until:
            sent += 1
            if index % 8 == 0 and sent in (2, 3):  # some clients also send one over the item limit, one malformed
                body = _body(items) if sent == 2 else {"items": "not a list"}
            else:
                body = _body(items[: 1 + sent % 2])
            try:
                reply = await client.post(f"{url}/v1/score", json=body)
            except httpx.HTTPError as err:  # a hang ends here, as a timeout
                problems.append(f"client {index}: {type(err).__name__}: {err}")
                return
            status = reply.status_code
            outcomes[status] += 1
            if status == 200:
                data = reply.json()
                if len(data["scores"]) != len(body["items"]) or not isinstance(data.get("version"), int):
                    problems.append(f"client {index}: a 200 with {len(data['scores'])} scores for "
                                    f"{len(body['items'])} items, version {data.get('version')!r}")
            elif status == 503:
                if int(reply.headers.get("retry-after", "0")) < 1:
                    problems.append(f"client {index}: 503 without Retry-After")
                await asyncio.sleep(0.01)
            elif status not in (413, 422):
                problems.append(f"client {index}: HTTP {status}: {reply.text[:200]}")


@pytest.mark.slow
def test_many_more_clients_than_capacity_get_answers_and_the_service_recovers(tmp_path: Path) -> None:
    config = make_config(tmp_path, http=HttpConfig(port=0, max_items=4, max_chars=4000),
                         batching=BatchingConfig(max_queue=16, max_batch_size=8, max_wait_ms=2))
    with serve_http(config) as served:
        process = psutil.Process()
        before = process.memory_info().rss
        outcomes: collections.Counter = collections.Counter()
        problems: list[str] = []

        async def overload() -> None:
            until = time.monotonic() + SECONDS
            await asyncio.gather(*(_client(served.url, i, until, outcomes, problems) for i in range(CLIENTS)))

        started = time.monotonic()
        asyncio.run(overload())
        elapsed = time.monotonic() - started
        assert not problems, problems[:5]
        assert outcomes[200] > 0 and outcomes[503] > 0, outcomes  # served some, shed some: it was overloaded
        assert outcomes[413] > 0 and outcomes[422] > 0, outcomes
        assert elapsed < SECONDS + REQUEST_TIMEOUT_S  # every request ended
        # Afterwards: a plain request is served, and the queue is empty.
        reply = httpx.post(f"{served.url}/v1/score", json=_body(tiny_items(3)), timeout=30)
        assert reply.status_code == 200 and len(reply.json()["scores"]) == 3
        assert served.service.batcher.queued_items == 0
        grown_mb = (process.memory_info().rss - before) / 2**20
        print(f"overload: {dict(outcomes)} in {elapsed:.1f} s; memory {grown_mb:+.0f} MB")
        assert grown_mb < 200, f"memory grew by {grown_mb:.0f} MB under overload"
