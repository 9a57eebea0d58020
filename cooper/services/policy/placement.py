"""Where a policy process sits in a group of training ranks, as a launcher (torchrun) says it; no torch here, so
that the CLI can ask before it imports anything heavy (cooper/services/policy/ranks/ runs the group)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Where a process sits in the group, as a launcher says it (torchrun's environment variables)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher_hosts_store: bool
    """torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE); else global rank 0 does."""
    generation: int = 0
    """Restarts of the whole group by its launcher (TORCHELASTIC_RESTART_COUNT): a restarted group must not read the
    keys its predecessor left in the launcher's store."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Placement | None:
        """The placement a launcher gave this process; None when none did (or it started a group of one)."""
        if "RANK" not in environ or "WORLD_SIZE" not in environ or int(environ["WORLD_SIZE"]) < 2:
            return None
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in environ]
        if missing:
            raise RuntimeError(f"RANK and WORLD_SIZE are set but {' and '.join(missing)} not: start the policy "
                               "service with torchrun (docs/multi-node.md), or unset RANK and WORLD_SIZE")
        world_size = int(environ["WORLD_SIZE"])
        return cls(rank=int(environ["RANK"]), world_size=world_size,
                   local_rank=int(environ.get("LOCAL_RANK", environ["RANK"])),
                   local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world_size)),
                   master_addr=environ["MASTER_ADDR"], master_port=int(environ["MASTER_PORT"]),
                   launcher_hosts_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
                   generation=int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")))

    def env(self) -> dict[str, str]:
        """The environment a launcher sets for this placement (what `LocalRanks` gives the ranks it starts)."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port),
                "TORCHELASTIC_USE_AGENT_STORE": str(self.launcher_hosts_store), "TORCHELASTIC_RESTART_COUNT":
                str(self.generation)}

    @property
    def nodes(self) -> int:
        return self.world_size // self.local_world_size

    def as_rank(self, rank: int) -> Placement:
        """Rank `rank` of the same single-node group."""
        return Placement(rank, self.world_size, rank, self.local_world_size, self.master_addr, self.master_port,
                         self.launcher_hosts_store, self.generation)


def launched() -> Placement | None:
    """This process's place in a group that a launcher (torchrun) started; None when it runs on its own."""
    return Placement.from_env()
