"""Atomic, resumable policy checkpoints.

A checkpoint is a directory `<checkpoint_dir>/v<version, 8 digits>/` holding:
- the weights and tokenizer as a Hugging Face model directory (`save_pretrained`, safetensors), so a checkpoint
  loads with `from_pretrained` anywhere (evaluation, another engine, `policy.model=<path>`);
- `optimizer.pt`: AdamW state and the update count (drives the warm-up);
- `state.json`: version, the last applied idempotency key and the recent keys' recorded results, tag, time.

It is written to a hidden temp directory beside the target and renamed into place, so a crash mid-write never
leaves a partial checkpoint where `latest_checkpoint` would find it; `state.json` is written last inside it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"


def checkpoint_name(version: int) -> str:
    return f"v{version:08d}"


def save_checkpoint(
    root: str | os.PathLike[str], model: Any, tokenizer: Any, optimizer_state: dict[str, Any], state: dict[str, Any],
    keep: int | None = None,
) -> Path:
    """Write a complete checkpoint for `state["version"]` and return its directory; then, with `keep`, delete all
    but the newest `keep` complete checkpoints (the one just written is the newest unless a newer one exists)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = root / checkpoint_name(int(state["version"]))
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({**state, "saved_at": time.time()}, indent=1))
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
