"""Rollouts ahead of training (run.max_staleness): the policy service samples a version its trainer has already left,
from weights of its own in a process of its own, without waiting for the trainer; a restarted service rebuilds those
versions from its checkpoints and update journal."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cooper.config import PolicyConfig
from cooper.runtime.durability import JOURNAL_DIR
from cooper.runtime.journal import UpdateJournal
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.errors import VersionNotHeld
from cooper.services.policy.trainer import RolloutSample

PROMPTS = ["What is 2+3?", "Add 4 and 5."]


def _sampling(seed: int) -> SamplingParams:
    return SamplingParams(n=4, max_new_tokens=6, seed=seed)


def _tokens(core: PolicyCore, seed: int, version: int | None = None) -> list[list[int]]:
    groups, sampled = core.generate(PROMPTS, _sampling(seed), version)
    assert version is None or sampled == version
    return [c.token_ids for group in groups for c in group]


def _train(core: PolicyCore, step: int) -> None:
    groups, _ = core.generate(PROMPTS, _sampling(1000 + step), core.version)
    samples = [RolloutSample(c.prompt_token_ids, c.token_ids, c.logprobs) for g in groups for c in g]
    core.train(f"ahead/{step}", samples, [float((step + i) % 3 == 0) for i in range(len(samples))], group_size=4)


@pytest.fixture
def cores(tmp_path: Path, make_config: Callable[..., PolicyConfig]) -> Iterator[Callable[..., PolicyCore]]:
    """cores(name, behind, **overrides): PolicyCores, each closed (its rollout process stopped) after the test."""
    made: list[PolicyCore] = []

    def make(name: str, behind: int, **overrides: object) -> PolicyCore:
        made.append(PolicyCore(make_config(tmp_path / name, **overrides), behind=behind))
        return made[-1]

    yield make
    for core in made:
        core.close()


def test_a_version_the_trainer_left_is_sampled_as_it_was(cores: Callable[..., PolicyCore]) -> None:
    synchronous, ahead = cores("sync", 0), cores("ahead", 1)
    assert ahead.engine.process.is_alive()  # the rollout process: the transformers engine, beside the trainer
    seen = {}
    for step in range(3):
        seen[step] = _tokens(synchronous, 100 + step)
        assert _tokens(ahead, 100 + step, version=step) == seen[step]  # the same weights, sampled elsewhere
        _train(synchronous, step)
        _train(ahead, step)
    assert ahead.version == synchronous.version == 3
    assert _tokens(ahead, 102, version=2) == seen[2]  # left by the trainer, kept: its weights exactly
    assert _tokens(ahead, 103, version=3) == _tokens(synchronous, 103)
    for version in (1, 4):  # too far behind (one version is kept) or not made yet
        with pytest.raises(VersionNotHeld, match=f"version {version} is not held.*trainer is at version 3"):
            ahead.generate(PROMPTS, _sampling(0), version)
    with pytest.raises(VersionNotHeld, match="keeps no other"):
        synchronous.generate(PROMPTS, _sampling(0), 2)


def test_sampling_a_kept_version_does_not_wait_for_the_trainer(cores: Callable[..., PolicyCore]) -> None:
    ahead = cores("ahead", 1)
    _train(ahead, 0)
    done: dict[int, threading.Event] = {v: threading.Event() for v in (0, 1)}

    def sample(version: int) -> None:
        _tokens(ahead, 7, version)
        done[version].set()

    with ahead._lock:  # what a Train holds for as long as it updates
        threading.Thread(target=sample, args=(0,), daemon=True).start()
        assert done[0].wait(timeout=120), "sampling the kept version 0 waited for the trainer"
        threading.Thread(target=sample, args=(1,), daemon=True).start()
        assert not done[1].wait(timeout=1.0)  # the trainer's own version: loaded once the update is over
    assert done[1].wait(timeout=120)


def test_a_restarted_service_rebuilds_the_version_behind_its_trainer(cores: Callable[..., PolicyCore]) -> None:
    settings = {"save_every": 2, "keep_checkpoints": 2}
    ahead = cores("ahead", 1, **settings)
    for step in range(4):
        _train(ahead, step)
    before = _tokens(ahead, 5, version=3)
    ahead.wait_for_saves()
    # Checkpoints v2 and v4 are on disk; the journal keeps updates 3 and 4, so that version 3 can be rebuilt (one
    # version behind). A service that keeps nothing behind prunes it once v4 is written.
    journal = UpdateJournal(Path(ahead.cfg.checkpoint_dir) / JOURNAL_DIR)
    assert journal.versions() == [3, 4]
    ahead.engine.close()  # what a SIGKILL leaves: no save on stop

    resumed = cores("ahead", 1, **settings)
    assert resumed.version == 4
    assert _tokens(resumed, 5, version=3) == before
    with pytest.raises(VersionNotHeld):
        resumed.generate(PROMPTS, _sampling(0), 2)
