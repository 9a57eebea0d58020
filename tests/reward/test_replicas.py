"""Read replicas (reward.role=replica) as real `cooper serve reward` processes on loopback, sharing a checkpoint
directory with a trainer: they catch up with each saved version, score like the trainer, refuse Update and Save, and
apply the stale policy when a checkpoint cannot be loaded."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from reward_testkit import make_config, start_reward_processes, stop_processes, tiny_items, tiny_pairs

from cooper.config import ReplicaConfig, ServerConfig
from cooper.runtime import checkpoint
from cooper.runtime.checkpoint import REWARD
from cooper.runtime.client import ServiceUnavailable
from cooper.services.reward.client import RewardClient
from cooper.services.reward.core import RewardCore
from cooper.services.reward.replica import judge

CATCH_UP_S = 5.0  # poll_s=0.2 plus a tiny model's load: the replicas must serve a saved version within this
POLL = "reward.replica.poll_s=0.2"


def replica(*extra: str) -> list[str]:
    return ["reward.role=replica", POLL, *extra]


def body(items: list[Any]) -> dict[str, Any]:
    return {"items": [{"question": i.question, "reference": i.reference, "completion": i.completion} for i in items]}


def wait_for(condition: Any, timeout_s: float, what: str) -> float:
    """Seconds until condition() held; fails after timeout_s."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"{what} not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


def model_version(url: str) -> int:
    return httpx.get(f"{url}/v1/model").json()["version"]


@pytest.mark.slow
def test_two_replicas_catch_up_with_the_trainer_and_score_like_it(tmp_path: Path) -> None:
    ckpt = f"reward.checkpoint_dir={tmp_path / 'ckpt'}"
    started = start_reward_processes(tmp_path, {
        "trainer": [ckpt, "reward.optim.lr=0.003", "reward.model_process=false"],
        "replica-a": replica(ckpt),  # the model in a child process: the weight swap crosses the pipe
        "replica-b": replica(ckpt, "reward.model_process=false"),
    })
    processes = {name: process for name, (process, _) in started.items()}
    grpc_at = {name: f"127.0.0.1:{ready['grpc_port']}" for name, (_, ready) in started.items()}
    http_at = {name: f"http://127.0.0.1:{ready['http_port']}" for name, (_, ready) in started.items()}
    items = tiny_items(6)
    try:
        with RewardClient(grpc_at["trainer"]) as trainer:
            for step in range(1, 4):
                assert trainer.update("run", step, tiny_pairs(4, seed=step)).version == step
                saved = trainer.save()
            saved_at = time.monotonic()
            assert saved.version == 3
            expected = trainer.score(items)
        caught_up = {name: wait_for(lambda url=http_at[name]: model_version(url) == 3, CATCH_UP_S, name)
                     for name in ("replica-a", "replica-b")}
        print(f"catch-up after the last save: {time.monotonic() - saved_at:.2f} s ({caught_up})")
        assert expected.version == 3

        for name in ("replica-a", "replica-b"):
            reply = httpx.post(f"{http_at[name]}/v1/score", json=body(items))
            assert reply.status_code == 200 and "x-cooper-stale" not in reply.headers
            assert reply.json()["version"] == 3
            got = [s["logit"] for s in reply.json()["scores"]]
            assert max(abs(a - b) for a, b in zip(got, expected.logits, strict=True)) <= 1e-5
            info = httpx.get(f"{http_at[name]}/v1/model").json()
            assert (info["role"], info["trainer_version"], info["stale"]) == ("replica", 3, False)
            assert info["checkpoint"] == saved.path

            with RewardClient(grpc_at[name], ServerConfig(unavailable_timeout_s=0)) as client:
                scored = client.score(items)
                assert scored.version == 3
                assert max(abs(a - b) for a, b in zip(scored.logits, expected.logits, strict=True)) <= 1e-5
                with pytest.raises(grpc.RpcError) as refused:
                    client.update("run", 9, tiny_pairs(2))
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "read replica" in (refused.value.details() or "")
                with pytest.raises(grpc.RpcError) as refused:
                    client.save("from-a-replica")
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with RewardClient(grpc_at["trainer"]) as trainer:
            assert trainer.info().version == 3  # the refused update reached no model
        written = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
        assert stop_processes([processes["replica-a"], processes["replica-b"]]) == [0, 0]
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == written  # replicas never write there
    finally:
        assert stop_processes(list(processes.values()))[0] == 0


def plant_checkpoint(root: Path, source: Path, version: int, corrupt: bool) -> Path:
    """A copy of `source` as checkpoint `version`, renamed into place like the trainer's; weights cut in half."""
    tmp = root / f".tmp-planted-{version}"
    shutil.copytree(source, tmp)
    weights = tmp / "model.safetensors"
    if corrupt:
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    state = checkpoint.read_state(tmp, REWARD) | {"version": version, "updates": version}
    (tmp / REWARD.state_file).write_text(json.dumps(state))
    target = root / checkpoint.checkpoint_name(version, version)
    tmp.rename(target)
    return target


def test_a_replica_that_cannot_load_the_new_checkpoint_goes_stale_then_recovers(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    trainer = RewardCore.load(make_config(tmp_path, checkpoint_dir=str(root)))  # the trainer, in this process
    trainer.apply_update("run/1", tiny_pairs(4, seed=1))
    first = Path(trainer.save().path)
    limits = [f"reward.checkpoint_dir={root}", "reward.replica.max_lag_s=1", "reward.model_process=false"]
    started = start_reward_processes(tmp_path, {
        "refuse": replica(*limits, "reward.replica.on_stale=refuse"),
        "serve": replica(*limits, "reward.replica.on_stale=serve"),
    })
    processes = [process for process, _ in started.values()]
    url = {name: f"http://127.0.0.1:{ready['http_port']}" for name, (_, ready) in started.items()}
    items = tiny_items(3)
    try:
        assert model_version(url["refuse"]) == model_version(url["serve"]) == 1
        plant_checkpoint(root, first, 2, corrupt=True)
        took = wait_for(lambda: httpx.get(f"{url['refuse']}/readyz").status_code == 503, 10, "unready")
        assert took >= 0.8  # not before max_lag_s (less the one poll by which the lag is measured late)

        reply = httpx.post(f"{url['refuse']}/v1/score", json=body(items))
        assert reply.status_code == 503 and reply.json()["error"]["type"] == "stale"
        assert reply.headers["retry-after"] == "1" and "version 1" in reply.json()["error"]["message"]
        with RewardClient(f"127.0.0.1:{started['refuse'][1]['grpc_port']}", ServerConfig(unavailable_timeout_s=0)) as client:
            assert not client.healthy()  # the gRPC readiness probe: NOT_SERVING
            with pytest.raises(ServiceUnavailable, match="replica is stale"):  # UNAVAILABLE: clients retry elsewhere
                client.score(items)
        info = httpx.get(f"{url['refuse']}/v1/model").json()
        assert (info["version"], info["trainer_version"], info["stale"]) == (1, 2, True) and info["lag_s"] > 1
        metrics = httpx.get(f"{url['refuse']}/metrics").text
        assert "cooper_reward_replica_stale 1.0" in metrics
        assert 'cooper_reward_replica_loads_total{outcome="failed"}' in metrics

        # Each replica polls on its own, so the serving one may notice the lag a poll after the refusing one.
        wait_for(lambda: httpx.get(f"{url['serve']}/v1/model").json()["stale"], 10, "serve replica stale")
        served = httpx.post(f"{url['serve']}/v1/score", json=body(items))  # on_stale=serve: answers, flagged
        assert served.status_code == 200 and served.json()["version"] == 1
        assert "1 behind the trainer's 2" in served.headers["x-cooper-stale"]
        assert httpx.get(f"{url['serve']}/readyz").status_code == 200

        # The trainer writes a good version 3: both load it, ready again, and score like the trainer.
        trainer.apply_update("run/2", tiny_pairs(4, seed=2))
        trainer.apply_update("run/3", tiny_pairs(4, seed=3))
        trainer.save()
        expected = trainer.rm.logits(trainer.rm.encode(items), batch_size=len(items))
        wait_for(lambda: httpx.get(f"{url['refuse']}/readyz").status_code == 200, CATCH_UP_S, "ready again")
        for name in ("refuse", "serve"):  # each replica polls on its own: wait for both to serve version 3
            wait_for(lambda u=url[name]: model_version(u) == 3, CATCH_UP_S, f"{name} at version 3")
        for name in ("refuse", "serve"):
            reply = httpx.post(f"{url[name]}/v1/score", json=body(items))
            assert reply.status_code == 200 and "x-cooper-stale" not in reply.headers
            assert reply.json()["version"] == 3
            got = [s["logit"] for s in reply.json()["scores"]]
            assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 1e-5
    finally:
        assert stop_processes(processes) == [0, 0]


def test_staleness_by_lag_and_by_versions_behind() -> None:
    config = ReplicaConfig(poll_s=1, max_lag_s=10, max_versions_behind=2)
    current = judge(config, served_version=5, trainer_version=5, behind_since=None, listed_at=100, now=100.5)
    assert (current.lag_s, current.versions_behind, current.stale) == (0, 0, False)
    lagging = judge(config, 5, 6, behind_since=100, listed_at=111, now=111)
    assert (lagging.lag_s, lagging.stale) == (11, True)
    assert judge(config, 5, 8, behind_since=110, listed_at=111, now=111).stale  # 3 behind, 1 s late
    assert not judge(config, 5, 7, behind_since=110, listed_at=111, now=111).stale
    blind = judge(config, 5, 5, behind_since=None, listed_at=100, now=112)  # listings failing for 12 s
    assert blind.lag_s == 11 and blind.stale
    assert not judge(ReplicaConfig(max_lag_s=None), 5, 6, behind_since=0, listed_at=1e6, now=1e6).stale
