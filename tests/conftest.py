"""Shared fixtures. Tiny models are cached under .pytest_cache/ so a test session builds them once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("COOPER_CACHE", str(ROOT / ".pytest_cache" / "cooper"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def verifier_service():
    """A real verifier service process on loopback (2 workers, 2 s timeout), shared by the session."""
    from cooper.runtime.processes import start_service

    service = start_service("verifier", overrides=["verifier.workers=2", "verifier.timeout_s=2"])
    yield service
    service.stop()


@pytest.fixture(scope="session")
def verifier_address(verifier_service) -> str:
    return verifier_service.address
