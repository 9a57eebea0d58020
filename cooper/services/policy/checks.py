"""What Train refuses before it trains: a rollout that does not split into groups, and one it may not train on now.
Each refusal is a ValueError (bad input: INVALID_ARGUMENT) or StaleRollout (FAILED_PRECONDITION) saying what to send."""

from __future__ import annotations

from collections.abc import Sequence

from cooper.services.policy.errors import StaleRollout
from cooper.services.policy.trainer import RolloutSample


def check_rollout(samples: Sequence[RolloutSample], rewards: Sequence[float], group_size: int, vocab_size: int
                  ) -> None:
    """ValueError unless the rollout is `group_size` completions per prompt, each with a reward and known tokens."""
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 (got {group_size}): a group of one has no relative signal")
    if not samples or len(samples) % group_size:
        raise ValueError(f"{len(samples)} completions do not split into groups of {group_size}")
    if len(rewards) != len(samples):
        raise ValueError(f"{len(samples)} completions but {len(rewards)} rewards; give one reward per completion")
    for start in range(0, len(samples), group_size):
        if any(s.prompt_token_ids != samples[start].prompt_token_ids for s in samples[start : start + group_size]):
            raise ValueError(
                f"completions {start}..{start + group_size - 1} do not share one prompt: send the rollout "
                "grouped by prompt, `group_size` per prompt, as Generate returned it"
            )
    for i, s in enumerate(samples):
        ids = s.prompt_token_ids + s.completion_token_ids
        if not s.prompt_token_ids or any(t < 0 or t >= vocab_size for t in ids):
            raise ValueError(f"completion {i} has an empty prompt or a token id outside [0, {vocab_size})")


def check_staleness(samples: Sequence[RolloutSample], sampled_version: int, version: int, max_behind: int,
                    rollout_is_cap: float | None) -> None:
    """StaleRollout unless a rollout sampled by `sampled_version` may be trained on by a trainer at `version` that
    takes rollouts at most `max_behind` versions old (run.max_staleness).
    A rollout behind the trainer is trained with each token weighted by min(pi_old / pi_sampled, cap)
    (trainer.py), so it needs every completion's sampling log-probs: without them the update would silently
    treat it as sampled by the current weights (weight 1)."""
    behind = version - sampled_version
    if behind < 0:
        raise StaleRollout(f"the rollout was sampled by policy version {sampled_version}, but the trainer is at "
                           f"version {version}: a version not made yet")
    if behind > max_behind:
        raise StaleRollout(f"the rollout was sampled by policy version {sampled_version}, {behind} versions behind "
                           f"the trainer's version {version}; run.max_staleness={max_behind} allows at most "
                           f"{max_behind}")
    if behind:
        missing = sum(not s.has_rollout_logprobs for s in samples)
        if missing:
            raise StaleRollout(f"the rollout was sampled by policy version {sampled_version}, behind the trainer's "
                               f"version {version}, and {missing} of its {len(samples)} completions have no "
                               "sampling log-probs (one per token): the importance correction needs them; send "
                               "the completions as Generate returned them")
        if rollout_is_cap is None:
            raise StaleRollout("a rollout behind the trainer needs policy.grpo.rollout_is_cap (the importance "
                               "correction's cap); run.max_staleness > 0 sets it to 2.0 when unset")
