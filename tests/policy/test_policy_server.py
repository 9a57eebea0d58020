"""The policy service over real gRPC on loopback: Generate, Train (idempotent), Info, Save and resume, errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import torch

from cooper.config import CooperConfig, PolicyConfig
from cooper.protos.common.v1 import common_pb2
from cooper.protos.policy.v1 import policy_pb2
from cooper.services.policy.client import PolicyClient
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.errors import StaleRollout
from cooper.services.policy.server import build_service

PROMPTS = [("p0", "Tom has 3 apples."), ("p1", "Ivy has 12 pens and gives away 2.")]


class Served:
    """A GrpcService on its own event loop in a thread, like `cooper serve` runs it, plus a client."""

    def __init__(self, core: PolicyCore):
        self.core = core
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        config = CooperConfig(policy=core.cfg)
        self.service = build_service(config, core)
        port = asyncio.run_coroutine_threadsafe(self.service.start(), self.loop).result(30)
        self.client = PolicyClient(f"127.0.0.1:{port}", core.cfg.server)
        self.client.wait_ready(10)

    def close(self) -> None:
        if not self.thread.is_alive():  # closed already (a test stopped it; the fixture closes every one again)
            return
        self.client.close()
        asyncio.run_coroutine_threadsafe(self.service.stop(0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def serve() -> Iterator[Callable[[PolicyConfig], Served]]:
    started: list[Served] = []

    def start(cfg: PolicyConfig) -> Served:
        started.append(Served(PolicyCore(cfg)))
        return started[-1]

    yield start
    for served in started:
        served.close()


def test_generate_train_replay_save_and_resume(serve: Callable[[PolicyConfig], Served], tmp_path: Path,
                                               make_config: Callable[..., PolicyConfig]) -> None:
    cfg = make_config(tmp_path / "ckpt")
    served = serve(cfg)
    client = served.client

    reply = client.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=6, seed=4)
    assert reply.version == 0
    assert [(c.prompt_id, c.index) for c in reply.completions] == [(p, i) for p, _ in PROMPTS for i in range(3)]
    for c in reply.completions:
        assert 0 < len(c.token_ids) == len(c.logprobs) <= 6
        assert c.finish_reason in ("stop", "length") and c.prompt_token_ids
    again = client.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=6, seed=4)
    assert [list(c.token_ids) for c in again.completions] == [list(c.token_ids) for c in reply.completions]

    rewards = [1.0, 0.0, 0.0, 0.0, 0.5, 1.0]
    first = client.train("run-a", 1, reply.completions, rewards, group_size=3, sampled_version=0)
    assert first.version == 1 and not first.replayed
    assert {"loss", "policy_loss", "kl", "clip_fraction", "grad_norm", "entropy", "response_length", "lr"} <= set(
        first.metrics)
    weights = {n: p.detach().clone() for n, p in served.core.model.named_parameters()}
    repeat = client.train("run-a", 1, reply.completions, rewards, group_size=3, sampled_version=0)
    assert repeat.replayed and repeat.version == 1 and dict(repeat.metrics) == dict(first.metrics)
    assert all(torch.equal(p, weights[n]) for n, p in served.core.model.named_parameters())  # nothing applied

    info = client.info()
    assert (info.version, info.engine, info.device, info.last_key) == (1, "transformers", "cpu", "run-a/1")
    assert info.parameters == sum(p.numel() for p in served.core.model.parameters())

    saved = client.save("step-1")
    path = Path(saved.path)
    assert saved.version == 1 and path.parent == tmp_path / "ckpt"
    assert (path / "model.safetensors").is_file() and (path / "optimizer.pt").is_file()
    assert json.loads((path / "state.json").read_text())["last_key"] == "run-a/1"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp dir left behind
    assert client.info().checkpoint == saved.path

    # A fresh service on the same checkpoint dir resumes: weights, optimizer, version, and the key's result.
    resumed = serve(cfg)
    assert all(torch.equal(p, weights[n]) for n, p in resumed.core.model.named_parameters())
    assert resumed.core.trainer.updates == 1 and resumed.core.trainer.optimizer.state
    assert resumed.client.info().version == 1
    replay = resumed.client.train("run-a", 1, reply.completions, rewards, group_size=3, sampled_version=0)
    assert replay.replayed and replay.version == 1 and dict(replay.metrics) == pytest.approx(dict(first.metrics))
    fresh = resumed.client.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=6, seed=5)
    second = resumed.client.train("run-a", 2, fresh.completions, rewards, group_size=3, sampled_version=fresh.version)
    assert second.version == 2 and not second.replayed


def test_a_graceful_stop_saves_unsaved_updates(serve: Callable[[PolicyConfig], Served], tmp_path: Path,
                                                make_config: Callable[..., PolicyConfig]) -> None:
    """policy.save_on_stop: what `docker compose down` (SIGTERM) does to a service that saves only on Save()."""
    cfg = make_config(tmp_path / "ckpt", save_every=0, journal=False)
    served = serve(cfg)
    reply = served.client.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=6, seed=4)
    served.client.train("run-a", 1, reply.completions, [1.0, 0.0, 0.0, 0.0, 0.5, 1.0], group_size=3,
                         sampled_version=0)
    weights = {n: p.detach().clone() for n, p in served.core.model.named_parameters()}
    served.close()  # service.stop(): drain, then the shutdown hook
    resumed = serve(cfg)
    assert resumed.core.version == 1 and resumed.core.last_key == "run-a/1"
    assert all(torch.equal(p, weights[n]) for n, p in resumed.core.model.named_parameters())
    resumed.close()  # no update since it loaded v1: nothing new is written
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["v00000001"]

    off = make_config(tmp_path / "off", save_every=0, journal=False, save_on_stop=False)
    served = serve(off)
    served.client.train("run-b", 1, reply.completions, [1.0, 0.0, 0.0, 0.0, 0.5, 1.0], group_size=3,
                         sampled_version=0)
    served.close()
    assert not (tmp_path / "off").exists() or not list((tmp_path / "off").iterdir())


def test_bad_requests_are_invalid_argument(serve: Callable[[PolicyConfig], Served], tmp_path: Path,
                                           make_config: Callable[..., PolicyConfig]) -> None:
    client = serve(make_config(tmp_path)).client
    with pytest.raises(grpc.RpcError) as err:
        client.generate(PROMPTS, n=0, max_new_tokens=4)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "n must" in err.value.details()
    rollout = client.generate(PROMPTS, n=2, max_new_tokens=4).completions
    with pytest.raises(grpc.RpcError) as err:
        client.train("run", 1, rollout, [0.0, 1.0, 0.0, 1.0], group_size=1, sampled_version=0)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at least 2" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        client.train("", 1, rollout, [0.0, 1.0, 0.0, 1.0], group_size=2, sampled_version=0)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "idempotency key" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:  # a Train that does not say which version sampled its rollout
        client.stub.Train(policy_pb2.TrainRequest(key=common_pb2.IdempotencyKey(run_id="run", step=1), group_size=2))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "sampled_version" in err.value.details()
    with pytest.raises(StaleRollout, match="not made yet"):  # sampled by a version the trainer has not made
        client.train("run", 1, rollout, [0.0, 1.0, 0.0, 1.0], group_size=2, sampled_version=1)
    with pytest.raises(grpc.RpcError) as err:
        client.restore("run", 1, at_most_version=-1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at_most_version" in err.value.details()
    assert client.info().version == 0  # nothing was applied
    restored = client.restore("run", 1, at_most_version=0)  # nothing saved yet: the initial model, as version 1
    assert (restored.restored_version, restored.version, restored.replayed) == (0, 1, False)
    assert client.restore("run", 1, at_most_version=0).replayed and client.info().last_key == "run/1"


def test_cooper_serve_policy_starts_and_drains(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cooper.cli", "serve", "policy", "--port", "0", "--ready-file", str(ready),
         f"policy.checkpoint_dir={tmp_path / 'ckpt'}", "policy.device=cpu", "policy.torch_threads=1",
         "policy.server.metrics_port=0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "policy service did not become ready in 120 s"
            time.sleep(0.2)
        info = json.loads(ready.read_text())
        port = info["grpc_port"]
        assert info["metrics_port"] and info["version"] == 0
        with PolicyClient(f"127.0.0.1:{port}") as client:
            assert client.info().engine == "transformers"
            assert len(client.generate(PROMPTS[:1], n=2, max_new_tokens=3).completions) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_failed_journal_write_answers_unavailable_and_stops_the_service(
        serve: Callable[[PolicyConfig], Served], tmp_path: Path, make_config: Callable[..., PolicyConfig],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cooper.runtime.journal import UpdateJournal

    served = serve(make_config(tmp_path / "ckpt"))
    reply = served.client.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=6, seed=4)

    def disk_full(journal: UpdateJournal, *args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(UpdateJournal, "append", disk_full)
    rollout = [policy_pb2.Completion(prompt_id=c.prompt_id, index=c.index, token_ids=c.token_ids, logprobs=c.logprobs,
                                     prompt_token_ids=c.prompt_token_ids) for c in reply.completions]
    request = policy_pb2.TrainRequest(key=common_pb2.IdempotencyKey(run_id="run-a", step=1), rollout=rollout,
                                      rewards=[1.0, 0.0, 0.0, 0.0, 0.5, 1.0], group_size=3, sampled_version=0)
    with pytest.raises(grpc.RpcError) as err:  # applied in memory, not journaled: the retry must go to a restart
        served.client.stub.Train(request, timeout=60)  # the stub alone: the client would retry on UNAVAILABLE
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "journal" in err.value.details()
    assert served.service.failure is not None  # stopping, exit 1, for its supervisor to start it again
