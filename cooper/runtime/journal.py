"""A write-ahead journal of applied updates: what a service needs to redo the updates after its newest checkpoint.

A service that writes a full checkpoint only every N updates appends each update it applies (the request and the
result it answered) here, durably, before it answers. A restarted service loads its newest checkpoint and applies
the journaled updates after it again, in order, so it comes back at the version it last answered: no acknowledged
update is lost, and none is applied twice (its key is back in the recorded results, so a retry is answered from
them). Once a checkpoint that includes an entry is on disk, the entry is deleted (`prune`).

One file per update, `u<version, 8 digits>.pt` (the version the update produced), written to a temp name,
fsynced and renamed into place, then the directory fsynced: a crash mid-append leaves no partial entry, and an
entry that `append` returned from survives a power cut. Each entry names the key applied before it
(`after_key`), so `chain` follows one history only and never applies an entry left over from another (a service
put back on an older checkpoint, whose journal still holds entries of the updates that checkpoint lacks).

`torch.save` of tensors, read back with `weights_only`: an entry holds token ids, floats, strings and numbers only,
so reading one never runs code, and a rollout of the 1.5B preset's shape (64 x 16 completions of 1,024 tokens with
their log-probs) is 9 MB written in a fraction of a second; as JSON it was 29 MB and 3 s on the training path.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from cooper.runtime.files import fsync_path

_ENTRY = re.compile(r"^u(\d{8})\.pt$")


class UpdateJournal:
    """The journal directory `root` (created on the first append)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def path(self, version: int) -> Path:
        """The entry of the update that produced `version`."""
        return self.root / f"u{version:08d}.pt"

    def versions(self) -> list[int]:
        """The versions with an entry, ascending."""
        if not self.root.is_dir():
            return []
        return sorted(int(m[1]) for p in self.root.iterdir() if (m := _ENTRY.match(p.name)))

    def append(self, version: int, after_key: str, record: dict[str, Any]) -> None:
        """Record the update that produced `version`, applied when `after_key` was the last applied key; `record`
        must hold its own "key". Returns once the entry is on disk. An entry for `version` left by another history
        is replaced."""
        if "key" not in record:
            raise ValueError("a journal record needs the key of its update")
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as out:
                torch.save({"version": version, "after_key": after_key, **record}, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path(version))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_path(self.root)

    def chain(self, version: int, last_key: str) -> list[dict[str, Any]]:
        """The entries that continue a state at `version` whose last applied key is `last_key`: version + 1,
        version + 2, ... while each was applied right after the one before; stops at the first gap or foreign
        entry (nothing after it can be applied: the update it follows is not in this history)."""
        found = []
        for expected in range(version + 1, version + 1 + len(self.versions())):
            path = self.path(expected)
            if not path.is_file():
                break
            entry = torch.load(path, map_location="cpu", weights_only=True)
            if entry["after_key"] != last_key:
                break
            found.append(entry)
            last_key = entry["key"] or last_key  # an update without a key leaves the last key as it was
        return found

    def prune(self, through: int) -> None:
        """Delete the entries of versions up to `through`: a checkpoint of `through` is on disk."""
        for version in self.versions():
            if version <= through:
                self.path(version).unlink(missing_ok=True)

    def discard_partial(self) -> None:
        """Delete the temp files of appends a crash cut short. Only at start-up: at any other time one may be an
        append in progress."""
        if self.root.is_dir():
            for path in self.root.glob(".tmp-*"):
                path.unlink(missing_ok=True)
