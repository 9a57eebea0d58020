"""The command channel of a rank group: rank 0 names each command in the group's TCPStore and every other rank waits
for it there (the package docstring); the commands a rank can be asked to run; the spec every rank builds from."""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from cooper.config import PolicyConfig
from cooper.services.policy.placement import Placement
from cooper.services.policy.sharded import RankTrainer

COMMANDS: dict[str, Callable[..., Any]] = {command.__name__: command for command in (
    RankTrainer.update, RankTrainer.full_optimizer_state)}
"""What rank 0 can ask every rank to run, by the name that travels in the store (`cmd/<n>`); "stop" ends a rank."""

log = logging.getLogger("cooper.policy")

POLL_S = 0.02
"""The longest pause between two looks at the store while a rank waits for a key (the first ones come sooner)."""

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
        # TCPStore.set takes bytes as well as str (its stub says str only); a pickle is bytes.
        self.store.set(self.prefix + key, pickle.dumps(value))  # type: ignore[arg-type]

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
