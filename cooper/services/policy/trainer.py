"""The GRPO update: micro-batched forward/backward, gradient accumulation, AdamW with warm-up and clipping.

One `train_step` is one policy update (docs/design.md, section 2.1). Sequences are laid out as
`[left-padded prompt | right-padded completion]`, so every row's completion starts at the same column and one
`logits_to_keep` slice gives the logits that predict the completion tokens.

Gradient accumulation is exact: each micro-batch's loss is its *sum* over tokens divided by the token count of
the whole batch, so the summed micro-batch gradients equal the gradient of one full-batch token-mean (a test
checks 1x8 against 4x2).

The same loop (`GRPOTrainer.run_update`) trains one rank or many: across ranks (FSDP2) each runs it on its share of
the batch, and `sharded.RankTrainer` overrides only the collectives it calls (the all-reduce of the sums and the
norm of the sharded gradient). The advantages are computed once, over the whole rollout, before any split
(`PolicyUpdater.train_step`).

Left out: sequence packing and minibatches within a rollout (one optimizer step per epoch).
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import torch
from torch import Tensor

from cooper.metric_names import POLICY_KL, POLICY_KL_SEQ, POLICY_RESPONSE_LENGTH
from cooper.services.policy.grpo import (
    LossSettings,
    group_advantages,
    grpo_loss_sums,
    k3_kl,
    rollout_is_weights,
    token_entropy,
    token_logprobs,
)

if TYPE_CHECKING:
    from cooper.config import PolicyConfig

ROLLOUT_SUM_KEYS = ("rollout_abs_diff", "rollout_kl", "rollout_tokens", "rollout_is_weight", "rollout_is_capped")
"""Sums over the tokens whose rollout log-probs were sent: what `rollout_metrics` turns into metrics."""


def per_token_metrics(sums: dict[str, float], per_token: float) -> dict[str, float]:
    """Loss terms and entropy summed over tokens (and epochs) -> their token means, as reported per update."""
    return {"loss": sums["loss"] / per_token, "policy_loss": sums["policy_loss"] / per_token,
            POLICY_KL: sums["kl"] / per_token, "clip_fraction": sums["clipped"] / per_token,
            "entropy": sums["entropy"] / per_token}


def rollout_metrics(sums: dict[str, float], cap: float | None) -> dict[str, float]:
    """How far the engine that sampled was from the trainer's pi_old on the same tokens (the sums of
    `rollout_sums`): mean |log pi_old - log pi_rollout|, the k3 estimate of KL(pi_rollout || pi_old), and, with
    truncated importance sampling on, the mean weight and the share of tokens whose weight hit the cap. Empty when
    no rollout log-probs came."""
    tokens = sums["rollout_tokens"]
    if not tokens:
        return {}
    metrics = {"rollout/logprob_abs_diff": sums["rollout_abs_diff"] / tokens, "rollout/kl": sums["rollout_kl"] / tokens,
               "rollout/tokens_compared": tokens}
    if cap is not None:
        metrics["rollout/is_weight_mean"] = sums["rollout_is_weight"] / tokens
        metrics["rollout/is_capped_fraction"] = sums["rollout_is_capped"] / tokens
    return metrics


@dataclass
class RolloutSample:
    """One completion to learn from: the prompt as the engine tokenized it and the sampled tokens."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    rollout_logprobs: list[float] | None = None
    """The sampling engine's log-prob of each completion token (Generate's `logprobs`), for the mismatch metrics
    and truncated importance sampling; None (or a wrong length) leaves the sample out of both."""

    @property
    def has_rollout_logprobs(self) -> bool:
        return self.rollout_logprobs is not None and len(self.rollout_logprobs) == len(self.completion_token_ids)


def rollout_tensors(samples: Sequence[RolloutSample]) -> dict[str, Tensor]:
    """The samples as a few flat tensors (what the update journal stores): token ids int32 (vocabularies stay far
    below 2^31), log-probs float32, the dtype the trainer reads them in, and per-sample lengths (-1: no log-probs).
    `rollout_samples` inverts it."""
    def lengths(rows: Sequence[Sequence[Any] | None]) -> Tensor:
        return torch.tensor([-1 if row is None else len(row) for row in rows], dtype=torch.long)

    def flat(rows: Sequence[Sequence[Any] | None], dtype: torch.dtype) -> Tensor:
        return torch.tensor([x for row in rows if row is not None for x in row], dtype=dtype)

    prompts = [s.prompt_token_ids for s in samples]
    completions = [s.completion_token_ids for s in samples]
    logprobs = [s.rollout_logprobs for s in samples]
    return {"prompt_lengths": lengths(prompts), "prompt_ids": flat(prompts, torch.int32),
            "completion_lengths": lengths(completions), "completion_ids": flat(completions, torch.int32),
            "logprob_lengths": lengths(logprobs), "logprobs": flat(logprobs, torch.float32)}


def rollout_samples(tensors: dict[str, Tensor]) -> list[RolloutSample]:
    """The samples `rollout_tensors` stored (log-probs as float32 values, which is all the update reads)."""
    def rows(name: str, lengths: Tensor) -> list[list[Any] | None]:
        values, out, start = tensors[name].tolist(), [], 0
        for n in lengths.tolist():
            out.append(None if n < 0 else values[start : start + n])
            start += max(n, 0)
        return out

    prompts = rows("prompt_ids", tensors["prompt_lengths"])
    completions = rows("completion_ids", tensors["completion_lengths"])
    logprobs = rows("logprobs", tensors["logprob_lengths"])
    return [RolloutSample(p or [], c or [], lp) for p, c, lp in zip(prompts, completions, logprobs, strict=True)]


@dataclass
class MicroBatch:
    """A slice of the rollout laid out for one forward pass."""

    input_ids: Tensor  # [B, P + C]
    attention_mask: Tensor  # [B, P + C]
    position_ids: Tensor  # [B, P + C]
    completion: Tensor  # [B, C] completion tokens (pad where mask is 0)
    mask: Tensor  # [B, C] 1 on completion tokens
    width: int  # C
    rollout_logp: Tensor  # [B, C] the engine's log-probs (0 where none came)
    rollout_mask: Tensor  # [B, C] 1 on completion tokens whose rollout log-prob came


def layout_micro_batch(samples: Sequence[RolloutSample], pad_id: int, device: torch.device) -> MicroBatch:
    """`samples` as `[left-padded prompt | right-padded completion]` rows on `device`."""
    prompt_width = max(len(s.prompt_token_ids) for s in samples)
    width = max(1, max(len(s.completion_token_ids) for s in samples))
    rows = len(samples)
    input_ids = torch.full((rows, prompt_width + width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    mask = torch.zeros((rows, width), dtype=torch.float32)
    rollout_logp = torch.zeros((rows, width), dtype=torch.float32)
    rollout_mask = torch.zeros((rows, width), dtype=torch.float32)
    for i, s in enumerate(samples):
        p, c = s.prompt_token_ids, s.completion_token_ids
        input_ids[i, prompt_width - len(p) : prompt_width] = torch.tensor(p, dtype=torch.long)
        input_ids[i, prompt_width : prompt_width + len(c)] = torch.tensor(c, dtype=torch.long)
        attention_mask[i, prompt_width - len(p) : prompt_width + len(c)] = 1
        mask[i, : len(c)] = 1
        if s.has_rollout_logprobs and c:
            rollout_logp[i, : len(c)] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
            rollout_mask[i, : len(c)] = 1
    # Positions count real tokens only, as in generation with left padding.
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return MicroBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids.to(device),
        completion=input_ids[:, prompt_width:].to(device),
        mask=mask.to(device),
        width=width,
        rollout_logp=rollout_logp.to(device),
        rollout_mask=rollout_mask.to(device),
    )


def rollout_sums(old: Tensor, batch: MicroBatch, settings: LossSettings) -> dict[str, float]:
    """`ROLLOUT_SUM_KEYS` over one micro-batch: pi_old (the trainer's recomputed log-probs) against the engine's."""
    mask = batch.rollout_mask
    diff = (old - batch.rollout_logp) * mask
    kl = k3_kl(batch.rollout_logp, old, settings.logratio_clamp, settings.kl_clamp)  # KL(rollout || old), k3
    sums = {"rollout_abs_diff": float(diff.abs().sum()), "rollout_kl": float((kl * mask).sum()),
            "rollout_tokens": float(mask.sum()), "rollout_is_weight": 0.0, "rollout_is_capped": 0.0}
    if settings.rollout_is_cap is not None:
        weights = rollout_is_weights(old, batch.rollout_logp, settings.rollout_is_cap, settings.logratio_clamp)
        sums["rollout_is_weight"] = float((weights * mask).sum())
        sums["rollout_is_capped"] = float(((weights >= settings.rollout_is_cap).float() * mask).sum())
    return sums


def rollout_sums_over(old_logps: Sequence[Tensor], batches: Sequence[MicroBatch], settings: LossSettings
                      ) -> dict[str, float]:
    """`rollout_sums` added up over the micro-batches of an update."""
    total = dict.fromkeys(ROLLOUT_SUM_KEYS, 0.0)
    for old, batch in zip(old_logps, batches, strict=True):
        for key, value in rollout_sums(old, batch, settings).items():
            total[key] += value
    return total


def token_is_weights(old: Tensor, batch: MicroBatch, settings: LossSettings) -> Tensor | None:
    """The truncated importance weights of a micro-batch's tokens (1 where no rollout log-prob came); None: off."""
    if settings.rollout_is_cap is None:
        return None
    weights = rollout_is_weights(old, batch.rollout_logp, settings.rollout_is_cap, settings.logratio_clamp)
    return torch.where(batch.rollout_mask > 0, weights, torch.ones_like(weights))


def lr_at(update: int, lr: float, warmup_steps: int) -> float:
    """Learning rate of the 0-based `update`: linear warm-up over `warmup_steps` updates, then constant.

    The first update already gets lr / warmup_steps (not 0, which would waste a whole rollout).
    """
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (update + 1) / warmup_steps)


LOSS_SUM_KEYS = ("loss", "policy_loss", "kl", "clipped", "entropy")
"""Sums over the tokens (and epochs) of the backward passes: what `per_token_metrics` turns into token means."""

REDUCED_SUM_KEYS = (*LOSS_SUM_KEYS, "kl_seq", *ROLLOUT_SUM_KEYS)
"""The sums `GRPOTrainer.run_update` adds up over the ranks (`GRPOTrainer.all_reduce`) after the update."""


def rollout_advantages(samples: Sequence[RolloutSample], rewards: Sequence[float], group_size: int, eps: float
                       ) -> Tensor:
    """[N] advantages of the whole rollout, computed once before it is cut into micro-batches or ranks' shares (a
    prompt's group may straddle two of them); raises ValueError for a rollout there is nothing to learn from."""
    if len(samples) != len(rewards):
        raise ValueError(f"{len(samples)} completions but {len(rewards)} rewards; give one reward per completion")
    if not samples:
        raise ValueError("the rollout is empty")
    advantages = group_advantages(torch.tensor(list(rewards), dtype=torch.float32), group_size, eps)
    if not any(s.completion_token_ids for s in samples):
        raise ValueError("every completion is empty; nothing to train on")
    return advantages


def update_metrics(sums: dict[str, float], rewards: Sequence[float], epochs: int, rollout_is_cap: float | None
                   ) -> dict[str, float]:
    """What one update reports, from the sums of `GRPOTrainer.run_update` over the whole batch (every rank's)."""
    metrics = {
        **per_token_metrics(sums, epochs * sums["tokens"]),
        "grad_norm": sums["grad_norm"],
        POLICY_RESPONSE_LENGTH: sums["tokens"] / sums["samples"],
        "reward_mean": float(torch.tensor(list(rewards), dtype=torch.float64).mean()),
        **rollout_metrics(sums, rollout_is_cap),
    }
    if sums["has_reference"]:
        # KL(pi || pi_init) per completion, the sequence-level quantity of Gao et al.'s over-optimisation plots.
        metrics[POLICY_KL_SEQ] = sums["kl_seq"] / sums["samples"]
    metrics["lr"] = sums["lr"]
    return metrics


class PolicyUpdater(ABC):
    """One GRPO update per `train_step`, on one rank (`GRPOTrainer`) or several (`ranks.RankGroup`): the rollout is
    checked and its advantages computed once, here, then `apply_update` trains on it and returns the whole batch's
    sums, which become the metrics here too."""

    adv_eps: float
    epochs: int
    rollout_is_cap: float | None

    @abstractmethod
    def apply_update(self, samples: Sequence[RolloutSample], advantages: Tensor) -> dict[str, float]:
        """One optimizer update on the rollout; the sums of `GRPOTrainer.run_update` over the whole batch."""

    closed: bool = False
    """True once closed or killed (the ranks are gone); one process's updater never is."""

    @abstractmethod
    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer state in the single-rank format, whatever the world size."""

    @abstractmethod
    def close(self) -> None:
        """Stop what runs beside this process for the updates (the other ranks), as the service stops."""

    @abstractmethod
    def kill(self) -> None:
        """Stop at once, after a failure (the other ranks)."""

    def train_step(self, samples: Sequence[RolloutSample], rewards: Sequence[float], group_size: int
                   ) -> dict[str, float]:
        """One policy update on a rollout grouped by prompt (`group_size` consecutive samples per prompt)."""
        advantages = rollout_advantages(samples, rewards, group_size, self.adv_eps)
        return update_metrics(self.apply_update(samples, advantages), rewards, self.epochs, self.rollout_is_cap)


class GRPOTrainer(PolicyUpdater):
    """Owns the optimizer; updates `model` in place. `reference` is the frozen initial policy (None: no KL); with a
    reference the KL to it is measured even when `settings.kl_coef` is 0 (then it is not part of the loss).

    `run_update` is the one training loop for any number of ranks; a rank overrides only the collectives it calls
    (`all_reduce`, `clip_gradients`: `sharded.RankTrainer`), which are identities here."""

    def __init__(
        self,
        model: Any,
        reference: Any | None,
        settings: LossSettings,
        *,
        lr: float,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        grad_clip: float = 1.0,
        warmup_steps: int = 0,
        micro_batch_size: int = 8,
        epochs: int = 1,
        temperature: float = 1.0,
        adv_eps: float = 1e-6,
        pad_id: int = 0,
        autocast_dtype: torch.dtype | None = None,
    ):
        if settings.kl_coef > 0 and reference is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.model = model
        self.reference = reference
        self.settings = settings
        self.rollout_is_cap = settings.rollout_is_cap
        self.lr = lr
        self.grad_clip = grad_clip
        self.warmup_steps = warmup_steps
        self.micro_batch_size = micro_batch_size
        self.epochs = epochs
        self.temperature = temperature if temperature > 0 else 1.0
        self.adv_eps = adv_eps
        self.pad_id = pad_id
        self.autocast_dtype = autocast_dtype
        self.updates = 0  # completed updates; drives the warm-up
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    @classmethod
    def from_config(cls, model: Any, reference: Any | None, cfg: PolicyConfig, pad_id: int,
                    autocast_dtype: torch.dtype | None) -> Self:
        """The trainer `cfg` (policy.grpo, policy.optim, the sampling temperature) describes."""
        grpo, optim = cfg.grpo, cfg.optim
        return cls(
            model, reference,
            LossSettings(grpo.clip_low, grpo.clip_high, grpo.dual_clip, grpo.kl_coef, grpo.logratio_clamp,
                         grpo.kl_clamp, grpo.rollout_is_cap),
            lr=optim.lr, weight_decay=optim.weight_decay, betas=optim.betas, eps=optim.eps, grad_clip=optim.grad_clip,
            warmup_steps=optim.warmup_steps, micro_batch_size=optim.micro_batch_size, epochs=grpo.epochs,
            temperature=cfg.sampling.temperature, adv_eps=grpo.adv_eps, pad_id=pad_id, autocast_dtype=autocast_dtype,
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- the collectives: identities on one rank ---------------------------------------------------------------

    def all_reduce(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks."""
        return values

    def clip_gradients(self, max_norm: float) -> float:
        """Clip the (whole, over every rank) gradient to `max_norm`; its total norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))

    # --- the update ---------------------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _backward_micro_batch(self, batch: MicroBatch, old: Tensor, advantages: Tensor, ref: Tensor | None,
                              total_tokens: float, sums: dict[str, float]) -> None:
        """Backward of one micro-batch's share of the token-mean GRPO loss (its sums over `total_tokens`, the count
        of the whole batch, on every rank), adding its loss terms and entropy to `sums`."""
        logits = self._forward(self.model, batch)
        logp = token_logprobs(logits, batch.completion, self.temperature)
        part = grpo_loss_sums(logp, old, advantages, batch.mask, self.settings, ref,
                              token_is_weights(old, batch, self.settings))
        (part.loss / total_tokens).backward()
        with torch.no_grad():
            sums["entropy"] += float((token_entropy(logits.detach(), self.temperature) * batch.mask).sum())
        sums["loss"] += float(part.loss.detach())
        sums["policy_loss"] += part.policy_loss
        sums["kl"] += part.kl
        sums["clipped"] += part.clipped

    def _forward(self, model: Any, batch: MicroBatch) -> Tensor:
        """[B, C, V] logits that predict the completion tokens."""
        with self._autocast():
            out = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                logits_to_keep=batch.width + 1,
                use_cache=False,
            )
        return out.logits[:, :-1]

    @torch.no_grad()
    def _logprobs(self, model: Any, batch: MicroBatch) -> Tensor:
        return token_logprobs(self._forward(model, batch), batch.completion, self.temperature)

    def _micro_batches(self, samples: Sequence[RolloutSample], advantages: Tensor, passes: int
                       ) -> tuple[list[MicroBatch], list[Tensor]]:
        """The micro-batches of `samples` and their advantages, padded to `passes` with passes that contribute
        nothing (mask 0) but join the other ranks' all-gathers and reduce-scatters."""
        device, size = self.device, self.micro_batch_size
        spans = [(i, min(i + size, len(samples))) for i in range(0, len(samples), size)]
        batches = [layout_micro_batch(samples[a:b], self.pad_id, device) for a, b in spans]
        slices = [advantages[a:b].to(device) for a, b in spans]
        while len(batches) < passes:
            dummy = layout_micro_batch([RolloutSample([self.pad_id], [self.pad_id])], self.pad_id, device)
            dummy.mask.zero_()
            batches.append(dummy)
            slices.append(torch.zeros(1, device=device))
        return batches, slices

    def apply_update(self, samples: Sequence[RolloutSample], advantages: Tensor) -> dict[str, float]:
        return self.run_update(samples, advantages)

    def accumulate_gradients(self, samples: Sequence[RolloutSample], rewards: Sequence[float], group_size: int
                             ) -> dict[str, float]:
        """Zero the gradients, then accumulate the full-batch gradient over micro-batches; returns loss metrics.

        `train_step` without the optimizer step; public so that tests can compare gradients.
        """
        advantages = rollout_advantages(samples, rewards, group_size, self.adv_eps)
        sums = self.run_update(samples, advantages, step=False)
        metrics = update_metrics(sums, rewards, self.epochs, self.rollout_is_cap)
        del metrics["lr"]  # no step was taken with it
        return metrics

    def run_update(self, samples: Sequence[RolloutSample], advantages: Tensor, passes: int = 0, step: bool = True
                   ) -> dict[str, float]:
        """Collective: one update over this rank's `samples` (all of them on one rank) with their `advantages`,
        in at least `passes` micro-batches (the same number on every rank); `step` False only accumulates the
        gradients. Returns the sums of the whole batch (every rank's), the same on all ranks."""
        batches, batch_advantages = self._micro_batches(samples, advantages, passes)
        local_tokens = float(sum(len(s.completion_token_ids) for s in samples))
        total_tokens, total_samples = self.all_reduce([local_tokens, float(len(samples))])

        # old_logp: recomputed here with the current weights, before any update, rather than taken from the
        # sampling log-probs. The sampling engine (vLLM, bf16 kernels, another batch layout) does not compute
        # exactly what this forward computes, and with a single PPO epoch the ratio must start at exactly 1;
        # otherwise engine mismatch would masquerade as policy change and trigger clipping.
        self.model.eval()  # no dropout in any pass, so old_logp and logp are the same function of the weights
        old_logps = [self._logprobs(self.model, b) for b in batches]
        mismatch = rollout_sums_over(old_logps, batches, self.settings)
        ref_logps: list[Tensor | None] = [None] * len(batches)
        kl_seq = 0.0
        if self.reference is not None:
            references = [self._logprobs(self.reference, b) for b in batches]
            ref_logps = list[Tensor | None](references)
            # Summed over completions of sum_t (old_logp - ref_logp). When the rollout was sampled from the current
            # weights (run.max_staleness 0) its mean over completions is an unbiased (k1) estimate of KL(pi || pi_init).
            # With rollouts ahead it was sampled by a version up to k updates older, so the mean is taken over that
            # version's completions: an estimate of KL(pi || pi_init) biased by how far pi moved in k updates.
            kl_seq = sum((float(((old - ref) * b.mask).sum())
                          for old, ref, b in zip(old_logps, references, batches, strict=True)), 0.0)

        lr = lr_at(self.updates, self.lr, self.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        sums = dict.fromkeys(LOSS_SUM_KEYS, 0.0)
        norms = 0.0
        for _ in range(self.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for batch, adv, old, ref in zip(batches, batch_advantages, old_logps, ref_logps, strict=True):
                self._backward_micro_batch(batch, old, adv, ref, total_tokens, sums)
            # Total norm before clipping: the number that says how large the raw update wanted to be.
            norms += self.clip_gradients(self.grad_clip if step else math.inf)
            if step:
                self.optimizer.step()
        if step:
            self.updates += 1
        reduced = self.all_reduce([*(sums[key] for key in LOSS_SUM_KEYS), kl_seq,
                                   *(mismatch[key] for key in ROLLOUT_SUM_KEYS)])
        out = dict(zip(REDUCED_SUM_KEYS, reduced, strict=True))
        out.update(tokens=total_tokens, samples=total_samples, grad_norm=norms / self.epochs, lr=lr,
                   has_reference=float(self.reference is not None))
        return out

    def optimizer_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])

    def close(self) -> None:
        """Nothing runs beside it: the updates happen in this process."""

    def kill(self) -> None:
        """Nothing runs beside it: the updates happen in this process."""
