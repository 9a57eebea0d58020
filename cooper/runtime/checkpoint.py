"""Atomic checkpoints, one directory per saved state, for the policy and the reward services.

A checkpoint is a Hugging Face model directory (`save_pretrained`: safetensors weights, config, tokenizer), so it
loads with `from_pretrained` anywhere (evaluation, another engine, `policy.model=<path>`), plus `optimizer.pt`
(optimizer and scheduler state) and a state file (JSON: version, the last applied idempotency key, the recorded
results of recent keys, tag, time). It is written to a hidden temp directory beside its target and renamed into
place, the state file last, so a crash mid-write never leaves a directory that `complete_checkpoints` lists.

The two services keep the rules they had, written down in their CheckpointLayout:

- policy (POLICY, the default of every function here): `v<version>/state.json`. Saving a version again (Save
  twice without an update) swaps the new directory in.
- reward (REWARD): `v<version>-u<updates>/cooper_state.json`. The name is unique per state (a skipped update
  counts), so a save never replaces a directory a read replica may be loading; saving an unchanged state again
  returns the existing one. Replicas list the directory for a newer checkpoint and read its weights (read_weights)
  while the trainer writes the next one or deletes old ones.

Writes are fsynced in both, because the update journal deletes its entries on the strength of a checkpoint on disk
(cooper/runtime/durability.py). A save can run off the training path: `snapshot_state` copies the weights and
optimizer state to host memory between two updates, and `BackgroundSave` writes that copy on a thread of its own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cooper.runtime.files import fsync_path

OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class CheckpointLayout:
    """How one service names and writes its checkpoints (see the module docstring)."""

    state_file: str
    counts_updates: bool
    """Names carry the update count as well as the version, and a name, once written, is never replaced."""

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(r"v([0-9]+)-u([0-9]+)" if self.counts_updates else r"v([0-9]{8})")

    def sequence(self, path: str | os.PathLike[str]) -> int:
        """The update sequence number a checkpoint's name carries: its update count, else its version."""
        match = self.pattern.fullmatch(Path(path).name)
        if match is None:
            raise ValueError(f"{path} is not a checkpoint's name")
        return int(match.groups()[-1])

    def path(self, root: str | os.PathLike[str], state: dict[str, Any]) -> Path:
        """The directory a checkpoint of `state` (its "version", and "updates" when counted) has under `root`."""
        updates = int(state["updates"]) if self.counts_updates else None
        return Path(root) / checkpoint_name(int(state["version"]), updates)


POLICY = CheckpointLayout("state.json", counts_updates=False)
REWARD = CheckpointLayout("cooper_state.json", counts_updates=True)


def checkpoint_name(version: int, updates: int | None = None) -> str:
    """"v<version>", or "v<version>-u<updates>" for a layout that counts updates; 8 digits each."""
    return f"v{version:08d}" if updates is None else f"v{version:08d}-u{updates:08d}"


def save_checkpoint(
    root: str | os.PathLike[str], model: Any, tokenizer: Any, optimizer_state: dict[str, Any], state: dict[str, Any],
    keep: int | None = None, weights: dict[str, torch.Tensor] | None = None, layout: CheckpointLayout = POLICY,
) -> Path:
    """Write a complete checkpoint for `state["version"]` (and `state["updates"]` with REWARD) and return its
    directory; then, with `keep`, delete all but the newest `keep` complete checkpoints (the one just written is
    the newest unless a newer one exists). `weights`: a state dict to write instead of the model's own (a
    `snapshot_state` copy); the model then gives only its config."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = layout.path(root, state)
    if layout.counts_updates and (target / layout.state_file).is_file():
        return target  # this very state is saved already (without its state file the directory is a leftover: replaced)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
        (tmp / layout.state_file).write_text(json.dumps({**state, "saved_at": time.time()}, indent=1))
        for path in tmp.rglob("*"):
            if path.is_file():
                fsync_path(path)
        if target.exists():
            # Saving the same version again: swap the directories so that a complete copy exists at every moment
            # except between the two renames.
            old = Path(tempfile.mkdtemp(prefix=".old-", dir=root))
            old.rmdir()
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
        fsync_path(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if keep is not None:
        for old in complete_checkpoints(root, layout)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def complete_checkpoints(root: str | os.PathLike[str], layout: CheckpointLayout = POLICY) -> list[Path]:
    """The complete checkpoints of `layout` under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = layout.pattern.fullmatch(path.name)
        if match and (path / layout.state_file).is_file():
            found.append((tuple(int(number) for number in match.groups()), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(root: str | os.PathLike[str], layout: CheckpointLayout = POLICY) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    done = complete_checkpoints(root, layout)
    return done[-1] if done else None


def read_state(path: str | os.PathLike[str], layout: CheckpointLayout = POLICY) -> dict[str, Any]:
    return json.loads((Path(path) / layout.state_file).read_text())


def read_optimizer_state(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> dict[str, Any]:
    # weights_only: the file holds tensors, numbers and dicts only, so refuse anything that would run code.
    return torch.load(Path(path) / OPTIMIZER_FILE, map_location=device, weights_only=True)


def read_weights(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's safetensors files (one, or the shards save_pretrained writes), on the CPU."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint {path} has no .safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(file, device="cpu"))
    return tensors


def remove_partial_checkpoints(root: str | os.PathLike[str]) -> None:
    """Delete the temp directories of saves a crash cut short (each as large as a checkpoint). Only at start-up,
    when no save of this service can be in progress (a read replica never calls it: the trainer may be saving)."""
    root = Path(root)
    if root.is_dir():
        for path in [*root.glob(".tmp-*"), *root.glob(".old-*")]:
            shutil.rmtree(path, ignore_errors=True)


def snapshot_state(model: Any, optimizer_state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A host-memory copy of the weights and of `optimizer_state`, taken between two updates, that a background
    write can read while training changes the originals in place. Tensors that share storage (tied input and output
    embeddings) stay shared in the copy, so it saves exactly as the model does."""
    copies: dict[tuple[Any, ...], torch.Tensor] = {}

    def copy(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            key = (node.device, node.data_ptr(), node.dtype, tuple(node.shape), tuple(node.stride()))
            if key not in copies:
                copies[key] = node.detach().to("cpu", copy=True)
            return copies[key]
        if isinstance(node, dict):
            return {k: copy(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(copy(v) for v in node)
        return node  # numbers and strings: immutable

    return copy(model.state_dict()), copy(optimizer_state)


class BackgroundSave:
    """At most one checkpoint write in flight, on a thread of its own. A write that fails is logged and counted, not
    raised: the update journal still holds every update since the last checkpoint on disk, so nothing is lost, and
    the next save tries again (the caller's `saved_version` does not move)."""

    def __init__(self, service: str, log: logging.Logger):
        self.service = service
        self.log = log
        self._thread: threading.Thread | None = None
        self.failures = 0

    def start(self, write: Callable[[], object]) -> None:
        """Run `write` on a new thread, after the write in flight (if any) has finished."""
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(write,), name=f"{self.service}-checkpoint", daemon=True)
        self._thread.start()

    def _run(self, write: Callable[[], object]) -> None:
        try:
            write()
        except Exception:
            self.failures += 1
            self.log.exception("%s: a background checkpoint failed; the journal keeps the updates since the last one "
                               "on disk, and the next save tries again", self.service)

    def wait(self) -> None:
        """Return once no write is in flight."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
