"""Rollouts ahead of training (run.max_staleness): the policy service samples a version its trainer has already left,
from weights of its own in a process of its own, without waiting for the trainer; a restarted service rebuilds those
versions from its checkpoints and update journal."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from cooper.config import PolicyConfig
from cooper.runtime.durability import JOURNAL_DIR
from cooper.runtime.journal import UpdateJournal
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.errors import StaleRollout, VersionNotHeld
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


def _rollout(core: PolicyCore, seed: int, version: int) -> list[RolloutSample]:
    groups, sampled = core.generate(PROMPTS, _sampling(seed), version)
    assert sampled == version
    return [RolloutSample(c.prompt_token_ids, c.token_ids, c.logprobs) for g in groups for c in g]


REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]


def _truncated_is_weights(model: torch.nn.Module, samples: list[RolloutSample], cap: float) -> list[float]:
    """min(pi_model / pi_sampled, cap) of every completion token, from a plain forward pass per completion: the
    weights the update should use, computed without any of the trainer's code."""
    weights: list[float] = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.prompt_token_ids + s.completion_token_ids])
            logits = model(input_ids=ids).logits[0, len(s.prompt_token_ids) - 1 : -1]  # the logits predicting each
            logp = torch.log_softmax(logits.float(), -1)[torch.arange(len(s.completion_token_ids)),
                                                         torch.tensor(s.completion_token_ids)]
            weights += (logp - torch.tensor(s.rollout_logprobs)).exp().clamp(max=cap).tolist()
    return weights


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


def test_a_rollout_behind_the_trainer_is_trained_with_truncated_importance_weights(
        cores: Callable[..., PolicyCore]) -> None:
    cap = 1.2  # low enough that one update at lr 1e-2 moves some tokens' ratio past it
    ahead = cores("ahead", 1, grpo={"rollout_is_cap": cap})
    stale = _rollout(ahead, 7, version=0)
    _train(ahead, 0)  # the trainer moves on to version 1 before the rollout of version 0 is trained on
    expected = _truncated_is_weights(ahead.model, stale, cap)
    assert any(abs(w - 1) > 0.01 for w in expected)  # the weights really differ from 1 here
    metrics = ahead.train("ahead/stale", stale, REWARDS, group_size=4, sampled_version=0).metrics
    assert ahead.version == 2
    assert metrics["rollout/is_weight_mean"] == pytest.approx(sum(expected) / len(expected), abs=1e-5)
    capped = sum(w >= cap for w in expected) / len(expected)
    assert 0 < capped < 1 and metrics["rollout/is_capped_fraction"] == pytest.approx(capped, abs=1e-9)
    # The weights are in the loss, not only in the metrics: the same stale rollout under a cap no weight reaches
    # moves the model elsewhere (a loss without the weights would move both alike).
    uncapped = cores("uncapped", 1, grpo={"rollout_is_cap": 100.0})
    assert _rollout(uncapped, 7, version=0) == stale
    _train(uncapped, 0)
    uncapped.train("ahead/stale", stale, REWARDS, group_size=4, sampled_version=0)
    moved = [not torch.equal(p, q) for p, q in zip(ahead.model.parameters(), uncapped.model.parameters(), strict=True)]
    assert any(moved)
    # The same completions sampled by the trainer's own version: every weight is 1.
    fresh = _rollout(ahead, 7, version=2)
    assert ahead.train("ahead/fresh", fresh, REWARDS, group_size=4, sampled_version=2).metrics[
        "rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)


def test_the_trainer_refuses_a_rollout_too_stale_or_stale_without_its_logprobs(
        cores: Callable[..., PolicyCore]) -> None:
    ahead, synchronous = cores("ahead", 1, grpo={"rollout_is_cap": 2.0}), cores("sync", 0)
    two_behind = _rollout(ahead, 7, version=0)
    _train(ahead, 0)
    one_behind = _rollout(ahead, 8, version=1)
    _train(ahead, 1)
    weights = {n: p.detach().clone() for n, p in ahead.model.named_parameters()}
    with pytest.raises(StaleRollout, match=r"version 0, 2 versions behind the trainer's version 2; "
                                           r"run.max_staleness=1 allows at most 1"):
        ahead.train("refused/0", two_behind, REWARDS, group_size=4, sampled_version=0)
    bare = [RolloutSample(s.prompt_token_ids, s.completion_token_ids) for s in one_behind]
    with pytest.raises(StaleRollout, match="8 of its 8 completions have no sampling log-probs"):
        ahead.train("refused/1", bare, REWARDS, group_size=4, sampled_version=1)
    with pytest.raises(StaleRollout, match="version 3, but the trainer is at version 2: a version not made yet"):
        ahead.train("refused/2", one_behind, REWARDS, group_size=4, sampled_version=3)
    assert ahead.version == 2 and ahead.last_key == "ahead/1"  # nothing was applied
    assert all(torch.equal(p, weights[n]) for n, p in ahead.model.named_parameters())
    assert ahead.train("accepted", one_behind, REWARDS, group_size=4, sampled_version=1).version == 3

    _train(synchronous, 0)
    with pytest.raises(StaleRollout, match="run.max_staleness=0 allows at most 0"):
        synchronous.train("refused/3", two_behind, REWARDS, group_size=4, sampled_version=0)
