"""Loading the policy's frozen reference (the weights to train load with cooper.runtime.models.load_causal_lm, the
dtype forward passes run in comes from cooper.runtime.devices.resolve_autocast).

Shared by the service process (`core.py`) and the training ranks it spawns (`ranks/`), which load the same
models for their shards.
"""

from __future__ import annotations

from typing import Any

import torch

from cooper.config import PolicyConfig
from cooper.runtime.models import load_causal_lm


def load_reference(cfg: PolicyConfig, initial_path: str, autocast: torch.dtype | None, device: torch.device
                   ) -> Any | None:
    """The frozen *initial* policy, never a checkpoint: the KL anchors the run to where it started. It has no
    optimizer, so it may live in the compute dtype. None when the KL is neither optimised nor tracked."""
    if not (cfg.grpo.kl_coef > 0 or cfg.grpo.track_kl):
        return None
    reference = load_causal_lm(initial_path, autocast or torch.float32, device)
    reference.requires_grad_(False)
    return reference
