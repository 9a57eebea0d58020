"""Loading the policy's models: the weights to train, the frozen reference, and the dtype forward passes run in.

Shared by the service process (`core.py`) and the training ranks it spawns (`ranks.py`), which load the same
models for their shards.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM

from cooper.config import PolicyConfig


def resolve_autocast(dtype: str, device: torch.device) -> torch.dtype | None:
    """None = plain float32; else the autocast dtype (weights stay float32, see config.PolicyConfig.dtype)."""
    if dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def load_causal_lm(path: str, dtype: torch.dtype, device: torch.device) -> Any:
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as err:
        raise RuntimeError(
            f"cannot load a causal LM from {path!r} ({err}); set policy.model to a local model directory, a "
            "Hub id available offline, or 'tiny'"
        ) from err
    return model.to(device).eval()


def load_reference(cfg: PolicyConfig, initial_path: str, autocast: torch.dtype | None, device: torch.device
                   ) -> Any | None:
    """The frozen *initial* policy, never a checkpoint: the KL anchors the run to where it started. It has no
    optimizer, so it may live in the compute dtype. None when the KL is neither optimised nor tracked."""
    if not (cfg.grpo.kl_coef > 0 or cfg.grpo.track_kl):
        return None
    reference = load_causal_lm(initial_path, autocast or torch.float32, device)
    reference.requires_grad_(False)
    return reference
