"""Where a service's model runs: one rule for every service's `device` and `dtype` settings."""

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
