"""`cooper-reward-client` (clients/python/) against the real HTTP API on a real uvicorn: the scores `/v1/score`
gives, each refusal as its typed error, a full queue retried after the server's Retry-After, and nothing heavy
imported (a platform team installs it without torch)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from reward_testkit import Served, make_config, serve_http, tiny_items

from cooper.config import BatchingConfig, HttpConfig

CLIENT_DIR = Path(__file__).resolve().parents[2] / "clients" / "python"
sys.path.insert(0, str(CLIENT_DIR))

from cooper_reward_client import (  # noqa: E402  (the client's own folder, as `pip install ./clients/python` puts it)
    InvalidRequest,
    Item,
    Overloaded,
    RewardApiError,
    RewardClient,
    TooLarge,
    Unauthorized,
)

TOKEN = "client-token-1234"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    config = make_config(Path(tmp_path_factory.mktemp("reward-client")),
                         http=HttpConfig(port=0, token=TOKEN, max_items=4, max_chars=2000),
                         batching=BatchingConfig(max_queue=6, max_wait_ms=5))
    with serve_http(config) as served:
        yield served


def _items(n: int, seed: int = 0) -> list[Item]:
    return [Item(i.question, i.reference, i.completion) for i in tiny_items(n, seed=seed)]


def test_the_client_gets_what_the_api_answers(served: Served) -> None:
    client = RewardClient(served.url, token=TOKEN)
    items = _items(3)
    scored = client.score(items)
    raw = httpx.post(f"{served.url}/v1/score", headers={"Authorization": f"Bearer {TOKEN}"}, json={"items": [
        {"question": i.question, "reference": i.reference, "completion": i.completion} for i in items]}).json()
    assert scored.scores == [s["score"] for s in raw["scores"]] and scored.logits == [s["logit"] for s in raw["scores"]]
    assert scored.version == raw["version"] == client.info()["version"]
    assert client.ready() and not RewardClient("http://127.0.0.1:9", timeout_s=2).ready()  # nothing listens there


def test_each_refusal_is_its_typed_error(served: Served) -> None:
    with pytest.raises(Unauthorized) as refused:
        RewardClient(served.url, token="wrong-token-1234").score(_items(1))
    assert refused.value.status == 401 and refused.value.type == "unauthorized" and refused.value.message
    client = RewardClient(served.url, token=TOKEN)
    with pytest.raises(TooLarge, match="413 too_large"):
        client.score(_items(5))  # reward.http.max_items is 4
    with pytest.raises(InvalidRequest) as invalid:
        client.score([Item("q", "r", None)])  # type: ignore[arg-type]
    assert invalid.value.status == 422
    assert client.score(_items(1)).scores  # the service still serves


def _hold_the_model_with_a_full_queue(served: Served, pool: ThreadPoolExecutor) -> tuple[threading.Event, object]:
    """Hold the model, and queue 4 items behind it (max_queue 6): a request of 3 more is refused with 503."""
    gate = threading.Event()
    blocker = asyncio.run_coroutine_threadsafe(served.service.batcher.run_exclusive(
        lambda: served.service.runner.run(gate.wait, 20)), served.loop)
    queued = pool.submit(RewardClient(served.url, token=TOKEN).score, _items(4, seed=1))
    deadline = time.monotonic() + 10
    while served.service.batcher.queued_items < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    return gate, (blocker, queued)


def test_a_full_queue_is_retried_after_retry_after(served: Served) -> None:
    retried: list[RewardApiError] = []

    def on_retry(error: RewardApiError) -> None:  # the service catches up while the client waits
        retried.append(error)
        gate.set()

    with ThreadPoolExecutor(1) as pool:
        gate, (blocker, queued) = _hold_the_model_with_a_full_queue(served, pool)
        start = time.monotonic()
        scored = RewardClient(served.url, token=TOKEN, on_retry=on_retry).score(_items(3))
        waited = time.monotonic() - start
        blocker.result(10)  # type: ignore[attr-defined]
        assert len(queued.result(10).scores) == 4  # type: ignore[attr-defined]
    assert len(retried) == 1 and isinstance(retried[0], Overloaded) and retried[0].status == 503
    assert retried[0].retry_after_s is not None and retried[0].retry_after_s >= 1 and waited >= retried[0].retry_after_s
    assert len(scored.scores) == 3

    with ThreadPoolExecutor(1) as pool:  # no retries left: the 503 reaches the caller, with Retry-After
        gate, (blocker, queued) = _hold_the_model_with_a_full_queue(served, pool)
        try:
            with pytest.raises(Overloaded) as refused:
                RewardClient(served.url, token=TOKEN, retries=0).score(_items(3))
        finally:
            gate.set()
        blocker.result(10)  # type: ignore[attr-defined]
        queued.result(10)  # type: ignore[attr-defined]
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1


def test_the_client_imports_nothing_heavy() -> None:
    probe = ("import sys; import cooper_reward_client; "
             "heavy = sorted(m for m in ('torch', 'transformers', 'httpx', 'requests', 'grpc', 'cooper') "
             "if m in sys.modules); print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=CLIENT_DIR, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
