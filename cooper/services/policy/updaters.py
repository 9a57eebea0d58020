"""Where the policy's updates run: a trainer in the service's process, or, with policy.world_size > 1, a group of
training ranks that hold the sharded weights, optimizer and reference (ranks/). PolicyCore asks for one at start-up,
after a Restore and after the ranks failed; what it asks is here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from cooper.config import PolicyConfig
from cooper.runtime.checkpoint import read_optimizer_state
from cooper.runtime.models import load_causal_lm
from cooper.services.policy.placement import Placement
from cooper.services.policy.trainer import GRPOTrainer, PolicyUpdater


def resolve_world_size(world_size: int | str, device: torch.device, place: Placement | None = None) -> int:
    """policy.world_size as a number of ranks; more ranks than devices is an error that says what to change. Under a
    launcher (`place`) the group is the launcher's: policy.world_size is auto, 1 (the default) or its WORLD_SIZE."""
    if place is not None:
        if world_size not in ("auto", 1, place.world_size):
            raise RuntimeError(f"policy.world_size is {world_size} but the launcher started {place.world_size} ranks "
                               "(WORLD_SIZE); set policy.world_size=auto under torchrun")
        ranks, here = place.world_size, place.local_world_size
    elif world_size == "auto":
        return torch.cuda.device_count() if device.type == "cuda" else 1
    else:
        ranks = here = int(world_size)
    node = f" ({here} on this node)" if place is not None else ""
    if device.type == "cuda" and here > torch.cuda.device_count():
        raise RuntimeError(
            f"policy.world_size is {ranks}{node} but {torch.cuda.device_count()} CUDA devices are visible; lower "
            "policy.world_size (or set it to auto) or give the service more GPUs (compose: POLICY_GPUS, Kubernetes: "
            "the pod's nvidia.com/gpu)"
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if device.type == "cpu" and here > cores:
        raise RuntimeError(
            f"policy.world_size is {ranks}{node} but only {cores} CPU cores are available to run the ranks on; "
            "lower policy.world_size"
        )
    return ranks


def new_updater(cfg: PolicyConfig, world_size: int, model: Any, reference: Any | None, pad_token_id: int,
                autocast: torch.dtype | None, place: Placement | None, weights_path: str, initial_path: str,
                checkpoint: Path | None) -> PolicyUpdater:
    """The updater of `model` (loaded from `weights_path`), with the optimizer state of `checkpoint` (None: a fresh
    optimizer): a trainer in this process, or with `world_size` > 1 the ranks, which load their shards of
    `checkpoint` themselves; `model` stays rank 0's full copy, which the engine samples from and checkpoints save
    (ranks/group.py)."""
    if world_size == 1:
        trainer = GRPOTrainer.from_config(model, reference, cfg, pad_token_id, autocast)
        if checkpoint:
            trainer.load_optimizer_state(read_optimizer_state(checkpoint))
        return trainer
    # Imported here only: FSDP's modules take about a second to import, which one rank never needs.
    from cooper.services.policy.ranks.control import RankSpec
    from cooper.services.policy.ranks.group import RankGroup

    spec = RankSpec(cfg, world_size, weights_path, initial_path, str(checkpoint) if checkpoint else None, pad_token_id)
    return RankGroup(spec, model, place)


def load_weights_in_place(model: Any, weights_path: str) -> None:
    """The weights of `weights_path` into `model` in place: the engine and the ranks keep its module."""
    fresh = load_causal_lm(weights_path, torch.float32, torch.device("cpu"))
    model.load_state_dict(fresh.state_dict())
    del fresh
