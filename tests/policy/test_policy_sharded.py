"""The policy service with 2 training ranks (FSDP2, gloo on CPU, real processes) over real gRPC on loopback.

The 2-rank update must equal the 1-rank update on the same batch (within 1e-5), checkpoints must move between
world sizes both ways, and a rank killed mid-update must fail the call with UNAVAILABLE while the service starts
its ranks again and applies the retry.

The optimizer's eps is raised to 1e-4 here so that AdamW's first steps are about proportional to the gradient
instead of its sign: a gradient off by a factor (averaged instead of summed over ranks, a per-rank token-mean)
then moves the weights differently, and the 1e-5 comparison can fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from test_policy_server import Served

from cooper.config import PolicyConfig
from cooper.runtime.client import ServiceUnavailable
from cooper.services.policy.client import PolicyClient
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.sharded import split_batch
from cooper.services.policy.trainer import RolloutSample
from cooper.services.policy.updaters import resolve_world_size

# 3 prompts x 3 completions = 9 samples: the ranks get 5 and 4, so with micro-batches of 2 rank 1 runs a masked
# dummy pass to match rank 0's third one, and one prompt's group straddles the two ranks.
PROMPTS = [("p0", "Tom has 3 apples."), ("p1", "Ivy has 12 pens and gives away 2."), ("p2", "Add 4 and 5.")]
REWARDS = [[1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5, 1.0],
           [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]]
TOLERANCE = 1e-5


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    """serve(cfg) starts a service; served.close() may end it early (the fixture closes the rest)."""
    running: list[Served] = []

    def start(cfg: PolicyConfig) -> Served:
        served = Served(PolicyCore(cfg))
        running.append(served)
        original = served.close

        def close() -> None:
            running.remove(served)
            original()

        served.close = close  # type: ignore[method-assign]
        return served

    yield start
    for served in list(running):
        served.close()


def _config(make_config: Callable[..., PolicyConfig], directory: Path, world_size: int, **extra: Any
            ) -> PolicyConfig:
    return make_config(directory, world_size=world_size,
                       optim={"lr": 1e-3, "eps": 1e-4, "micro_batch_size": 2, **extra.pop("optim", {})},
                       grpo={"kl_coef": 0.01}, distributed={"timeout_s": 120}, **extra)


def _weights(core: PolicyCore) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in core.model.named_parameters()}


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def _train_both(step: int, one: Served, two: Served, rollout: list[Any]) -> None:
    """The same Train on a 1-rank and a 2-rank service: same metrics and weights within TOLERANCE."""
    before = _weights(one.core)
    a = one.client.train("run", step, rollout, REWARDS[step - 1], group_size=3, sampled_version=one.client.info().version)
    b = two.client.train("run", step, rollout, REWARDS[step - 1], group_size=3, sampled_version=two.client.info().version)
    assert a.version == b.version and not b.replayed
    assert set(a.metrics) == set(b.metrics)
    for key in a.metrics:
        assert b.metrics[key] == pytest.approx(a.metrics[key], rel=1e-4, abs=1e-6), key
    assert _max_difference(_weights(one.core), _weights(two.core)) < TOLERANCE
    # The update is far larger than the tolerance, in every tensor, so the comparison is not vacuous.
    assert min(float((p - before[n]).abs().max()) for n, p in _weights(one.core).items()) > 10 * TOLERANCE


def test_two_ranks_update_like_one_and_checkpoints_move_between_world_sizes(
        serve: Callable[..., Served], tmp_path: Path, make_config: Callable[..., PolicyConfig]) -> None:
    one = serve(_config(make_config, tmp_path / "one-rank", 1))
    shared = tmp_path / "shared"  # written by 2 ranks, then 1, then 2 again
    two = serve(_config(make_config, shared, 2))
    assert two.core.world_size == 2 and list(two.core.trainer.local.processes) == [1]
    assert _max_difference(_weights(one.core), _weights(two.core)) == 0

    rollout = list(one.client.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=12, seed=7).completions)
    for i, completion in enumerate(rollout):
        # Uneven lengths (rank 0's share has more tokens): a per-rank token-mean would weigh tokens differently.
        del completion.token_ids[12 - 2 * (i % 5):]
    assert len({len(c.token_ids) for c in rollout}) > 3
    _train_both(1, one, two, rollout)

    # 2 ranks -> checkpoint -> 1 rank: the same weights (one HF directory, written once) and optimizer state.
    saved = Path(two.client.save("two-ranks").path)
    assert sorted(p.name for p in saved.iterdir() if p.suffix == ".safetensors") == ["model.safetensors"]
    two_weights = _weights(two.core)
    two.close()
    single = serve(_config(make_config, shared, 1))
    assert _max_difference(_weights(single.core), two_weights) == 0
    assert single.core.version == 1 and single.core.trainer.updates == 1
    reference_state = one.core.trainer.optimizer.state_dict()["state"]
    loaded_state = single.core.trainer.optimizer.state_dict()["state"]
    assert reference_state.keys() == loaded_state.keys()
    for index, entry in reference_state.items():
        for key, value in entry.items():
            assert torch.allclose(loaded_state[index][key], value, atol=1e-7), (index, key)
    _train_both(2, one, single, rollout)

    # 1 rank -> checkpoint -> 2 ranks, and the next update still matches the uninterrupted single-rank run.
    single.client.save("one-rank")
    single_weights = _weights(single.core)
    single.close()
    again = serve(_config(make_config, shared, 2))
    assert again.core.world_size == 2 and again.client.info().version == 2
    assert _max_difference(_weights(again.core), single_weights) == 0
    _train_both(3, one, again, rollout)

    # The alarm's rollback on two ranks: the ranks start again from the restored checkpoint (v1, written by 2 ranks)
    # and train on from its weights and optimizer state.
    with pytest.raises(grpc.RpcError) as err:  # a Train's key: refused, not answered with the Train's record
        again.client.restore("run", 1, at_most_version=1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "was a Train's" in err.value.details()
    restored = again.client.restore("rollback", 1, at_most_version=1)
    assert (restored.restored_version, restored.version) == (1, 4)
    assert _max_difference(_weights(again.core), two_weights) == 0 and again.core.trainer.updates == 1
    assert again.client.train("run", 5, rollout, [float(i % 2) for i in range(len(rollout))], group_size=3, sampled_version=again.client.info().version).version == 5


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="watches a rank's CPU time in /proc (Linux)")
def test_a_rank_killed_mid_update_fails_the_call_and_the_service_recovers(
        serve: Callable[..., Served], tmp_path: Path, make_config: Callable[..., PolicyConfig]) -> None:
    # Micro-batches of one sequence, 8 per rank: the update takes long enough to be caught in the middle.
    cfg = _config(make_config, tmp_path / "ckpt", 2, save_every=1, optim={"micro_batch_size": 1})
    served = serve(cfg)
    prompts = [(f"p{i}", f"Ivy has {i + 3} pens and gives away {i}.") for i in range(4)]
    rollout = list(served.client.generate(prompts, n=4, max_new_tokens=16, seed=3).completions)
    rewards = [float(i % 3 == 0) for i in range(len(rollout))]
    assert served.client.train("run", 1, rollout, rewards, group_size=4, sampled_version=served.client.info().version).version == 1  # checkpoint v1 written
    at_v1 = _weights(served.core)
    rank1 = served.core.trainer.local.processes[1].pid

    no_retry = PolicyClient(served.client.address, cfg.server.model_copy(update={"unavailable_timeout_s": 0}))
    outcome: dict[str, Any] = {}

    def train() -> None:
        try:
            outcome["reply"] = no_retry.train("run", 2, rollout, rewards, group_size=4, sampled_version=no_retry.info().version)
        except ServiceUnavailable as err:
            outcome["error"] = err

    idle = _cpu_ticks(rank1)  # blocked on its pipe until the command comes
    caller = threading.Thread(target=train)
    caller.start()
    deadline = time.monotonic() + 60
    while _cpu_ticks(rank1) < idle + 3:  # 30 ms of CPU: it is computing its share of the update
        assert caller.is_alive() and time.monotonic() < deadline, "rank 1 never started the update"
        time.sleep(0.005)
    os.kill(rank1, signal.SIGKILL)
    caller.join(120)
    no_retry.close()

    error = outcome.get("error")
    assert error is not None, f"the update finished before the kill: {outcome}"
    cause = error.__cause__
    assert isinstance(cause, grpc.RpcError) and cause.code() == grpc.StatusCode.UNAVAILABLE
    assert "policy rank 1 of 2 was killed by SIGKILL during update" in cause.details()
    assert "restarted its 2 ranks" in cause.details() and "retry" in cause.details()

    # Recovered: new rank 1, back at the checkpoint (version 1, its weights), and the retry is applied once.
    assert served.core.trainer.local.processes[1].pid != rank1
    assert served.client.info().version == 1
    assert _max_difference(_weights(served.core), at_v1) == 0
    retried = served.client.train("run", 2, rollout, rewards, group_size=4, sampled_version=served.client.info().version)
    assert retried.version == 2 and not retried.replayed
    assert served.client.train("run", 2, rollout, rewards, group_size=4, sampled_version=served.client.info().version).replayed


def _rank_processes(parent: int) -> list[int]:
    """Children of `parent` that multiprocessing spawned (the ranks; not its resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_text()
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        if ppid == parent and "spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the rank processes in /proc (Linux)")
def test_cooper_serve_policy_with_two_ranks_starts_and_stops_them(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cooper.cli", "serve", "policy", "--port", "0", "--ready-file", str(ready),
         f"policy.checkpoint_dir={tmp_path / 'ckpt'}", "policy.device=cpu", "policy.torch_threads=1",
         "policy.server.metrics_port=null", "policy.world_size=2"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the 2-rank policy service did not become ready in 180 s"
            time.sleep(0.2)
        info = json.loads(ready.read_text())
        assert info["world_size"] == 2
        ranks = _rank_processes(proc.pid)
        assert len(ranks) == 1, f"expected one spawned rank under the service, found {ranks}"
        with PolicyClient(f"127.0.0.1:{info['grpc_port']}") as client:
            rollout = client.generate(PROMPTS[:2], n=2, max_new_tokens=4).completions
            assert client.train("cli", 1, rollout, [0.0, 1.0, 1.0, 0.0], group_size=2, sampled_version=client.info().version).version == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for pid in ranks:  # the ranks were stopped with the service, not left behind
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_world_size_beyond_the_devices_is_a_clear_error() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with pytest.raises(RuntimeError, match=f"policy.world_size is {cores + 1} but only {cores} CPU cores"):
        resolve_world_size(cores + 1, torch.device("cpu"))
    assert resolve_world_size("auto", torch.device("cpu")) == 1
    assert resolve_world_size(1, torch.device("cpu")) == 1
    with pytest.raises(ValueError, match="names one GPU"):
        PolicyConfig(world_size=2, device="cuda:1")
    with pytest.raises(ValueError, match="at least 1"):
        PolicyConfig(world_size=0)


def test_split_batch_gives_every_rank_the_same_number_of_passes() -> None:
    samples = [RolloutSample([1], [2] * (i + 1)) for i in range(9)]
    parts = split_batch(samples, torch.arange(9, dtype=torch.float32), 2, micro_batch_size=2)
    assert [len(p.samples) for p in parts] == [5, 4]
    assert [s for p in parts for s in p.samples] == samples  # consecutive, nothing lost or repeated
    assert [a for p in parts for a in p.advantages] == list(range(9))
    assert {p.micro_batches for p in parts} == {3}
    few = split_batch(samples[:1], torch.zeros(1), 2, micro_batch_size=4)
    assert [len(p.samples) for p in few] == [1, 0] and {p.micro_batches for p in few} == {1}


@pytest.mark.gpu
def test_two_gpu_ranks_train_in_bf16_with_float32_weights(serve: Callable[..., Served], tmp_path: Path,
                                                          make_config: Callable[..., PolicyConfig]) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    served = serve(make_config(tmp_path, device="cuda", dtype="auto", world_size=2, grpo={"kl_coef": 0.001}))
    assert served.core.autocast == torch.bfloat16
    before = _weights(served.core)
    rollout = list(served.client.generate(PROMPTS, n=4, max_new_tokens=8).completions)
    served.client.train("gpu", 1, rollout, [float(i % 2) for i in range(len(rollout))], group_size=4, sampled_version=served.client.info().version)
    after = _weights(served.core)
    assert all(p.dtype == torch.float32 and p.is_cuda for p in after.values())
    assert all(not torch.equal(after[n], before[n]) for n in after)
