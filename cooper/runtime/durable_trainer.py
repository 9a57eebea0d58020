"""The bookkeeping both trainers keep to come back where they last answered: the policy's (`PolicyCore`) and
VerifyRM's (`RewardCore`).

A `DurableTrainer` owns, for one trainer:
- the update sequence number (the policy's version, VerifyRM's update count: durability.py), raised by one per
  applied update;
- the ledger of the latest keyed results (ledger.py), typed: a retried key is answered from it;
- the version ranges a restore left behind (their checkpoints hold another branch's weights);
- journal replay at start-up and the bookkeeping a checkpoint holds beside the weights.

What an update does to the weights, and what its journal entry holds, stay with the trainer that makes it: this piece
sees an entry only as something to hand back to that trainer's `apply`, and a result as a record to keep.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from cooper.runtime.checkpoint import complete_checkpoints
from cooper.runtime.durability import Durability
from cooper.runtime.ledger import Ledger

R = TypeVar("R")
S = TypeVar("S")


class DurableTrainer(Generic[R]):
    """`encode` and `decode` turn a ledger record into the JSON a checkpoint holds and back; `keep`: how many keyed
    results are kept (the orchestrator retries only its latest steps)."""

    def __init__(self, durability: Durability, keep: int, encode: Callable[[R], dict[str, Any]],
                 decode: Callable[[Mapping[str, Any]], R]):
        self.durability = durability
        self.keep = keep
        self._encode, self._decode = encode, decode
        self.sequence = 0
        self.ledger: Ledger[R] = Ledger(keep)
        self.abandoned: list[tuple[int, int]] = []
        """Sequence ranges (first, last) a restore left behind: their checkpoints are another branch's weights."""

    @property
    def last_key(self) -> str:
        return self.ledger.last_key

    @property
    def latest(self) -> str:
        """The newest checkpoint written or loaded ("" before the first)."""
        return self.durability.latest

    def start(self) -> Path | None:
        """The checkpoint to load at start-up (durability.py), None: the initial model."""
        return self.durability.start()

    def resume(self, checkpoint: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
        """Take the bookkeeping of the loaded `checkpoint` (its `state`)."""
        # A policy checkpoint written before both trainers shared this layout names its count "version" and its
        # results "history".
        self.sequence = int(state.get("updates", state.get("version", 0)))
        results = state.get("results", state.get("history", {}))
        self.ledger = Ledger(self.keep, {key: self._decode(value) for key, value in results.items()},
                             state.get("last_key", ""))
        self.abandoned = [(int(first), int(last)) for first, last in state.get("abandoned", [])]
        self.durability.loaded(checkpoint, self.sequence)

    def reset(self) -> None:
        """Back to the initial model's bookkeeping: no update applied, nothing recorded."""
        self.sequence, self.ledger, self.abandoned = 0, Ledger(self.keep), []
        self.durability.loaded("", 0)

    def replay(self, apply: Callable[[dict[str, Any]], R]) -> int:
        """Apply again, in order, the journaled updates after the loaded checkpoint: `apply(entry)` makes the update
        and returns the result to record (the one the entry says was answered). Returns how many were applied."""
        entries = self.durability.entries_after(self.sequence, self.last_key)
        for entry in entries:
            result = apply(entry)
            self.sequence += 1
            self.ledger.record(entry["key"], result)
        return len(entries)

    def recorded(self, key: str) -> R | None:
        """The result recorded for `key` (None: not applied, or no longer kept). Refuses once a journal write failed."""
        self.durability.check_journaled()
        return self.ledger.recorded(key)

    def commit(self, key: str, result: R, journal_entry: dict[str, Any]) -> None:
        """An update was applied: count it, journal it (on disk before this returns, so an update the trainer
        answers is never lost), then record its result under `key`. A journal write that fails raises
        UnjournaledUpdate with the key unrecorded, and the trainer refuses every call until a restart."""
        after_key = self.last_key
        self.sequence += 1
        self.durability.record(self.sequence, after_key, journal_entry)
        self.ledger.record(key, result)

    def commit_saved(self, key: str, result: R) -> None:
        """An update that a checkpoint keeps instead of the journal (a restore): count it and record its result; the
        caller saves before answering."""
        self.sequence += 1
        self.ledger.record(key, result)

    def check_journaled(self) -> None:
        """UnjournaledUpdate once a journal write has failed (Durability.check_journaled)."""
        self.durability.check_journaled()

    def wait(self) -> None:
        """Return once no background checkpoint write is in flight."""
        self.durability.wait()

    def due(self) -> bool:
        """A periodic checkpoint is due now."""
        return self.durability.due(self.sequence)

    def state(self, tag: str, **extra: Any) -> dict[str, Any]:
        """The bookkeeping a checkpoint holds beside the weights and optimizer state, with the trainer's `extra`."""
        return {"updates": self.sequence, "last_key": self.last_key, "tag": tag,
                "results": {key: self._encode(value) for key, value in self.ledger.results().items()},
                "abandoned": [list(span) for span in self.abandoned], **extra}

    def save(self, model: Any, tokenizer: Any, optimizer_state: Callable[[], dict[str, Any]], state: dict[str, Any],
             background: bool = False) -> str:
        """Checkpoint the state after the current update (Durability.save); its directory."""
        return self.durability.save(model, tokenizer, optimizer_state, state, self.sequence, background)

    def save_if_unsaved(self, save: Callable[[], S]) -> S | None:
        """`save()` when updates were applied since the newest checkpoint (or since the initial model), once no
        background write is in flight; None when nothing was, or when memory is ahead of the journal."""
        self.durability.wait()
        if self.durability.unjournaled_on_stop() or not self.durability.unsaved(self.sequence):
            return None
        return save()

    def rollback_target(self, at_most: int) -> tuple[Path | None, int]:
        """The newest complete checkpoint of this branch at or below sequence `at_most`, and its sequence number;
        (None, 0): the initial model."""
        for path in reversed(complete_checkpoints(self.durability.root, self.durability.layout)):
            sequence = self.durability.layout.sequence(path)
            if sequence <= at_most and not any(first <= sequence <= last for first, last in self.abandoned):
                return path, sequence
        return None, 0

    def abandon_after(self, sequence: int) -> None:
        """A restore to `sequence` leaves the updates after it behind (none when it is the current one)."""
        if sequence < self.sequence:
            self.abandoned.append((sequence + 1, self.sequence))
