"""The policy service's training ranks, on one machine or several: rank 0 serves gRPC and drives, every other rank
follows its commands. One mechanism for both:

- several machines: `torchrun ... -m cooper.cli serve policy` on every node (docs/multi-node.md). torchrun gives
  each process RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (`Placement`); global
  rank 0 serves, every other process runs `follow`;
- one machine (`policy.world_size: N`, no launcher): the service is rank 0 and starts ranks 1..N-1 itself
  (`LocalRanks`), each given the environment torchrun would give it and running the same `follow`.

Control: rank 0 names each command in the TCPStore at MASTER_ADDR:MASTER_PORT (`cmd/<n>`); every other rank waits
for it there, then receives its own arguments from rank 0 over a gloo group (a rollout share can exceed the store's
8 MB values), runs the command (its collectives pair up with the other ranks' because every rank runs the same
commands in the same order) and answers in the store (`ack/<n>/<rank>`). Idle ranks wait on the store, not in a
collective, so no process-group timeout fires between calls however long a rollout takes; a store that stops
answering (its host, node 0, gone) ends the rank.

Failure: the collectives run under `policy.distributed.timeout_s`. A rank that dies closes its connections, so its
peers' collectives fail at once; a node that vanishes is noticed when the timeout runs out; a rank that raises reports
its error and exits, so that no peer waits for it. Rank 0 then raises `RankFailure` naming the rank. On one machine
PolicyCore kills the group and starts a new one from the latest checkpoint plus the update journal; across machines
it cannot start processes on other nodes, so the call answers UNAVAILABLE, the service exits non-zero, and the
launcher (torchrun --max-restarts, compose's restart policy, JobSet's failurePolicy) starts the whole group again,
which resumes the same way.

Placement of the shards: one node, or one rank per node, is plain FSDP2 over all ranks; several nodes with several
ranks each is hybrid sharding (a 2-D mesh: shard within a node, replicate across nodes), so the all-gathers of
every forward stay on the node's fast links.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from cooper.config import PolicyConfig
from cooper.runtime.checkpoint import OPTIMIZER_FILE
from cooper.runtime.devices import rank_device, resolve_autocast
from cooper.runtime.models import load_causal_lm, resolve_model
from cooper.services.policy.errors import RankFailure
from cooper.services.policy.models import load_reference
from cooper.services.policy.placement import Placement
from cooper.services.policy.sharded import RankTrainer, shard_model, split_batch
from cooper.services.policy.trainer import PolicyUpdater, RolloutSample

COMMANDS: dict[str, Callable[..., Any]] = {command.__name__: command for command in (
    RankTrainer.update, RankTrainer.full_optimizer_state)}
"""What rank 0 can ask every rank to run, by the name that travels in the store (`cmd/<n>`); "stop" ends a rank."""

log = logging.getLogger("cooper.policy")

POLL_S = 0.02
"""The longest pause between two looks at the store while a rank waits for a key (the first ones come sooner)."""
JOIN_MARGIN_S = 10.0
"""A follower launched on a node exits when rank 0's spec has not come, or it has not joined its process group, this
long after the group's timeout (`follow`), for its launcher to start it again."""


@dataclass(frozen=True)
class RankSpec:
    """What every rank needs to build its shard: rank 0 publishes it in the store, so that every rank loads the same
    checkpoint (the checkpoint directory is shared: one volume, on every node)."""

    cfg: PolicyConfig
    world_size: int
    weights_path: str  # the latest checkpoint, or the initial model
    initial_path: str  # the frozen reference
    checkpoint: str | None  # where the optimizer state comes from; None = fresh
    pad_id: int


class Control:
    """The command channel over the group's TCPStore (see the module docstring); keys under one prefix per group."""

    def __init__(self, place: Placement, timeout_s: float, host: bool):
        """`timeout_s` bounds connecting to the store (a rank started before the store's host waits that long)."""
        self.place = place
        self.store = dist.TCPStore(place.master_addr, place.master_port, place.world_size, is_master=host,
                                   wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
        self.prefix = f"cooper/policy/{place.generation}/"

    def set(self, key: str, value: Any) -> None:
        self.store.set(self.prefix + key, pickle.dumps(value))

    def get(self, key: str) -> Any:
        return pickle.loads(self.store.get(self.prefix + key))

    def wait(self, keys: Sequence[str], seconds: float) -> bool:
        """True once every key is set; False after `seconds`. A store that cannot be reached raises. Polled with
        `check`, not the store's own timed wait, which logs a warning at every timeout."""
        deadline = time.monotonic() + seconds
        pause = 0.001
        while not self.store.check([self.prefix + k for k in keys]):
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(POLL_S, pause * 2)
        return True

    def wait_idle(self, key: str) -> None:
        """Wait for `key` as long as it takes (an idle rank between commands)."""
        while not self.wait([key], 3600):
            pass

    def delete(self, key: str) -> None:
        self.store.delete_key(self.prefix + key)

    def process_group_store(self) -> dist.Store:
        return dist.PrefixStore(self.prefix + "pg/", self.store)


def load_models(spec: RankSpec, device: torch.device) -> tuple[Any, Any | None]:
    """The policy and its reference on the CPU, to be sharded onto `device` (`join_group`)."""
    cpu = torch.device("cpu")
    model = load_causal_lm(spec.weights_path, torch.float32, cpu)
    return model, load_reference(spec.cfg, spec.initial_path, resolve_autocast(spec.cfg.dtype, device), cpu)


def device_mesh(place: Placement, device: torch.device) -> DeviceMesh:
    """FSDP2 over every rank, or, with several nodes of several ranks, hybrid sharding: replicate across nodes
    (dim 0), shard within a node (dim 1)."""
    if place.nodes > 1 and place.local_world_size > 1:
        return init_device_mesh(device.type, (place.nodes, place.local_world_size),
                                mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device.type, (place.world_size,))


@contextmanager
def exit_if_stuck(seconds: float | None, what: str) -> Iterator[None]:
    """Exit the process (code 1, for its launcher to start it again) if the block has not ended after `seconds`:
    for waits inside C++ that nothing in Python can interrupt. None: no limit."""
    done = threading.Event()
    if seconds is not None:
        def watch() -> None:
            if not done.wait(seconds):
                log.error("%s did not end within %g s; exiting so that the launcher starts this rank again",
                          what, seconds)
                logging.shutdown()
                os._exit(1)
        threading.Thread(target=watch, name="exit-if-stuck", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def join_group(spec: RankSpec, place: Placement, control: Control, device: torch.device,
               models: tuple[Any, Any | None], join_limit_s: float | None = None) -> tuple[RankTrainer, Any]:
    """Join the process group (and the gloo group that carries commands' arguments), shard the models onto this
    rank's device, load the optimizer shard. Returns the trainer and the argument group. `join_limit_s`: exit the
    process if joining takes longer (`exit_if_stuck`)."""
    cfg = spec.cfg
    if device.type == "cuda":  # per thread: rank 0 joins on its own rank thread
        torch.cuda.set_device(device)
    backend = cfg.distributed.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=cfg.distributed.timeout_s)
    with exit_if_stuck(join_limit_s, f"policy rank {place.rank}: joining the process group"):
        dist.init_process_group(backend, store=control.process_group_store(), rank=place.rank,
                                world_size=place.world_size, timeout=timeout)
        arguments = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    mesh = device_mesh(place, device)
    autocast = resolve_autocast(cfg.dtype, device)
    # On CUDA the forward runs in bf16 through FSDP's mixed precision (params cast once per all-gather) instead of
    # autocast; the sharded weights, gradients' reduction (by default) and AdamW state stay float32.
    mp_policy = None
    if autocast is not None:
        reduce = torch.float32 if cfg.distributed.reduce_dtype == "float32" else torch.bfloat16
        mp_policy = MixedPrecisionPolicy(param_dtype=autocast, reduce_dtype=reduce)
    model, reference = models
    model = shard_model(model.to(device), mp_policy, mesh)
    if reference is not None:
        reference = shard_model(reference.to(device), None, mesh)
    # autocast_dtype None: FSDP's mixed precision above is what runs the forward in bf16.
    trainer = RankTrainer.from_config(model, reference, cfg, spec.pad_id, None)
    if spec.checkpoint:
        # mmap: each rank touches only the pages of its own shards, not the whole file.
        saved = torch.load(os.path.join(spec.checkpoint, OPTIMIZER_FILE), map_location="cpu", weights_only=True,
                           mmap=True)
        trainer.load_full_optimizer_state(saved)
    return trainer, arguments


def follow(place: Placement, group_timeout_s: float | None) -> int:
    """A rank other than 0: build its shard from the spec rank 0 publishes, then run rank 0's commands until told to
    stop. Returns the exit code (a rank that fails exits at once: see the module docstring). `group_timeout_s` (the
    config's policy.distributed.timeout_s, which the spec brings too): exit if rank 0 has published no spec this long
    plus JOIN_MARGIN_S after this rank met the store (None: wait as long as it takes)."""
    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s %(levelname)s policy rank {place.rank}: %(message)s")
    control: Control | None = None
    joined = False  # whether this rank read the spec of the group whose store it met: only then may it report there
    try:
        control = Control(place, timeout_s=600, host=False)
        # Rank 0 publishes the spec once it has loaded its own copy of the model. A node started while node 0 was
        # going away can have its launcher meet node 0's old store and this rank meet the new node 0's, at the same
        # address: that store's rank 0 never comes (its launcher waits for this node's), so this rank exits instead,
        # and its launcher, started again, meets the new store.
        spec_limit_s = None if group_timeout_s is None else group_timeout_s + JOIN_MARGIN_S
        if spec_limit_s is None:
            control.wait_idle("spec")
        elif not control.wait(["spec"], spec_limit_s):
            raise TimeoutError(f"rank 0 published no spec within {spec_limit_s:g} s: the store at "
                               f"{place.master_addr}:{place.master_port} may belong to a group this node's launcher "
                               "did not join")
        spec: RankSpec = control.get("spec")
        joined = True
        # From here a store that stops answering (node 0 gone, its connection left half-open) ends this rank within
        # the group's timeout, as a lost peer does in a collective, not after the start-up wait above.
        control.store.set_timeout(timedelta(seconds=spec.cfg.distributed.timeout_s))
        if spec.cfg.torch_threads:
            torch.set_num_threads(spec.cfg.torch_threads)
        device = rank_device(spec.cfg.device, place.local_rank, "policy.device")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        resolve_model(spec.cfg.model, "causal")  # a model built on the spot (tiny) is built on this node too
        models = load_models(spec, device)
        control.set(f"ack/loaded/{place.rank}", ("ok", None))
        # A node started while node 0 was going away can meet node 0's old store, read the old group's addresses
        # and wait in gloo's connect far longer than the group's timeout (95 s seen, on a 20 s timeout), while the
        # new node 0 waits for it: it exits instead, and its launcher starts it on the new store.
        trainer, arguments = join_group(spec, place, control, device, models,
                                        join_limit_s=spec.cfg.distributed.timeout_s + JOIN_MARGIN_S)
        control.set(f"ack/ready/{place.rank}", ("ok", None))
        for seq in range(1, 2**62):
            control.wait_idle(f"cmd/{seq}")
            command = control.get(f"cmd/{seq}")
            if command == "stop":
                break
            received: list[Any] = [None]
            dist.scatter_object_list(received, None, src=0, group=arguments)
            COMMANDS[command](trainer, *received[0])
            control.set(f"ack/{seq}/{place.rank}", ("ok", None))
        dist.destroy_process_group()
        return 0
    except Exception as err:  # report, then exit at once so that no peer waits for this rank in a collective
        log.exception("failed")
        if control is not None and joined:  # an error key in another group's store would fail that group's start
            try:
                control.set(f"error/{place.rank}", f"{type(err).__name__}: {err}")
            except Exception:  # noqa: BLE001  the store may be what failed
                pass
        logging.shutdown()
        os._exit(1)


def _local_rank_main(place: Placement) -> None:
    """Entry point of a rank that the service started itself: the environment a launcher would set, then `follow`."""
    from cooper.runtime.processes import die_with_parent

    die_with_parent(signal.SIGKILL)
    os.environ.update(place.env())
    os._exit(follow(place, group_timeout_s=None))  # the store is the service's own: no other group can be behind it


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class LocalRanks:
    """Ranks 1..N-1 of a one-machine group, started by the service (what torchrun does for its local ranks)."""

    def __init__(self, place: Placement):
        context = mp.get_context("spawn")
        self.processes: dict[int, mp.process.BaseProcess] = {}
        """The started ranks' processes, by rank."""
        for rank in range(1, place.world_size):
            process = context.Process(target=_local_rank_main, args=(place.as_rank(rank),),
                                      name=f"cooper-policy-rank{rank}", daemon=True)
            process.start()
            self.processes[rank] = process

    def dead(self, wait_s: float = 0.0) -> dict[int, str]:
        """The ranks that have exited (waiting up to `wait_s` for one to), with how."""
        wait([p.sentinel for p in self.processes.values()], wait_s)
        found = {}
        for rank, process in self.processes.items():
            if not process.is_alive():
                process.join(5)
                found[rank] = _describe_exit(process.exitcode)
        return found

    def join(self, seconds: float) -> None:
        for process in self.processes.values():
            process.join(seconds)
            if process.is_alive():
                process.kill()
                process.join(10)

    def kill(self) -> None:
        for process in self.processes.values():
            if process.is_alive():
                process.kill()
        for process in self.processes.values():
            process.join(10)


class RankGroup(PolicyUpdater):
    """Rank 0's side: starts the other ranks (one machine) or meets them (launched), drives them, and trains the
    policy with them (`train_step`, the same as one rank's: the advantages are computed once, over the whole rollout,
    then each rank gets its share).

    `rollout_model` is rank 0's unsharded copy of the weights (the engine samples from it and checkpoints save it);
    after every update each weight is gathered into it.
    """

    def __init__(self, spec: RankSpec, rollout_model: Any, place: Placement | None = None):
        self.spec = spec
        self.cfg = spec.cfg
        grpo = spec.cfg.grpo
        self.adv_eps, self.epochs, self.rollout_is_cap = grpo.adv_eps, grpo.epochs, grpo.rollout_is_cap
        self.world_size = spec.world_size
        self.rollout_model = rollout_model
        self.timeout_s = spec.cfg.distributed.timeout_s
        self.closed = False
        self.seq = 0
        self.local: LocalRanks | None = None
        # Rank 0's share of every command runs on this one thread, never on the callers' (gRPC worker) threads:
        # DTensor keeps a per-thread cache that holds the process group, and a thread that outlives the group
        # would carry it into any child forked later, where freeing it deadlocks (gloo's threads are not there).
        # This thread ends in close()/kill(), after the group, so the cache goes with it.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-rank0")
        try:
            if place is None:  # one machine: this process hosts the store (on a free port) and starts the others
                alone = Placement(0, spec.world_size, 0, spec.world_size, "127.0.0.1", 0, launcher_hosts_store=True)
                self.control = Control(alone, self.timeout_s, host=True)
                place = self.control.place = replace(alone, master_port=self.control.store.port)
                self.local = LocalRanks(place)
            else:
                self.control = Control(place, self.timeout_s, host=not place.launcher_hosts_store)
            self.place = place
            self.control.set("spec", spec)
            device = rank_device(self.cfg.device, place.local_rank, "policy.device")
            models = load_models(spec, device)
            self._collect("loaded", "start")  # a rank that fails to load fails the start here, before any collective
            self.trainer, self.arguments = self._on_rank0(join_group, spec, place, self.control, device, models)
            self._collect("ready", "start")
        except BaseException:
            self.kill()
            raise
        log.info("policy: %d ranks ready on %d node(s) (FSDP2%s, %s)", self.world_size, place.nodes,
                 ", hybrid" if place.nodes > 1 and place.local_world_size > 1 else "", dist.get_backend())

    # --- driving --------------------------------------------------------------------------------------------

    def _on_rank0(self, fn: Any, *args: Any) -> Any:
        return self._thread.submit(fn, *args).result()

    def _lost(self, command: str, wait_s: float) -> RankFailure | None:
        """The rank that failed, if one did within `wait_s`: one that reported its error, or (on one machine) one
        that exited."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank in range(1, self.world_size):
                if self.control.wait([f"error/{rank}"], 0.0):
                    return RankFailure(f"policy rank {rank} of {self.world_size} failed during {command}: "
                                       f"{self.control.get(f'error/{rank}')}")
            dead = self.local.dead() if self.local else {}
            if dead:
                rank, how = sorted(dead.items())[0]
                return RankFailure(f"policy rank {rank} of {self.world_size} {how} during {command}")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _collect(self, phase: str | int, command: str) -> None:
        """Wait for every other rank's answer to `phase` (a start phase or a command's number), within the group's
        timeout; a rank that fails, exits or does not answer is a RankFailure."""
        keys = [f"ack/{phase}/{rank}" for rank in range(1, self.world_size)]
        deadline = time.monotonic() + self.timeout_s
        while not self.control.wait(keys, 0.1):
            failure = self._lost(command, 0.0)
            if failure is not None:
                raise failure
            if time.monotonic() > deadline:
                missing = [k.rsplit("/", 1)[1] for k in keys if not self.control.wait([k], 0.0)]
                raise RankFailure(f"policy ranks {', '.join(missing)} of {self.world_size} did not answer {command} "
                                  f"within policy.distributed.timeout_s ({self.timeout_s:g} s)")
        if isinstance(phase, int):
            for key in keys:
                self.control.delete(key)

    def run(self, method: Callable[..., Any], per_rank: Sequence[tuple[Any, ...]], rank0_extra: tuple[Any, ...] = ()
            ) -> Any:
        """Run `method` (one of COMMANDS, a RankTrainer method) on every rank (rank r with `per_rank[r]`, sent over the
        argument group; rank 0 with `rank0_extra` after them, which stays in this process); rank 0's result."""
        command = method.__name__
        if COMMANDS.get(command) is not method:
            raise ValueError(f"{command} is not a rank command (ranks.COMMANDS)")
        if self.closed:
            raise RankFailure("the policy ranks were stopped after a failure")
        failure = self._lost(command, 0.0)
        if failure is not None:
            raise failure
        self.seq += 1
        try:
            self.control.set(f"cmd/{self.seq}", command)
            if self.seq > 1:
                self.control.delete(f"cmd/{self.seq - 1}")
            result = self._on_rank0(self._rank0_share, method, per_rank, rank0_extra)
        except Exception as err:
            # A collective fails on rank 0 when a peer went away: name that rank rather than the transport error.
            failure = self._lost(command, 5.0)
            if failure is not None:
                raise failure from err
            raise RankFailure(f"policy rank 0 of {self.world_size} failed during {command}: "
                              f"{type(err).__name__}: {err}") from err
        self._collect(self.seq, command)
        return result

    def _rank0_share(self, method: Callable[..., Any], per_rank: Sequence[tuple[Any, ...]],
                     rank0_extra: tuple[Any, ...]) -> Any:
        received: list[Any] = [None]
        dist.scatter_object_list(received, list(per_rank), src=0, group=self.arguments)
        return method(self.trainer, *received[0], *rank0_extra)

    # --- the trainer interface PolicyCore uses ------------------------------------------------------------

    def apply_update(self, samples: Sequence[RolloutSample], advantages: torch.Tensor) -> dict[str, float]:
        """One update across the ranks, each on its share, then the new weights gathered into the rollout model."""
        parts = split_batch(samples, advantages, self.world_size, self.cfg.optim.micro_batch_size)
        return self.run(RankTrainer.update, [(part,) for part in parts], rank0_extra=(self.rollout_model,))

    def optimizer_state(self) -> dict[str, Any]:
        return self.run(RankTrainer.full_optimizer_state, [()] * self.world_size)

    @property
    def updates(self) -> int:
        return self.trainer.updates

    # --- stopping -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every rank cleanly (between commands)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.seq += 1
            self.control.set(f"cmd/{self.seq}", "stop")
        except Exception:  # noqa: BLE001  a store that is gone: the other ranks end on their own
            log.debug("telling the ranks to stop", exc_info=True)
        if self.local is not None:
            self.local.join(30)
        dist.destroy_process_group()
        self._thread.shutdown(wait=True)

    def kill(self) -> None:
        """After a failure: kill the other ranks this service started at once and drop the group (it cannot be used
        again). Ranks on other nodes end when their launcher sees this process exit."""
        self.closed = True
        if self.local is not None:
            self.local.kill()
        if dist.is_initialized():
            # The group is broken (a member is gone); tearing it down may report that again, which says nothing new.
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                log.debug("destroying the broken process group", exc_info=True)
        self._thread.shutdown(wait=True)
