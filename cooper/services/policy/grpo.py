"""The GRPO loss of docs/design.md section 2.1, in plain torch (no service code, no model code).

Formulas follow the paper's released code (verl's `compute_policy_loss` and its `low_var_kl`):

- group advantages `A_i = (r_i - mean(r)) / (std(r) + eps)` per prompt group, unbiased std, one value per
  completion, broadcast over its tokens;
- ratio `exp(clamp(logp - old_logp, -20, 20))`, PPO clip to `[1 - clip_low, 1 + clip_high]`, and the dual clip:
  for negative advantages the loss is capped at `-c * A`, so one token whose ratio exploded cannot dominate;
- k3 KL to the frozen reference `exp(ref - logp) - (ref - logp) - 1`, the log-ratio clamped to [-20, 20] and the
  value to [-10, 10]: unbiased, always >= 0 and of low variance, unlike `logp - ref`;
- token-mean over every completion token of the batch (not per sequence first), so long and short completions
  weigh the same per token.

Left out: per-sequence or "seq-mean-token-sum" aggregations, entropy bonus, value baselines; the paper uses none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """[N] rewards, grouped by prompt (`group_size` consecutive entries each) -> [N] advantages.

    A group whose rewards are all equal gets zero advantages: it says nothing about which completion is better.
    """
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 (got {group_size}): a group of one has no relative signal")
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    groups = rewards.float().view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, unbiased=True, keepdim=True)
    return ((groups - mean) / (std + eps)).view(-1)


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """[B, T, V] logits, [B, T] tokens -> [B, T] log-probs of the tokens under softmax(logits / temperature).

    Computed in float32 whatever the logits' dtype: bf16 log-softmax loses the small differences the ratio needs.
    """
    scaled = logits.float() / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """[B, T, V] -> [B, T] entropy of softmax(logits / temperature), in nats."""
    scaled = logits.float() / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def k3_kl(logp: Tensor, ref_logp: Tensor, logratio_clamp: float = 20.0, kl_clamp: float = 10.0) -> Tensor:
    """Per-token k3 estimate of KL(policy || reference): `exp(ref - logp) - (ref - logp) - 1`, clamped."""
    log_ratio = (ref_logp - logp).clamp(-logratio_clamp, logratio_clamp)
    return (log_ratio.exp() - log_ratio - 1).clamp(-kl_clamp, kl_clamp)


@dataclass(frozen=True)
class LossSettings:
    """The constants of the loss; defaults are the paper's (mirrors config.GRPOConfig)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.001
    logratio_clamp: float = 20.0
    kl_clamp: float = 10.0
    rollout_is_cap: float | None = None  # truncated importance sampling against the rollout engine; None: off


def rollout_is_weights(old_logp: Tensor, rollout_logp: Tensor, cap: float, logratio_clamp: float = 20.0) -> Tensor:
    """[B, T] -> [B, T] truncated importance weights min(pi_old / pi_rollout, cap) (Yao et al. 2025, "Your efficient
    RL framework secretly brings you off-policy RL training"; verl's `rollout_is`): the rollout was sampled by an
    engine whose probabilities differ a little from the trainer's pi_old, and this reweights each token's loss
    toward pi_old, capped so that a token the engine found far less likely cannot dominate. No gradient."""
    log_ratio = (old_logp - rollout_logp).clamp(-logratio_clamp, logratio_clamp)
    return log_ratio.exp().clamp(max=cap).detach()


@dataclass
class LossSums:
    """Sums over the tokens of one (micro-)batch; divide by the batch's token count for token-means."""

    loss: Tensor  # differentiable: sum of (policy loss + kl_coef * kl) over tokens
    policy_loss: float
    kl: float
    clipped: float  # tokens where a clip (PPO or dual) decided the loss
    tokens: float


def ppo_token_losses(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, settings: LossSettings
) -> tuple[Tensor, Tensor]:
    """[B, T] log-probs, [B, T] old log-probs, [B, T] advantages -> ([B, T] per-token loss, [B, T] clipped flag).

    The flag marks tokens where the clipped term (PPO or dual clip) was chosen, i.e. where the gradient is cut.
    """
    ratio = torch.exp((logp - old_logp).clamp(-settings.logratio_clamp, settings.logratio_clamp))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    ppo = torch.maximum(unclipped, clipped)
    # Dual clip (Ye et al. 2020): with A < 0 the PPO loss -A * ratio grows without bound as the ratio grows; cap it
    # at -c * A so that stale, very unlikely tokens cannot blow up the update.
    dual_cap = -advantages * settings.dual_clip
    dual = torch.minimum(ppo, dual_cap)
    negative = advantages < 0
    loss = torch.where(negative, dual, ppo)
    was_clipped = (clipped > unclipped) | (negative & (ppo > dual_cap))
    return loss, was_clipped


def grpo_loss_sums(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: LossSettings,
    ref_logp: Tensor | None = None,
    token_weights: Tensor | None = None,
) -> LossSums:
    """Per-token GRPO loss summed over the masked tokens of a (micro-)batch.

    Shapes: logp, old_logp, ref_logp, mask, token_weights [B, T]; advantages [B] (one per sequence) or [B, T].
    `token_weights` (truncated importance weights, `rollout_is_weights`) scale each token's policy loss, not its KL.
    Returning sums, not means, is what makes gradient accumulation exact: the caller divides every micro-batch
    by the token count of the whole batch, so the summed gradients equal one full-batch token-mean.
    """
    if advantages.ndim == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    mask = mask.to(logp.dtype)
    policy, clipped = ppo_token_losses(logp, old_logp, advantages, settings)
    if token_weights is not None:
        policy = policy * token_weights
    total = (policy * mask).sum()
    kl_sum = torch.zeros((), device=logp.device)
    if ref_logp is not None:  # measured whenever there is a reference; part of the loss only with a coefficient
        kl = k3_kl(logp, ref_logp, settings.logratio_clamp, settings.kl_clamp)
        kl_sum = (kl * mask).sum()
        if settings.kl_coef > 0:
            total = total + settings.kl_coef * kl_sum
    return LossSums(
        loss=total,
        policy_loss=float((policy.detach() * mask).sum()),
        kl=float(kl_sum.detach()),
        clipped=float((clipped.to(mask.dtype) * mask).sum()),
        tokens=float(mask.sum()),
    )


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: LossSettings,
    ref_logp: Tensor | None = None,
) -> Tensor:
    """The token-mean GRPO loss of one whole batch (same shapes as `grpo_loss_sums`)."""
    sums = grpo_loss_sums(logp, old_logp, advantages, mask, settings, ref_logp)
    return sums.loss / max(sums.tokens, 1.0)
