"""Rank 0's side of the group: it starts the other ranks (one machine) or meets them (launched), drives them with
commands, and trains the policy with them: the `PolicyUpdater` PolicyCore uses when policy.world_size > 1."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from cooper.runtime.devices import rank_device
from cooper.services.policy.errors import RankFailure
from cooper.services.policy.placement import Placement
from cooper.services.policy.ranks.control import COMMANDS, Control, RankSpec
from cooper.services.policy.ranks.follower import join_group, load_models
from cooper.services.policy.ranks.local import LocalRanks
from cooper.services.policy.sharded import RankTrainer, split_batch
from cooper.services.policy.trainer import PolicyUpdater, RolloutSample

log = logging.getLogger("cooper.policy")

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
