"""Where a service's model runs: one rule for every service's `device` and `dtype` settings.

`dtype` names the compute dtype. A model that trains keeps float32 weights and optimizer state and runs its forward
passes under autocast in that dtype (resolve_autocast); a model that only runs forward passes is loaded in it.
"""

from __future__ import annotations

import torch


def resolve_device(name: str, key: str = "device") -> torch.device:
    """"auto" is the first GPU when there is one, else the CPU; asking for CUDA without it is an error naming `key`."""
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{key} is {name!r} but CUDA is not available; set {key}=cpu or auto")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """"auto" is bfloat16 on a GPU and float32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def resolve_autocast(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of a model that trains (its weights stay float32); None when it computes in float32."""
    compute = resolve_dtype(name, device)
    return None if compute == torch.float32 else compute


def rank_device(name: str, rank: int, key: str = "device") -> torch.device:
    """The device of training rank `rank`: on CUDA the rank's own GPU, else the one device `name` resolves to."""
    device = resolve_device(name, key)
    return torch.device("cuda", rank) if device.type == "cuda" else device
