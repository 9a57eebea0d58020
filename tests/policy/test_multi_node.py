"""The policy service across two machines, on loopback: two torchrun processes (`--nnodes 2`, one rank each, gloo on
the CPU), each running `cooper serve policy` as a launcher starts it on a node (docs/multi-node.md). Node 0's rank
serves gRPC; node 1's follows its commands. A two-node update must equal the one-process update on the same global
batch (within TOLERANCE), and a node lost in the middle of an update must fail the call with UNAVAILABLE within the
group's timeout, stop node 0 (so that its launcher restarts the group), and, once both nodes are started again,
resume from the latest checkpoint plus the update journal: the run ends with exactly the weights of the same run
without the loss."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from cooper.config import ServerConfig, load_config
from cooper.runtime.checkpoint import latest_checkpoint, read_weights
from cooper.runtime.client import ServiceUnavailable
from cooper.services.policy.client import PolicyClient
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.messages import Completion
from cooper.services.policy.placement import Placement
from cooper.services.policy.trainer import RolloutSample

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [("p0", "Tom has 3 apples."), ("p1", "Ivy has 12 pens and gives away 2."), ("p2", "Add 4 and 5.")]
REWARDS = [[1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5, 1.0],
           [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]]
TOLERANCE = 1e-5
"""As for two ranks on one machine (test_policy_sharded.py): the same FSDP2 update, its sums reduced over gloo."""
OVERRIDES = ["policy.device=cpu", "policy.torch_threads=1", "policy.server.metrics_port=null",
             "policy.optim.lr=1e-3", "policy.optim.warmup_steps=0", "policy.optim.eps=1e-4",
             "policy.optim.micro_batch_size=2",
             "policy.grpo.kl_coef=0.01", "policy.distributed.timeout_s=20", "policy.save_every=2"]
"""The group's timeout is what bounds noticing a lost node; 20 s leaves a loaded 2-core machine room."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoNodes:
    """Two `torchrun --nnodes 2` processes on loopback, each in a process group of its own (a "node": killing it
    kills its agent and its rank together)."""

    def __init__(self, tmp: Path, checkpoint_dir: Path, name: str, extra: Sequence[str] = (), per_node: int = 1):
        self.tmp, self.name, self.per_node = tmp, name, per_node
        self.ready = tmp / f"{name}.ready.json"
        self.ready.unlink(missing_ok=True)
        self.port = free_port()
        self.command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(per_node),
            "--master-addr", "127.0.0.1", "--master-port", str(self.port), "--max-restarts", "0",
            "-m", "cooper.cli", "serve", "policy", "--port", "0", "--ready-file", str(self.ready),
            f"policy.checkpoint_dir={checkpoint_dir}", *OVERRIDES, *extra]
        self.logs = [open(tmp / f"{name}-node{n}.log", "a") for n in range(2)]  # noqa: SIM115  closed in stop()
        self.nodes = [self._start(n) for n in range(2)]

    def _start(self, node: int) -> subprocess.Popen[bytes]:
        command = [*self.command[:3], "--node-rank", str(node), *self.command[3:]]
        return subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                        "PYTHONUNBUFFERED": "1"},
                                stdout=self.logs[node], stderr=subprocess.STDOUT, start_new_session=True)

    def restart(self, node: int) -> None:
        """Start the node again, as a supervisor does (compose's restart policy restarts each container alone)."""
        if node == 0:
            self.ready.unlink(missing_ok=True)
        self.nodes[node] = self._start(node)

    def log(self, node: int, tail: int = 6000) -> str:
        if not self.logs[node].closed:
            self.logs[node].flush()
        return (self.tmp / f"{self.name}-node{node}.log").read_text()[-tail:]

    def client(self, timeout_s: float = 240) -> PolicyClient:
        deadline = time.monotonic() + timeout_s
        while not self.ready.exists():
            for n, node in enumerate(self.nodes):
                assert node.poll() is None, f"node {n} exited with {node.returncode}:\n{self.log(n)}"
            assert time.monotonic() < deadline, f"the two-node policy did not become ready:\n{self.log(0)}"
            time.sleep(0.2)
        info = json.loads(self.ready.read_text())
        assert info["world_size"] == 2 * self.per_node
        # No retries: a lost node must show as UNAVAILABLE on the very call it was lost in.
        return PolicyClient(f"127.0.0.1:{info['grpc_port']}", ServerConfig(unavailable_timeout_s=0))

    def last_command(self) -> int:
        """The number of the command node 0's rank last gave the others (it keeps only that one's key in the
        launcher's store, cooper/services/policy/ranks/control.py)."""
        store = self._store()
        present = [n for n in range(1, 200) if store.check([f"cooper/policy/0/cmd/{n}"])]
        assert present, "node 0 sent no command"
        return present[-1]

    def wait_for_command(self, number: int, timeout_s: float = 60) -> None:
        """Return as soon as node 0 has given the others command `number`."""
        store, key = self._store(), f"cooper/policy/0/cmd/{number}"
        deadline = time.monotonic() + timeout_s
        while not store.check([key]):
            assert time.monotonic() < deadline, f"node 0 did not send command {number}"

    def _store(self) -> torch.distributed.TCPStore:
        return torch.distributed.TCPStore("127.0.0.1", self.port, 2, is_master=False, timeout=timedelta(seconds=10))

    def kill(self, node: int) -> None:
        """SIGKILL the node's launcher and every process under it (torchrun puts its ranks in sessions of their own)."""
        agent = psutil.Process(self.nodes[node].pid)
        for process in [*agent.children(recursive=True), agent]:
            process.send_signal(signal.SIGKILL)
        self.nodes[node].wait()

    def stop(self) -> list[int | None]:
        for node in self.nodes:
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)  # torchrun passes it on to its ranks
        codes = []
        for node in self.nodes:
            try:
                codes.append(node.wait(60))
            except subprocess.TimeoutExpired:
                self.kill(self.nodes.index(node))
                codes.append(node.returncode)
        for log in self.logs:
            log.close()
        return codes


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[Callable[..., TwoNodes]]:
    started: list[TwoNodes] = []

    def start(checkpoint_dir: Path, name: str, extra: Sequence[str] = (), per_node: int = 1) -> TwoNodes:
        started.append(TwoNodes(tmp_path, checkpoint_dir, name, extra, per_node))
        return started[-1]

    yield start
    for group in started:
        group.stop()


def rollout_of(client: PolicyClient) -> list[Completion]:
    return client.generate(PROMPTS, n=3, max_new_tokens=6, seed=7).completions


def saved_weights(client: PolicyClient, checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    client.save("compare")
    checkpoint = latest_checkpoint(checkpoint_dir)
    assert checkpoint is not None
    return read_weights(checkpoint)


def test_the_launcher_environment_names_the_place_of_each_rank() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "policy-0",
           "MASTER_PORT": "29400", "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
    place = Placement.from_env(env)
    assert place == Placement(3, 4, 1, 2, "policy-0", 29400, True, 2) and place.nodes == 2
    assert Placement.from_env({**env, "WORLD_SIZE": "1"}) is None and Placement.from_env({}) is None
    assert Placement.from_env(place.env()) == place  # what the service gives the ranks it starts itself
    with pytest.raises(RuntimeError, match="MASTER_ADDR and MASTER_PORT not: start the policy service with torchrun"):
        Placement.from_env({"RANK": "0", "WORLD_SIZE": "2"})


def test_a_rank_stuck_joining_its_group_exits_for_its_launcher() -> None:
    """`exit_if_stuck` (what bounds a follower's join: a stale store's addresses leave gloo's connect waiting on a
    dead peer, in C++) ends the process with code 1 once the limit passes, and does nothing to a block that ends."""
    script = ("import time, sys\nfrom cooper.services.policy.ranks.control import exit_if_stuck\n"
              "with exit_if_stuck(0.5, 'a quick block'):\n    pass\ntime.sleep(1.0)\n"
              "with exit_if_stuck(0.5, 'a stuck join'):\n    time.sleep(30)\nsys.exit(0)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert "a stuck join did not end within 0.5 s" in done.stderr and "a quick block" not in done.stderr
    assert took < 25, f"the stuck block was left to run ({took:.0f} s)"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("per_node", [1, 2], ids=["fsdp-2-nodes", "hybrid-2x2"])
def test_two_nodes_update_like_one_process(tmp_path: Path, groups: Callable[..., TwoNodes], per_node: int) -> None:
    """One rank per node shards over both nodes; two per node is hybrid sharding (shard within a node, replicate
    across the two): either way the update is the one-process update on the same global batch."""
    group = groups(tmp_path / "two", "parity", per_node=per_node)
    # The config `cooper serve policy` builds on each node (the defaults and the overrides), in this process.
    one = PolicyCore(load_config(None, [*OVERRIDES, f"policy.checkpoint_dir={tmp_path / 'one'}"]).policy)
    with group.client() as client:
        rollout = rollout_of(client)
        samples = [RolloutSample(c.prompt_token_ids, c.token_ids, c.logprobs) for c in rollout]
        before = {n: p.detach().clone() for n, p in one.model.named_parameters()}
        for step in (1, 2):
            remote = client.train("run", step, rollout, REWARDS[step - 1], group_size=3, sampled_version=client.info().version)
            local = one.train(f"run/{step}", samples, REWARDS[step - 1], 3)
            assert remote.version == local.version == step
            for key in local.metrics:
                assert remote.metrics[key] == pytest.approx(local.metrics[key], rel=1e-4, abs=1e-6), key
        two = saved_weights(client, tmp_path / "two")
    mine = {n: p.detach() for n, p in one.model.named_parameters()}
    assert max(float((two[n] - mine[n]).abs().max()) for n in mine) < TOLERANCE
    # The update is far larger than the tolerance, in every tensor, so the comparison is not vacuous.
    assert min(float((mine[n] - before[n]).abs().max()) for n in mine) > 10 * TOLERANCE
    assert ("hybrid" in group.log(0, tail=10**6)) == (per_node > 1)
    group.stop()  # SIGTERM to both launchers, as a supervisor stops them: node 0's rank drains first
    assert "policy stopped" in group.log(0, tail=10**6)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_node_lost_mid_update_is_a_restart_with_nothing_lost(tmp_path: Path,
                                                                groups: Callable[..., TwoNodes]) -> None:
    calm_dir, lost_dir = tmp_path / "calm", tmp_path / "lost"
    calm = groups(calm_dir, "calm")
    with calm.client() as client:
        rollout = rollout_of(client)
        for step in range(1, 5):
            client.train("run", step, rollout, REWARDS[step - 1], group_size=3, sampled_version=client.info().version)
        expected = saved_weights(client, calm_dir)
    calm.stop()

    group = groups(lost_dir, "lost")
    with group.client() as client:
        for step in (1, 2, 3):  # a checkpoint at 2 (save_every 2), then one journaled update
            client.train("run", step, rollout, REWARDS[step - 1], group_size=3, sampled_version=client.info().version)
        failed: list[BaseException] = []
        answered: list[Any] = []

        def train_step_4() -> None:
            try:
                answered.append(client.train("run", 4, rollout, REWARDS[3], group_size=3, sampled_version=client.info().version))
            except BaseException as err:  # noqa: BLE001  what the call raised is the test's subject
                failed.append(err)

        update = group.last_command() + 1
        call = threading.Thread(target=train_step_4)
        started = time.monotonic()
        call.start()
        group.wait_for_command(update)  # the update is under way: node 0 has told node 1 to run it
        group.kill(1)  # node 1 is lost: its launcher and its rank
        call.join(120)
        took = time.monotonic() - started
    # The call fails UNAVAILABLE (tried once), well within the group's timeout: node 1's connections closed.
    assert not answered and isinstance(failed[0], ServiceUnavailable), (answered, failed)
    assert took < 20, f"the lost node was noticed after {took:.0f} s"
    # Node 0's service stopped itself, so that its launcher (here: the test) starts the group again.
    assert group.nodes[0].wait(60) != 0, group.log(0)
    print(f"\nnode 1 lost mid-update: UNAVAILABLE after {took:.1f} s")
    group.stop()

    again = groups(lost_dir, "again")  # the launcher starts every node again, on the same checkpoint directory
    with again.client() as client:
        assert client.info().version == 3  # the checkpoint of 2 plus the journaled update 3
        retry = client.train("run", 4, rollout, REWARDS[3], group_size=3, sampled_version=client.info().version)
        assert retry.version == 4 and not retry.replayed
        assert client.info().version == 4
        resumed = saved_weights(client, lost_dir)
    assert resumed.keys() == expected.keys()
    assert all(torch.equal(resumed[n], expected[n]) for n in expected), "the resumed run's weights differ"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_losing_the_node_of_rank_0_ends_the_other_node_too(tmp_path: Path, groups: Callable[..., TwoNodes]) -> None:
    group = groups(tmp_path / "ckpt", "head")
    with group.client() as client:
        assert client.info().version == 0
    started = time.monotonic()
    group.kill(0)  # the node that serves, and hosts the launcher's store
    # Node 1's rank finds the store gone and exits non-zero; so does its launcher, for its supervisor to restart.
    assert group.nodes[1].wait(60) != 0, group.log(1)
    assert time.monotonic() - started < 30
    assert "failed" in group.log(1)


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_two_nodes_beside_vllm(tmp_path: Path, groups: Callable[..., TwoNodes]) -> None:
    """vLLM on node 0, beside the group (its engine core in a process of its own, which must not take the launcher's
    RANK and WORLD_SIZE for its own world), fed the gathered weights after every update: the log-probs it reports
    for the next rollout are the trainer's under the new weights (as in test_vllm.py, within 1e-4)."""
    group = groups(tmp_path / "ckpt", "vllm", ["policy.model=tiny-hd32", "policy.engine=vllm",
                                               "policy.vllm_gpu_memory_utilization=0.1", "policy.grpo.kl_coef=0"])
    with group.client(timeout_s=600) as client:
        assert client.info().engine == "vllm"
        for step in (1, 2):
            rollout = client.generate(PROMPTS[:2], n=4, max_new_tokens=12, seed=step).completions
            rewards = [float(len(c.token_ids) % 2) for c in rollout]
            rewards[0], rewards[4] = 1.0 - rewards[1], 1.0 - rewards[5]
            reply = client.train("vllm", step, rollout, rewards, group_size=4, sampled_version=client.info().version)
            assert reply.version == step
            # Step 2's rollout was sampled after update 1: had the engine kept the old weights, the trainer's pi_old
            # would be far from the log-probs vLLM reported.
            assert reply.metrics["rollout/logprob_abs_diff"] < 1e-4, dict(reply.metrics)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_nodes_restarted_one_by_one_meet_again(tmp_path: Path, groups: Callable[..., TwoNodes]) -> None:
    """What compose's restart policy does: the lost node 1 comes back at once, while node 0 and its store are still
    up (the new node 1 meets the old store); node 0 then notices the loss, exits and comes back too. Every process
    that met a store that is gone ends within the group's timeout, and so does a rank whose launcher met the old store
    but which itself met the new one (no spec comes there), so both nodes meet again, with nothing lost."""
    group = groups(tmp_path / "ckpt", "one-by-one")
    with group.client() as client:
        rollout = rollout_of(client)
        client.train("run", 1, rollout, REWARDS[0], group_size=3, sampled_version=client.info().version)
    group.kill(1)
    group.restart(1)  # before node 0 has seen anything: it is idle between calls
    with group.client() as client:
        with pytest.raises(ServiceUnavailable):  # node 0 finds node 1 gone on the next update
            client.train("run", 2, rollout, REWARDS[1], group_size=3, sampled_version=client.info().version)
    assert group.nodes[0].wait(60) != 0
    started, restarts = time.monotonic(), 1
    group.restart(0)
    while not group.ready.exists():  # the supervisor: a node that exits non-zero is started again
        assert time.monotonic() - started < 180, f"the nodes did not meet again:\n{group.log(0)}\n{group.log(1)}"
        for node, process in enumerate(group.nodes):
            if process.poll() is not None:
                assert process.returncode != 0
                group.restart(node)
                restarts += 1
        time.sleep(0.2)
    with group.client() as client:
        assert client.info().version == 1
        assert client.train("run", 2, rollout, REWARDS[1], group_size=3, sampled_version=client.info().version).version == 2
    print(f"\nnodes restarted one by one: serving again {time.monotonic() - started:.0f} s after node 0 exited "
          f"({restarts} restarts)")
