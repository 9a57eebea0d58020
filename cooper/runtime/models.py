"""Model names -> model directories, one rule for every service's `model` setting.

A name is a Hub id or a local directory, used as given, unless a preset registered it: then it names a model that
the preset builds on this machine on first use and caches (`build_once`). The tiny preset (cooper/tiny/) registers
its names ("tiny", "tiny-sft", "tiny-rm", ...) when `cooper` is imported, so a service resolves them without
importing the preset itself. Torch and transformers are imported only by the loaders (load_causal_lm): the CLI
and the orchestrator resolve names before any model loads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ModelBuilder = Callable[[str], Path]
"""Builds (or finds cached) the model of one registered name for a kind ("causal" or "reward"): its directory."""

BUILDERS: dict[str, ModelBuilder] = {}
"""Registered names and their builders; filled by register_models."""


def register_models(builders: Mapping[str, ModelBuilder]) -> None:
    """Make each name resolve to what its builder builds. A name registered twice keeps the later builder."""
    BUILDERS.update(builders)


def builds_locally(name: str) -> bool:
    """True when `name` is a registered model, built on this machine, rather than a Hub id or a directory."""
    return name in BUILDERS


def resolve_model(name: str, kind: str) -> str:
    """The directory of a registered model of `kind` ("causal" or "reward"), built first if need be; any other name
    (Hub id, local directory) as given."""
    builder = BUILDERS.get(name)
    return name if builder is None else str(builder(kind))


def cache_root() -> Path:
    """$COOPER_CACHE, else ~/.cache/cooper."""
    return Path(os.environ.get("COOPER_CACHE", Path.home() / ".cache" / "cooper"))


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """`target`, built by `build(directory)` unless a complete build is there already. The build goes to a temp
    directory beside it and is renamed into place, so several processes may ask at once: the first rename wins,
    and a directory without its `.complete` marker is never returned."""
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        (tmp / ".complete").touch()
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / ".complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_causal_lm(path: str, dtype: torch.dtype, device: torch.device) -> Any:
    """A causal LM from a directory or Hub id, in `dtype` on `device`, in eval mode; an error that says what to set
    when it does not load."""
    from transformers import AutoModelForCausalLM

    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as err:
        raise RuntimeError(
            f"cannot load a causal LM from {path!r} ({err}); set policy.model to a local model directory, a "
            "Hub id available offline, or 'tiny'"
        ) from err
    return model.to(device).eval()
