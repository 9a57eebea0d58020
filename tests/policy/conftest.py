"""Fixtures of the policy tests: the tiny causal LM, one torch thread, policy configs in temp directories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from cooper.config import PolicyConfig


@pytest.fixture(autouse=True, scope="package")
def one_torch_thread() -> Iterator[None]:
    # The tiny model's ops are too small for two threads to help, and on a busy 2-core machine threads that wait
    # for each other make every step several times slower. Restored after, for the other packages' tests.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from cooper.runtime.models import resolve_model

    return resolve_model("tiny", "causal")


@pytest.fixture(scope="session")
def tokenizer(tiny_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


def _policy_config(checkpoint_dir: Path, **overrides: Any) -> PolicyConfig:
    tree: dict[str, Any] = {
        "model": "tiny",
        "device": "cpu",
        "checkpoint_dir": str(checkpoint_dir),
        "torch_threads": 1,
        "server": {"port": 0, "metrics_port": None},  # free ports: tests run beside other services
        "sampling": {"n": 4, "temperature": 1.0, "max_new_tokens": 8},
        "optim": {"lr": 1e-2, "warmup_steps": 0, "micro_batch_size": 16},
        "grpo": {"kl_coef": 0.0},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            tree[key] = {**tree[key], **value}
        else:
            tree[key] = value
    return PolicyConfig.model_validate(tree)


@pytest.fixture(scope="session")
def make_config() -> Callable[..., PolicyConfig]:
    """make_config(checkpoint_dir, **overrides): a small, fast policy config on CPU; overrides merge into the
    section (nested dicts merge one level deep)."""
    return _policy_config
