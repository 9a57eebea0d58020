"""Atomic, resumable policy checkpoints.

A checkpoint is a directory `<checkpoint_dir>/v<version, 8 digits>/` holding:
- the weights and tokenizer as a Hugging Face model directory (`save_pretrained`, safetensors), so a checkpoint
  loads with `from_pretrained` anywhere (evaluation, another engine, `policy.model=<path>`);
- `optimizer.pt`: AdamW state and the update count (drives the warm-up);
- `state.json`: version, the last applied idempotency key and the recent keys' recorded results, tag, time.

It is written to a hidden temp directory beside the target, fsynced and renamed into place, so a crash mid-write never
leaves a partial checkpoint where `latest_checkpoint` would find it (`state.json` is written last inside it), and a
checkpoint that is in place stays complete through a power cut: the update journal deletes its entries on the
strength of it (cooper/runtime/journal.py).

A save can run off the training path: `snapshot_state` copies the weights and optimizer state to host memory between
two updates, and `BackgroundSave` writes that copy on a thread of its own while the next updates run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cooper.runtime.journal import fsync_path

log = logging.getLogger("cooper.policy")

STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"


def checkpoint_name(version: int) -> str:
    return f"v{version:08d}"


def save_checkpoint(
    root: str | os.PathLike[str], model: Any, tokenizer: Any, optimizer_state: dict[str, Any], state: dict[str, Any],
    keep: int | None = None, weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a complete checkpoint for `state["version"]` and return its directory; then, with `keep`, delete all
    but the newest `keep` complete checkpoints (the one just written is the newest unless a newer one exists).
    `weights`: a state dict to write instead of the model's own (a `snapshot_state` copy); the model then gives only
    its config."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = root / checkpoint_name(int(state["version"]))
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({**state, "saved_at": time.time()}, indent=1))
        for path in tmp.rglob("*"):
            if path.is_file():
                fsync_path(path)
        if target.exists():
            # Saving the same version again (Save() twice without an update): swap the directories so that a
            # complete copy exists at every moment except between the two renames.
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
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def complete_checkpoints(root: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints under `root`, oldest version first."""
    root = Path(root)
    if not root.is_dir():
        return []
    done = [p for p in root.glob("v" + "[0-9]" * 8) if (p / STATE_FILE).is_file()]
    return sorted(done, key=lambda p: int(p.name[1:]))


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest version under `root`, or None."""
    done = complete_checkpoints(root)
    return done[-1] if done else None


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    return json.loads((Path(path) / STATE_FILE).read_text())


def read_optimizer_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    # weights_only: the file holds tensors, numbers and dicts only, so refuse anything that would run code.
    return torch.load(Path(path) / OPTIMIZER_FILE, map_location="cpu", weights_only=True)


def remove_partial_checkpoints(root: str | os.PathLike[str]) -> None:
    """Delete the temp directories of saves a crash cut short (each as large as a checkpoint). Only at start-up,
    when no save of this service can be in progress."""
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

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self.failures = 0

    def start(self, write: Callable[[], None]) -> None:
        """Run `write` on a new thread, after the write in flight (if any) has finished."""
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(write,), name="policy-checkpoint", daemon=True)
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except Exception:
            self.failures += 1
            log.exception("policy: a background checkpoint failed; the journal keeps the updates since the last one "
                          "on disk, and the next save tries again")

    def wait(self) -> None:
        """Return once no write is in flight."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
