"""Shared by the reward tests: a small config, preference pairs and items of varied length from the tiny task."""

from __future__ import annotations

import random
from pathlib import Path

from cooper.config import BatchingConfig, HttpConfig, OptimConfig, RewardConfig, RewardServerConfig
from cooper.services.reward.verify_rm import PreferencePair, ScoreItem
from cooper.tiny.task import make_split, wrong_solution


def tiny_pairs(n: int, seed: int = 0) -> list[PreferencePair]:
    rng = random.Random(seed)
    return [PreferencePair(p.question, p.answer, p.solution, wrong_solution(p, rng))
            for p in make_split(n, seed, "reward-test")]


def tiny_items(n: int, seed: int = 0) -> list[ScoreItem]:
    """Items of varied length (filler before the solution), so that batches need padding."""
    rng = random.Random(seed)
    items = []
    for i, p in enumerate(make_split(n, seed, "reward-items")):
        completion = p.solution if i % 2 else wrong_solution(p, rng)
        items.append(ScoreItem(p.question, p.answer, "Let me see. " * rng.randint(0, 8) + completion))
    return items


def make_config(tmp_path: Path, **overrides) -> RewardConfig:  # type: ignore[no-untyped-def]
    """A reward config for tests: free ports, checkpoints under tmp_path, a learning rate a tiny model notices."""
    base = {
        "server": RewardServerConfig(port=0, metrics_port=None),
        "http": HttpConfig(port=0),
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "optim": OptimConfig(lr=3e-3, micro_batch_size=8),
        "batching": BatchingConfig(max_wait_ms=2),
        "device": "cpu",
        "model_process": False,  # the model on a thread, so that tests can look inside it (test_model_process.py)
    }
    base.update(overrides)
    return RewardConfig(**base)
