"""VerifyRM checkpoints: a directory per saved state, written to a temp name and renamed into place.

A checkpoint is a loadable transformers model directory (safetensors weights, config, tokenizer) plus
`optimizer.pt` (AdamW and scheduler state) and `cooper_state.json` (version, applied-update count, last applied
idempotency key, recorded Update results, tag). Its name, `v<version>-u<updates>`, is unique per state, so a save
is a single atomic rename and never overwrites a checkpoint a reader may be loading; saving an unchanged state
again returns the existing directory. Start-up picks the newest complete one. Read replicas (reward.role=replica)
only read: they list the directory for a newer complete checkpoint and load its weights (read_weights) while the
trainer may be writing the next one or deleting old ones.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from cooper.services.reward.verify_rm import VerifyRM

STATE_FILE = "cooper_state.json"
OPTIMIZER_FILE = "optimizer.pt"
_NAME = re.compile(r"^v(\d+)-u(\d+)$")


def checkpoint_name(version: int, updates: int) -> str:
    return f"v{version:08d}-u{updates:08d}"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under root, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append(((int(match[1]), int(match[2])), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def save_checkpoint(rm: VerifyRM, root: str | Path, state: dict[str, Any], keep: int) -> Path:
    """Write rm and `state` (must hold "version" and "updates") under root; keep the newest `keep` checkpoints."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = root / checkpoint_name(state["version"], state["updates"])
    if target.exists():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        rm.model.save_pretrained(tmp, safe_serialization=True)
        rm.tokenizer.save_pretrained(tmp)
        torch.save(rm.optimizer_state(), tmp / OPTIMIZER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))  # written last: marks the directory complete
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def read_state(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / STATE_FILE).read_text())


def load_optimizer(rm: VerifyRM, path: str | Path) -> None:
    rm.load_optimizer_state(torch.load(Path(path) / OPTIMIZER_FILE, map_location=rm.device, weights_only=True))


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's safetensors files (one, or the shards save_pretrained writes), on the CPU."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint {path} has no .safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(file, device="cpu"))
    return tensors


def remove_partial(root: str | Path) -> None:
    """Delete temp directories left by a save that crashed."""
    root = Path(root)
    if root.is_dir():
        for path in root.glob(".tmp-*"):
            shutil.rmtree(path, ignore_errors=True)
