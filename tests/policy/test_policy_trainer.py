"""The GRPO update on the tiny model: exact gradient accumulation, every parameter trained, a toy task learned."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from cooper.config import PolicyConfig
from cooper.runtime.checkpoint import complete_checkpoints
from cooper.runtime.durability import JOURNAL_DIR
from cooper.runtime.journal import UpdateJournal
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import Completion, SamplingParams
from cooper.services.policy.grpo import LossSettings
from cooper.services.policy.trainer import GRPOTrainer, RolloutSample, lr_at

PROMPTS = ["Tom has 3 apples.", "Mia has 4 pens and gets 2 more.", "Sam has 9 cards.", "Zoe has 2 books."]


def _samples(groups: list[list[Completion]]) -> list[RolloutSample]:
    return [RolloutSample(c.prompt_token_ids, c.token_ids) for g in groups for c in g]


def _digit_share(text: str) -> float:
    """The toy task's rule reward: the share of characters that are digits (a 2-layer model learns it quickly)."""
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory, make_config: Callable[..., PolicyConfig]) -> PolicyCore:
    return PolicyCore(make_config(tmp_path_factory.mktemp("ckpt"), optim={"weight_decay": 0.0}))


def test_micro_batches_give_the_gradient_of_one_batch(core: PolicyCore, tokenizer: Any) -> None:
    groups, _ = core.generate(PROMPTS[:2], SamplingParams(n=4, max_new_tokens=16, stop=("a",), seed=5))
    samples = _samples(groups)
    lengths = {len(s.completion_token_ids) for s in samples}
    assert len(lengths) > 2, "want completions of different lengths, so that per-micro-batch means would differ"
    rewards = [1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.25]
    # A reference away from the policy, so that the KL term and its gradient are not zero.
    reference = copy.deepcopy(core.model).requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))

    def gradients(micro_batch_size: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        trainer = GRPOTrainer(core.model, reference, LossSettings(kl_coef=0.1), lr=1e-3,
                              micro_batch_size=micro_batch_size, pad_id=tokenizer.pad_token_id, temperature=0.8)
        metrics = trainer.accumulate_gradients(samples, rewards, group_size=4)
        return metrics, {n: p.grad.detach().clone() for n, p in core.model.named_parameters()}

    whole_metrics, whole = gradients(8)
    parts_metrics, parts = gradients(2)
    assert whole_metrics["kl"] > 0
    for name, grad in whole.items():
        assert grad.abs().max() > 0, name
        assert torch.allclose(parts[name], grad, rtol=1e-4, atol=1e-7), name
    for key in ("loss", "policy_loss", "kl", "entropy", "grad_norm", "response_length"):
        assert parts_metrics[key] == pytest.approx(whole_metrics[key], rel=1e-4), key
    core.model.zero_grad(set_to_none=True)


def test_one_train_changes_every_trainable_parameter(core: PolicyCore) -> None:
    groups, _ = core.generate(PROMPTS[:2], SamplingParams(n=4, max_new_tokens=8, seed=11))
    samples = _samples(groups)
    rewards = [float(i % 2) for i in range(len(samples))]
    before = {n: p.detach().clone() for n, p in core.model.named_parameters() if p.requires_grad}
    result = core.train("params/0", samples, rewards, group_size=4)
    assert not result.replayed and result.version == 1
    # weight_decay is 0 here, so any change comes from the GRPO gradient, not from the decay.
    unchanged = [n for n, p in core.model.named_parameters() if p.requires_grad and torch.equal(p, before[n])]
    assert unchanged == []
    expected = {"loss", "policy_loss", "kl", "clip_fraction", "grad_norm", "entropy", "response_length", "lr"}
    assert expected <= set(result.metrics)
    assert result.metrics["clip_fraction"] == 0.0  # one epoch, old_logp recomputed: ratio exactly 1
    assert result.metrics["response_length"] == pytest.approx(sum(len(s.completion_token_ids) for s in samples) / 8)


def test_rollout_is_checked(core: PolicyCore) -> None:
    groups, _ = core.generate(PROMPTS[:2], SamplingParams(n=2, max_new_tokens=4, seed=1))
    samples = _samples(groups)
    with pytest.raises(ValueError, match="at least 2"):
        core.train("bad/1", samples, [0.0] * 4, group_size=1)
    with pytest.raises(ValueError, match="one reward per completion"):
        core.train("bad/2", samples, [0.0] * 3, group_size=2)
    with pytest.raises(ValueError, match="grouped by prompt"):
        core.train("bad/3", [samples[0], samples[2], samples[1], samples[3]], [0.0, 1.0, 0.0, 1.0], group_size=2)
    with pytest.raises(ValueError, match="token id outside"):
        core.train("bad/4", [RolloutSample([1], [10**6]), RolloutSample([1], [5])], [0.0, 1.0], group_size=2)


def test_warmup_rises_linearly_then_stays() -> None:
    assert [lr_at(u, 1.0, 4) for u in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_at(0, 1e-6, 0) == 1e-6


def test_thirty_updates_raise_the_reward_of_a_rule(tmp_path: Path, make_config: Callable[..., PolicyConfig]
                                                   ) -> None:
    core = PolicyCore(make_config(tmp_path, optim={"lr": 1e-2}))
    sampling = SamplingParams(n=8, temperature=1.0, max_new_tokens=8)
    means = []
    for step in range(30):
        groups, _ = core.generate(PROMPTS, SamplingParams(**{**sampling.__dict__, "seed": step}))
        rewards = [_digit_share(c.text) for g in groups for c in g]
        means.append(sum(rewards) / len(rewards))
        core.train(f"toy/{step}", _samples(groups), rewards, group_size=8)
    first, last = sum(means[:5]) / 5, sum(means[-5:]) / 5
    assert last > first + 0.3, f"mean reward went from {first:.2f} to {last:.2f}: {means}"


def test_reference_only_with_kl_and_periodic_checkpoints(tmp_path: Path,
                                                         make_config: Callable[..., PolicyConfig]) -> None:
    assert PolicyCore(make_config(tmp_path / "a", grpo={"kl_coef": 0.0, "track_kl": False})).reference is None
    core = PolicyCore(make_config(tmp_path / "b", grpo={"kl_coef": 0.001}, save_every=2))
    assert core.reference is not None
    assert not any(p.requires_grad for p in core.reference.parameters())
    reference = {n: p.clone() for n, p in core.reference.named_parameters()}
    for step in range(3):
        groups, _ = core.generate(PROMPTS[:2], SamplingParams(n=2, max_new_tokens=6, seed=step))
        result = core.train(f"kl/{step}", _samples(groups), [0.0, 1.0, 1.0, 0.0], group_size=2)
    assert result.metrics["kl"] > 0  # the policy moved away from the frozen reference...
    assert math.isfinite(result.metrics["kl_seq"])  # a k1 estimate: unbiased, but one batch may fall below 0
    assert all(torch.equal(p, reference[n]) for n, p in core.reference.named_parameters())  # ...which stayed put
    core.wait_for_saves()  # periodic checkpoints are written in the background
    assert [p.name for p in complete_checkpoints(tmp_path / "b")] == ["v00000002"]  # every 2 updates, not at 1 or 3
    assert UpdateJournal(tmp_path / "b" / JOURNAL_DIR).versions() == [3]  # only what the checkpoint lacks


def test_kl_is_measured_without_being_optimised(tmp_path: Path, make_config: Callable[..., PolicyConfig]) -> None:
    """kl_coef 0 with track_kl: the reference is loaded and the KL reported, but the update is the same as without."""
    tracked = PolicyCore(make_config(tmp_path / "a", grpo={"kl_coef": 0.0, "track_kl": True}))
    plain = PolicyCore(make_config(tmp_path / "b", grpo={"kl_coef": 0.0, "track_kl": False}))
    assert tracked.reference is not None
    for step in range(3):
        groups, _ = tracked.generate(PROMPTS[:2], SamplingParams(n=2, max_new_tokens=6, seed=step))
        metrics = tracked.train(f"t/{step}", _samples(groups), [0.0, 1.0, 1.0, 0.0], group_size=2).metrics
        other = plain.train(f"t/{step}", _samples(groups), [0.0, 1.0, 1.0, 0.0], group_size=2).metrics
        if step == 0:  # nothing has moved yet: the policy is its reference
            assert metrics["kl"] == pytest.approx(0.0, abs=1e-6) and metrics["kl_seq"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["kl"] > 0 and math.isfinite(metrics["kl_seq"]) and "kl_seq" not in other and other["kl"] == 0.0
    for (name, p), q in zip(tracked.model.named_parameters(), plain.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


def test_rollout_mismatch_is_measured_and_truncated_importance_sampling_scales_the_loss(core: PolicyCore,
                                                                                       tokenizer: Any) -> None:
    groups, _ = core.generate(PROMPTS[:2], SamplingParams(n=4, max_new_tokens=8, seed=9))
    engine = [RolloutSample(c.prompt_token_ids, c.token_ids, c.logprobs) for g in groups for c in g]
    rewards = [1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.25]
    tokens = sum(len(s.completion_token_ids) for s in engine)

    def run(samples: list[RolloutSample], cap: float | None) -> tuple[dict[str, float], list[torch.Tensor]]:
        trainer = GRPOTrainer(core.model, None, LossSettings(kl_coef=0.0, rollout_is_cap=cap), lr=1e-3,
                              pad_id=tokenizer.pad_token_id)
        metrics = trainer.accumulate_gradients(samples, rewards, group_size=4)
        grads = [p.grad.detach().clone() for p in core.model.parameters()]
        core.model.zero_grad(set_to_none=True)
        return metrics, grads

    # The transformers engine reports the trainer's own distribution: the mismatch is rounding.
    metrics, plain = run(engine, None)
    assert metrics["rollout/tokens_compared"] == tokens
    assert metrics["rollout/logprob_abs_diff"] < 1e-5 and abs(metrics["rollout/kl"]) < 1e-6
    assert "rollout/is_weight_mean" not in metrics
    # An engine that found every token 0.3 nats less likely than pi_old: |diff| 0.3, k3 KL exp(0.3) - 1.3.
    shifted = [RolloutSample(s.prompt_token_ids, s.completion_token_ids, [lp - 0.3 for lp in s.rollout_logprobs])
               for s in engine]
    metrics, _ = run(shifted, None)
    assert metrics["rollout/logprob_abs_diff"] == pytest.approx(0.3, abs=1e-4)
    assert metrics["rollout/kl"] == pytest.approx(math.exp(0.3) - 1.3, abs=1e-4)
    # Weights min(exp(0.3), C): C = 1.2 caps every token, C = 2 none; without a KL term the gradient scales by them.
    for cap, weight, capped in ((1.2, 1.2, 1.0), (2.0, math.exp(0.3), 0.0)):
        metrics, grads = run(shifted, cap)
        assert metrics["rollout/is_weight_mean"] == pytest.approx(weight, rel=1e-4)
        assert metrics["rollout/is_capped_fraction"] == capped
        for g, p in zip(grads, plain, strict=True):
            assert torch.allclose(g, weight * p, rtol=1e-3, atol=1e-7)
    # No log-probs sent (an older client): nothing measured, nothing weighted.
    bare = [RolloutSample(s.prompt_token_ids, s.completion_token_ids) for s in engine]
    metrics, grads = run(bare, 1.2)
    assert not [k for k in metrics if k.startswith("rollout/")]
    assert all(torch.allclose(g, p, rtol=1e-5, atol=1e-8) for g, p in zip(grads, plain, strict=True))


def test_only_the_newest_checkpoints_are_kept_and_the_newest_resumes(tmp_path: Path,
                                                                    make_config: Callable[..., PolicyConfig]) -> None:
    config = make_config(tmp_path, save_every=1, keep_checkpoints=2, grpo={"kl_coef": 0.0, "track_kl": False})
    core = PolicyCore(config)
    for step in range(5):
        groups, _ = core.generate(PROMPTS[:2], SamplingParams(n=2, max_new_tokens=6, seed=step))
        core.train(f"keep/{step}", _samples(groups), [0.0, 1.0, 1.0, 0.0], group_size=2)
        core.wait_for_saves()
        kept = [p.name for p in complete_checkpoints(tmp_path)]
        assert kept == [f"v{v:08d}" for v in range(max(1, step), step + 2)]  # never more than 2, the newest always
    resumed = PolicyCore(config)
    assert resumed.version == 5 and resumed.last_key == "keep/4"
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), core.model.parameters(), strict=True))
