"""How a training service keeps what it answered: an update journal, and full checkpoints written in the background.

The one mechanism of both trainers, the policy (`PolicyCore`) and VerifyRM (`RewardCore`):

- every applied update is appended to the update journal (cooper/runtime/journal.py), fsynced, before the service
  answers it: what the update needs to be applied again (the policy's rollout and rewards, VerifyRM's preference
  pairs and optimizer steps) and the result it answered;
- every `save_every` updates a full checkpoint (weights, optimizer state, the service's bookkeeping) is written, by
  default from an in-memory copy on a thread of its own (`save_in_background`), so the training path pays for a
  copy, not for the write; at most one write is in flight, and writes land in update order;
- once a checkpoint is on disk (fsynced), the journal entries it includes are deleted, and only the newest
  `keep_checkpoints` checkpoints are kept;
- start-up deletes what a crashed save left, loads the newest checkpoint and applies the journaled updates after it
  again, in order (`entries_after`), so the service comes back at the update it last answered: none lost, none
  applied twice (its key is back among the recorded results, so a retry is answered from them). The updates are
  deterministic functions of the state and the journaled request, so on one CPU kind the state comes back bit for
  bit; on a GPU to within its kernels' rounding.

A service that must come back able to rebuild the states of the last `rebuild` updates as well (the policy with
rollouts ahead of training, which samples versions behind its trainer) keeps the journal back to the newest
checkpoint at least `rebuild` updates old, and starts from that checkpoint: applying the journal again passes
through every state after it.

A journal write that fails after its update was applied leaves the service's memory one update ahead of its journal
and checkpoints, with the update's key unrecorded: a retry would apply it twice, and a save would keep it without its
key. So the service refuses every call from then on (`UnjournaledUpdate`) and saves nothing; a restart comes back
from the journal, where the retry is applied, once.

Updates are counted by a sequence number that rises by one per applied update: the policy's version, VerifyRM's
update count (an update VerifyRM skips, for a non-finite gradient, keeps the version but is journaled too). A
service that runs several identical copies of its model (reward.model_copies) gives one copy the writes (`writes`)
and lets the others only read the journal at start-up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cooper.runtime.checkpoint import (
    BackgroundSave,
    CheckpointLayout,
    complete_checkpoints,
    latest_checkpoint,
    remove_partial_checkpoints,
    save_checkpoint,
    snapshot_state,
)
from cooper.runtime.journal import UpdateJournal

JOURNAL_DIR = "journal"
"""The update journal's directory inside a service's checkpoint_dir."""


class UnjournaledUpdate(RuntimeError):
    """An update was applied in memory but its journal entry could not be written: the service holds a state that
    neither its journal nor its checkpoints hold, refuses every call and must restart (it comes back at the update
    before; the caller's retry is applied then). Raised by the write that failed, with its error as the cause, and
    by every call after it."""


class Durability:
    """The checkpoints and journal of one service under `root` (its checkpoint_dir)."""

    def __init__(self, root: str | os.PathLike[str], layout: CheckpointLayout, *, save_every: int,
                 keep_checkpoints: int, journal: bool, service: str,
                 writes: bool = True, rebuild: int = 0):
        self.root = Path(root)
        self.layout = layout
        self.save_every = save_every
        self.keep_checkpoints = keep_checkpoints
        self.journal = UpdateJournal(self.root / JOURNAL_DIR) if journal else None
        self.writes = writes
        self.rebuild = rebuild
        self.log = logging.getLogger(f"cooper.{service}")
        self.background = BackgroundSave(service, self.log)
        self.latest = ""
        """The newest checkpoint written or loaded ("" before the first)."""
        self.saved_sequence: int | None = None
        """The sequence number that checkpoint holds (None: nothing saved or loaded yet)."""
        self.unjournaled: str | None = None
        """Why the state in memory is ahead of the journal (a journal write failed); None while the journal holds it."""

    def start(self) -> Path | None:
        """At start-up: delete the leftovers of writes a crash cut short (each may be as large as a checkpoint) and
        return the newest complete checkpoint, None when there is none. A copy that does not write leaves the
        directory alone: the writing copy may be saving."""
        if self.writes:
            remove_partial_checkpoints(self.root)
            if self.journal:
                self.journal.discard_partial()
        if not self.rebuild or not self.journal:
            return latest_checkpoint(self.root, self.layout)
        done = complete_checkpoints(self.root, self.layout)
        journaled = self.journal.versions()
        end = max(journaled[-1:] + [self.layout.sequence(path) for path in done[-1:]], default=0)
        base = self._newest_at_most(done, end - self.rebuild)
        if base is None and not (journaled and journaled[0] == 1):  # no history reaches that far back: the newest
            base = done[-1] if done else None
        return base

    def _newest_at_most(self, done: list[Path], sequence: int) -> Path | None:
        """The newest of the complete checkpoints `done` (oldest first) at or before update `sequence`."""
        return next((path for path in reversed(done) if self.layout.sequence(path) <= sequence), None)

    def loaded(self, path: str | os.PathLike[str], sequence: int) -> None:
        """The service has loaded checkpoint `path`, which holds the state after update `sequence`."""
        self.latest = str(path)
        self.saved_sequence = sequence

    def entries_after(self, sequence: int, last_key: str) -> list[dict[str, Any]]:
        """The journaled updates that continue a state at `sequence` whose last key is `last_key`, in order."""
        return self.journal.chain(sequence, last_key) if self.journal else []

    def record(self, sequence: int, after_key: str, entry: dict[str, Any]) -> None:
        """Journal the update that produced `sequence` (applied when `after_key` was the last key); returns once it
        is on disk. `entry` holds the update's "key" and what applying it again needs."""
        if not (self.journal and self.writes):
            return
        try:
            self.journal.append(sequence, after_key, entry)
        except Exception as err:
            # Why stop rather than undo the update or journal it before applying it: the update changed weights and
            # optimizer moments in place, and undoing it would need a copy of the state per update, the cost the
            # journal exists to avoid; an entry written before applying holds no answer for a retry, and a restart
            # would apply it even if applying it failed here. A failed write (often a failed fsync, after which the
            # kernel may have dropped the pages: PostgreSQL stops on one for that reason) leaves only the journal and
            # checkpoints sure, one update behind memory, so the service goes back to them.
            self.unjournaled = (f"the journal entry of update {sequence} (key {entry['key']!r}) could not be written "
                                f"({type(err).__name__}: {err}), after the update was applied in memory; this service "
                                "refuses every call until it restarts, from its checkpoint and journal, where a retry "
                                "of that update is applied once")
            raise UnjournaledUpdate(self.unjournaled) from err

    def unjournaled_on_stop(self) -> bool:
        """True, and why in the log, when memory is ahead of the journal: nothing may be saved on stop then (a
        restart goes back to the journal)."""
        if self.unjournaled is None:
            return False
        self.log.error("nothing is saved on stop: %s", self.unjournaled)
        return True

    def check_journaled(self) -> None:
        """UnjournaledUpdate once a journal write has failed: nothing may be answered or saved from memory then."""
        if self.unjournaled is not None:
            raise UnjournaledUpdate(self.unjournaled)

    def due(self, sequence: int) -> bool:
        """A periodic checkpoint is due after update `sequence`."""
        return self.writes and bool(self.save_every) and sequence % self.save_every == 0

    def unsaved(self, sequence: int) -> bool:
        """Updates were applied since the newest checkpoint (or, with none, since the initial model)."""
        return sequence != (self.saved_sequence or 0)

    def save(self, model: Any, tokenizer: Any, optimizer_state: Callable[[], dict[str, Any]], state: dict[str, Any],
             sequence: int, background: bool = False) -> str:
        """Checkpoint the state after update `sequence`: `state` is the service's bookkeeping (its "version", and
        with a layout that counts updates its "updates"), `optimizer_state` returns the optimizer's. Returns the
        checkpoint's directory; `background`: the write runs on the background thread from a copy taken now, and
        the directory is complete once it lands (`wait`)."""
        self.check_journaled()  # a checkpoint of memory would keep the unjournaled update without its key
        self.background.wait()  # one write at a time, in update order: pruning must never overtake
        if not background:
            return str(self._write(model, tokenizer, optimizer_state(), state, sequence, None))
        weights, optimizer_copy = snapshot_state(model, optimizer_state())
        self.background.start(lambda: self._write(model, tokenizer, optimizer_copy, state, sequence, weights))
        return str(self.layout.path(self.root, state))

    def _write(self, model: Any, tokenizer: Any, optimizer_state: dict[str, Any], state: dict[str, Any],
               sequence: int, weights: dict[str, torch.Tensor] | None) -> Path:
        path = save_checkpoint(self.root, model, tokenizer, optimizer_state, state, keep=self.keep_checkpoints,
                               weights=weights, layout=self.layout)
        self.loaded(path, sequence)
        if self.journal:  # the checkpoint is on disk (fsynced): the updates it includes need no entry any more
            base = self._newest_at_most(complete_checkpoints(self.root, self.layout), sequence - self.rebuild)
            if base is not None:
                self.journal.prune(self.layout.sequence(base))
        self.log.info("checkpoint %s written (update %d)", path, sequence)
        return path

    def wait(self) -> None:
        """Return once no background write is in flight."""
        self.background.wait()
