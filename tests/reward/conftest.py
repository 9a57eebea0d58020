"""Fixtures of the reward service tests: the tiny VerifyRM."""

from __future__ import annotations

import pytest

from cooper.config import OptimConfig
from cooper.runtime.models import resolve_model
from cooper.services.reward.verify_rm import VerifyRM


@pytest.fixture(scope="session")
def tiny_rm_dir() -> str:
    return resolve_model("tiny", "reward")


@pytest.fixture
def rm(tiny_rm_dir: str) -> VerifyRM:
    return VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=8), device="cpu")
