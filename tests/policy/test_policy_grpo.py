"""The GRPO loss against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from cooper.services.policy.grpo import (
    LossSettings,
    group_advantages,
    grpo_loss,
    grpo_loss_sums,
    k3_kl,
    ppo_token_losses,
    rollout_is_weights,
    token_entropy,
    token_logprobs,
)


def test_group_advantages_use_unbiased_std_per_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0, 0.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, group_size=4)
    # Group 1: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5.
    expected_first = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-6)
    assert torch.allclose(adv[:4], expected_first, atol=1e-6)
    # Group 2: no spread, no signal.
    assert torch.equal(adv[4:8], torch.zeros(4))
    # Group 3: mean 0.75, std 0.5 again.
    assert torch.allclose(adv[8:], torch.tensor([-0.75, 0.25, 0.25, 0.25]) / (0.5 + 1e-6), atol=1e-6)


def test_group_of_two_and_bad_group_sizes() -> None:
    adv = group_advantages(torch.tensor([0.0, 1.0]), group_size=2)
    # mean 0.5, unbiased std sqrt(0.5): A = +-0.5 / sqrt(0.5) (the biased std 0.5 would give +-1).
    assert torch.allclose(adv, torch.tensor([-0.5, 0.5]) / (math.sqrt(0.5) + 1e-6))
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages(torch.tensor([1.0, 0.0]), group_size=1)
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0]), group_size=4)


# One token per case: (advantage, log-ratio logp - old_logp) -> (expected loss, clipped?).
CASES = [
    (1.0, math.log(1.5), -1.2, True),  # A > 0, ratio above 1 + 0.2: clipped at 1.2
    (1.0, math.log(0.5), -0.5, False),  # A > 0, ratio below 1 - 0.2: unclipped (pessimistic side)
    (-1.0, math.log(0.5), 0.8, True),  # A < 0, ratio below 0.8: clipped at 0.8
    (-1.0, math.log(5.0), 3.0, True),  # A < 0, ratio 5: PPO gives 5, the dual clip caps it at 3 = c * |A|
    (-2.0, math.log(2.0), 4.0, False),  # A < 0, ratio 2: PPO 4 is under the cap 6, so it stands
    (1.0, 50.0, -1.2, True),  # log-ratio 50 clamped to 20 first: no inf/nan, clipped at 1.2
]


def test_ppo_token_losses_with_clip_and_dual_clip() -> None:
    adv = torch.tensor([[c[0] for c in CASES]])
    old = torch.full_like(adv, -2.0)
    logp = (old + torch.tensor([[c[1] for c in CASES]])).requires_grad_(True)
    loss, clipped = ppo_token_losses(logp, old, adv, LossSettings())
    assert torch.allclose(loss, torch.tensor([[c[2] for c in CASES]]), atol=1e-5)
    assert clipped.tolist() == [[c[3] for c in CASES]]
    loss.sum().backward()
    # Clipped tokens (PPO or dual) pass no gradient; unclipped ones pass d(-A * ratio)/dlogp = -A * ratio.
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5, 0.0, 0.0, 4.0, 0.0]]), atol=1e-5)


def test_k3_kl_value_and_clamps() -> None:
    logp = torch.tensor([-1.0, -1.0, -1.0, -1.0, -40.0])
    ref = torch.tensor([-1.0, -0.5, -31.0, 29.0, -1.0])
    kl = k3_kl(logp, ref)
    d = 0.5
    assert kl[0] == 0.0
    assert torch.isclose(kl[1], torch.tensor(math.exp(d) - d - 1))
    # ref - logp = -30 -> clamped to -20 -> exp(-20) + 20 - 1 = 19.000... -> value clamped to 10.
    assert kl[2] == 10.0
    # ref - logp = 30 -> clamped to 20 -> e^20 - 21 -> clamped to 10; no inf.
    assert kl[3] == 10.0
    # ref - logp = 39 -> clamped to 20 -> clamped to 10.
    assert kl[4] == 10.0
    # Without the value clamp the log-ratio clamp alone bounds it: exp(-20) + 20 - 1.
    assert torch.isclose(k3_kl(logp[2:3], ref[2:3], kl_clamp=100.0), torch.tensor([19.0 + math.exp(-20)]))


def test_grpo_loss_is_token_mean_over_the_batch_plus_kl() -> None:
    settings = LossSettings(kl_coef=0.5)
    # Two sequences of 3 and 1 tokens; the padded tokens carry absurd values that the mask must drop.
    old = torch.zeros(2, 3)
    logp = torch.tensor([[math.log(1.5), 0.0, math.log(0.5)], [math.log(5.0), 99.0, 99.0]])
    ref = torch.tensor([[0.0, 0.5, 0.0], [math.log(5.0), -99.0, -99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    # Per token: seq 1 (A = 1): ratios 1.5 -> -1.2, 1 -> -1, 0.5 -> -0.5; seq 2 (A = -1): ratio 5 -> dual clip 3.
    policy = (-1.2 - 1.0 - 0.5 + 3.0) / 4
    kl_tokens = [
        math.exp(-math.log(1.5)) + math.log(1.5) - 1,
        math.exp(0.5) - 0.5 - 1,
        math.exp(-math.log(0.5)) + math.log(0.5) - 1,
        0.0,
    ]
    expected = policy + 0.5 * sum(kl_tokens) / 4
    assert math.isclose(float(grpo_loss(logp, old, adv, mask, settings, ref)), expected, rel_tol=1e-5)
    sums = grpo_loss_sums(logp, old, adv, mask, settings, ref)
    assert sums.tokens == 4 and sums.clipped == 2  # ratio 1.5 with A > 0 (clip) and ratio 5 with A < 0 (dual)
    assert math.isclose(sums.policy_loss / 4, policy, rel_tol=1e-5)
    # kl_coef 0: the reference is ignored even when given.
    no_kl = grpo_loss(logp, old, adv, mask, LossSettings(kl_coef=0.0), ref)
    assert math.isclose(float(no_kl), policy, rel_tol=1e-5)


def test_logprobs_and_entropy_use_the_temperature() -> None:
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    tokens = torch.tensor([[0]])
    for t in (1.0, 0.5):
        probs = torch.softmax(logits / t, dim=-1)
        assert torch.isclose(token_logprobs(logits, tokens, t)[0, 0], probs[0, 0, 0].log())
        assert torch.isclose(token_entropy(logits, t)[0, 0], -(probs * probs.log()).sum())
    uniform = torch.zeros(1, 1, 8)
    assert torch.isclose(token_entropy(uniform)[0, 0], torch.tensor(math.log(8)))


def test_truncated_importance_weights_on_known_inputs() -> None:
    old = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9)]])
    rollout = torch.tensor([[math.log(0.25), math.log(0.4), math.log(0.1)]])
    # pi_old / pi_rollout = 2, 0.5, 9 -> capped at 3: 2, 0.5, 3.
    weights = rollout_is_weights(old, rollout, cap=3.0)
    assert torch.allclose(weights, torch.tensor([[2.0, 0.5, 3.0]]), atol=1e-5)
    assert not weights.requires_grad
    # They scale each token's policy loss (not the KL): with ratio 1 and A = 1 the per-token loss is -1.
    logp = old.clone().requires_grad_(True)
    mask = torch.ones(1, 3)
    ref = old - 0.1
    plain = grpo_loss_sums(logp, old, torch.tensor([1.0]), mask, LossSettings(kl_coef=0.5), ref)
    weighted = grpo_loss_sums(logp, old, torch.tensor([1.0]), mask, LossSettings(kl_coef=0.5), ref, weights)
    assert math.isclose(plain.policy_loss, -3.0, rel_tol=1e-5)
    assert math.isclose(weighted.policy_loss, -(2.0 + 0.5 + 3.0), rel_tol=1e-5)
    assert math.isclose(weighted.kl, plain.kl, rel_tol=1e-6)
    weighted.loss.backward()
    # d/dlogp of -w * exp(logp - old) at logp = old is -w (plus the KL term's, the same as without weights).
    kl_grad = torch.autograd.grad(plain.loss, logp)[0] + 1.0
    assert torch.allclose(logp.grad - kl_grad, -weights, atol=1e-5)
