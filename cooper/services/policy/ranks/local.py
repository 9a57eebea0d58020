"""Ranks 1..N-1 of a one-machine group, started by the service itself (what torchrun does for its local ranks)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from multiprocessing.connection import wait

from cooper.services.policy.placement import Placement
from cooper.services.policy.ranks.follower import follow


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
