"""The policy service's training ranks: rank 0 is the service process, ranks 1..N-1 are processes it spawns.

Launch: `RankGroup` opens a TCPStore on a free loopback port, spawns the other ranks (multiprocessing, spawn),
and all N join one process group (NCCL on CUDA, gloo on the CPU) through it. Each rank loads the model, shards it
with FSDP2 (`sharded.shard_model`) and loads its shard of the optimizer state from the checkpoint it was given.
The service's command line does not change (`cooper serve policy`), so compose and Kubernetes only set
`policy.world_size` and the GPU count. Multi-node would need torchrun and a control channel over the network;
see docs/operations.md, "Several GPUs".

Driving: rank 0 sends each command down a pipe to every other rank, runs the same command itself, then waits for
each rank's acknowledgement. Commands are method names of `RankTrainer`; the collectives inside pair up because
every rank runs the same method in the same order. Idle ranks block on their pipe, not in a collective, so no
process-group timeout fires between calls, however long a rollout takes.

Failure: a rank that dies is noticed at once (its process sentinel; gloo peers also see the closed connection),
a rank that raises reports its error and exits (so that no peer waits for it in a collective), and rank 0 raises
`RankFailure` naming the rank. The group cannot continue without the lost shard: `PolicyCore` then kills the
remaining ranks and starts a new group from the latest checkpoint.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from cooper.config import PolicyConfig
from cooper.runtime.checkpoint import OPTIMIZER_FILE
from cooper.runtime.devices import rank_device, resolve_autocast
from cooper.runtime.models import load_causal_lm
from cooper.services.policy.errors import RankFailure
from cooper.services.policy.models import load_reference
from cooper.services.policy.sharded import RankTrainer, shard_model, split_batch
from cooper.services.policy.trainer import PolicyUpdater, RolloutSample

log = logging.getLogger("cooper.policy")


@dataclass(frozen=True)
class RankSpec:
    """What every rank needs to build its shard; picklable, sent to the spawned ranks."""

    cfg: PolicyConfig
    world_size: int
    weights_path: str  # the latest checkpoint, or the initial model
    initial_path: str  # the frozen reference
    checkpoint: str | None  # where the optimizer state comes from; None = fresh
    pad_id: int
    store_port: int = 0


def load_models(spec: RankSpec, device: torch.device) -> tuple[Any, Any | None]:
    """The policy and its reference on the CPU, to be sharded onto `device` (`join_group`)."""
    cpu = torch.device("cpu")
    model = load_causal_lm(spec.weights_path, torch.float32, cpu)
    return model, load_reference(spec.cfg, spec.initial_path, resolve_autocast(spec.cfg.dtype, device), cpu)


def join_group(spec: RankSpec, rank: int, store: dist.TCPStore, device: torch.device, models: tuple[Any, Any | None]
          ) -> RankTrainer:
    """Join the process group, shard the models onto this rank's device, load the optimizer shard."""
    cfg = spec.cfg
    if device.type == "cuda":  # per thread: rank 0 joins on its own rank thread
        torch.cuda.set_device(device)
    backend = cfg.distributed.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=spec.world_size,
                            timeout=timedelta(seconds=cfg.distributed.timeout_s))
    mesh = init_device_mesh(device.type, (spec.world_size,))
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
    return trainer


def rank_main(spec: RankSpec, rank: int, conn: Connection) -> None:
    """Entry point of ranks 1..N-1: build the shard, then run rank 0's commands until told to stop."""
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s %(levelname)s policy rank {rank}: %(message)s")
    try:
        if spec.cfg.torch_threads:
            torch.set_num_threads(spec.cfg.torch_threads)
        device = rank_device(spec.cfg.device, rank, "policy.device")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        models = load_models(spec, device)
        conn.send(("loaded", None))
        store = dist.TCPStore("127.0.0.1", spec.store_port, spec.world_size, is_master=False,
                              timeout=timedelta(seconds=spec.cfg.distributed.timeout_s))
        trainer = join_group(spec, rank, store, device, models)
        conn.send(("ready", None))
        while True:
            try:
                command, args = conn.recv()
            except EOFError:  # rank 0 is gone; so is the group
                os._exit(0)
            if command == "stop":
                break
            getattr(trainer, command)(*args)
            conn.send(("ok", None))
        dist.destroy_process_group()
    except Exception as err:  # report, then exit at once so that no peer waits for this rank in a collective
        log.exception("failed")
        try:
            conn.send(("error", f"{type(err).__name__}: {err}"))
        except OSError:
            pass
        os._exit(1)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class RankGroup(PolicyUpdater):
    """Rank 0's side: starts the ranks, drives them, and trains the policy with them (`train_step`, the same as
    one rank's: the advantages are computed once, over the whole rollout, then each rank gets its share).

    `rollout_model` is rank 0's unsharded copy of the weights (the engine samples from it and checkpoints save
    it); after every update each weight is gathered into it.
    """

    def __init__(self, spec: RankSpec, rollout_model: Any):
        self.spec = spec
        self.cfg = spec.cfg
        grpo = spec.cfg.grpo
        self.adv_eps, self.epochs, self.rollout_is_cap = grpo.adv_eps, grpo.epochs, grpo.rollout_is_cap
        self.world_size = spec.world_size
        self.rollout_model = rollout_model
        self.timeout_s = spec.cfg.distributed.timeout_s
        self.workers: list[tuple[int, mp.process.BaseProcess, Connection]] = []
        self.closed = False
        # Rank 0's share of every command runs on this one thread, never on the callers' (gRPC worker) threads:
        # DTensor keeps a per-thread cache that holds the process group, and a thread that outlives the group
        # would carry it into any child forked later, where freeing it deadlocks (gloo's threads are not there).
        # This thread ends in close()/kill(), after the group, so the cache goes with it.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-rank0")
        store = dist.TCPStore("127.0.0.1", 0, spec.world_size, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=self.timeout_s))
        spec = replace(spec, store_port=store.port)
        context = mp.get_context("spawn")
        try:
            for rank in range(1, spec.world_size):
                parent, child = context.Pipe()
                process = context.Process(target=rank_main, args=(spec, rank, child), name=f"cooper-policy-rank{rank}",
                                          daemon=True)
                process.start()
                child.close()
                self.workers.append((rank, process, parent))
            device = rank_device(self.cfg.device, 0, "policy.device")
            models = load_models(spec, device)
            self._collect("loaded", "start")  # a rank that fails to load fails the start here, before any collective
            self.local = self._on_rank0(join_group, spec, 0, store, device, models)
            self._collect("ready", "start")
        except BaseException:
            self.kill()
            raise
        self.store = store
        log.info("policy: %d ranks ready (FSDP2, %s)", self.world_size, dist.get_backend())

    # --- driving --------------------------------------------------------------------------------------------

    def _on_rank0(self, fn: Any, *args: Any) -> Any:
        return self._thread.submit(fn, *args).result()

    def _failure(self, rank: int, process: mp.process.BaseProcess, command: str) -> RankFailure:
        return RankFailure(f"policy rank {rank} of {self.world_size} {_describe_exit(process.exitcode)} during "
                           f"{command}")

    def _collect(self, expect: str, command: str) -> None:
        """Wait for every other rank's `expect` message; a rank that dies or reports an error is a RankFailure."""
        for rank, process, conn in self.workers:
            ready = wait([conn, process.sentinel], self.timeout_s)
            if conn in ready or conn.poll():
                try:
                    kind, detail = conn.recv()
                except EOFError:
                    process.join(5)
                    raise self._failure(rank, process, command) from None
                if kind == "error":
                    raise RankFailure(f"policy rank {rank} of {self.world_size} failed during {command}: {detail}")
                if kind != expect:
                    raise RankFailure(f"policy rank {rank} answered {kind!r} to {command}, expected {expect!r}")
                continue
            process.join(5)
            raise self._failure(rank, process, command)

    def _dead_rank(self, command: str, wait_s: float) -> RankFailure | None:
        """After a failed collective: the rank that died, if one did within `wait_s` (its exit may lag the error),
        with the error it reported before exiting, if it did."""
        ready = wait([process.sentinel for _, process, _ in self.workers], wait_s)
        for rank, process, conn in self.workers:
            if process.sentinel not in ready:
                continue
            # The sentinel closes as the process exits, a moment before it can be reaped (and has an exit code).
            process.join(5)
            if conn.poll():
                try:
                    kind, detail = conn.recv()
                except EOFError:
                    kind, detail = "", ""
                if kind == "error":
                    return RankFailure(f"policy rank {rank} of {self.world_size} failed during {command}: {detail}")
            return self._failure(rank, process, command)
        return None

    def run(self, command: str, per_rank: Sequence[tuple[Any, ...]]) -> Any:
        """Run `RankTrainer.<command>` on every rank (rank r with `per_rank[r]`); rank 0's result."""
        if self.closed:
            raise RankFailure("the policy ranks were stopped after a failure")
        for rank, process, conn in self.workers:
            if not process.is_alive():
                raise self._failure(rank, process, command)
            try:
                conn.send((command, per_rank[rank]))
            except OSError:
                raise self._failure(rank, process, command) from None
        try:
            result = self._on_rank0(getattr(self.local, command), *per_rank[0])
        except Exception as err:
            # A collective fails on rank 0 when a peer went away: name that rank rather than the transport error.
            dead = self._dead_rank(command, 5.0)
            if dead is not None:
                raise dead from err
            raise RankFailure(f"policy rank 0 of {self.world_size} failed during {command}: "
                              f"{type(err).__name__}: {err}") from err
        self._collect("ok", command)
        return result

    # --- the trainer interface PolicyCore uses ------------------------------------------------------------

    def apply_update(self, samples: Sequence[RolloutSample], advantages: torch.Tensor) -> dict[str, float]:
        """One update across the ranks, each on its share, then the new weights gathered into the rollout model."""
        parts = split_batch(samples, advantages, self.world_size, self.cfg.optim.micro_batch_size)
        return self.run("update", [(parts[0], self.rollout_model), *[(part, None) for part in parts[1:]]])

    def optimizer_state(self) -> dict[str, Any]:
        return self.run("full_optimizer_state", [()] * self.world_size)

    @property
    def updates(self) -> int:
        return self.local.updates

    # --- stopping -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every rank cleanly (between commands)."""
        if self.closed:
            return
        self.closed = True
        for _, process, conn in self.workers:
            if process.is_alive():
                try:
                    conn.send(("stop", ()))
                except OSError:
                    pass
        for _, process, _ in self.workers:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(10)
        dist.destroy_process_group()
        self._thread.shutdown(wait=True)

    def kill(self) -> None:
        """After a failure: kill the other ranks at once and drop the group (it cannot be used again)."""
        self.closed = True
        for _, process, _ in self.workers:
            if process.is_alive():
                process.kill()
        for _, process, conn in self.workers:
            process.join(10)
            conn.close()
        if dist.is_initialized():
            # The group is broken (a member is gone); tearing it down may report that again, which says nothing new.
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                log.debug("destroying the broken process group", exc_info=True)
        self._thread.shutdown(wait=True)
