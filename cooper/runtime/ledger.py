"""What makes a trainer's update idempotent, shared by both trainers (the policy's Train and Restore, VerifyRM's
Update): the key of each step's update and the results of the latest keyed updates.

The orchestrator keys every update by its run and step. A trainer that sees a key it has applied answers the result
it recorded then and trains nothing, so a call retried after a lost answer, a restarted stage or a resumed run is
applied once. The ledger travels in the trainer's checkpoints and comes back with its update journal; it keeps the
latest `keep` keys only, since the orchestrator retries only its latest steps.

No torch here: the services' message modules take `SavedCheckpoint` from this module.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class SavedCheckpoint:
    """What a trainer's Save answers: the checkpoint's directory (complete) and the model version it holds."""

    path: str
    version: int


def idempotency_key(run_id: str, step: int) -> str:
    """"<run_id>/<step>", the key of one step's update; "" (no key: the update is applied every time it is sent)
    when run_id is empty."""
    return f"{run_id}/{step}" if run_id else ""


class Ledger(Generic[T]):
    """The results of the latest `keep` keyed updates, oldest dropped first, and the key of the last one applied."""

    def __init__(self, keep: int, results: Mapping[str, T] | None = None, last_key: str = ""):
        self.keep = keep
        self.last_key = last_key
        self._results: OrderedDict[str, T] = OrderedDict(results or {})

    def recorded(self, key: str | None) -> T | None:
        """The result recorded for `key`; None for a key not applied (or no longer kept), or no key."""
        return self._results.get(key) if key else None

    def record(self, key: str | None, result: T) -> None:
        """Record an applied update's result; an update sent without a key leaves the ledger as it was."""
        if not key:
            return
        self.last_key = key
        self._results[key] = result
        while len(self._results) > self.keep:
            self._results.popitem(last=False)

    def results(self) -> dict[str, T]:
        """Key -> result, oldest first (what a checkpoint saves)."""
        return dict(self._results)
