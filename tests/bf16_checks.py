"""What "a bf16 update moves the weights as the float32 update does" means, for the reward model's and the
policy's bf16 tests (tests/reward/test_reward_bf16.py, tests/policy/test_policy_bf16.py)."""

from __future__ import annotations

from typing import Any

import torch

UPDATE_COSINE = 0.9
"""Least cosine similarity between one update's weight change in bf16 and in float32. Not an elementwise bound:
AdamW's first step is about lr * sign(gradient), so an element whose gradient is near zero may step the other way
under bf16's rounding (measured on the tiny models: cosine 0.914 for the v7 reward model, whose first gradient is small
(norm 0.12), 0.992 for v6's, 0.973 for the policy; norms within 0.3%)."""
NORM_TOLERANCE = 0.05
"""Largest relative difference of the two weight changes' norms."""


def weights(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def delta(before: dict[str, torch.Tensor], model: Any) -> torch.Tensor:
    """The change of every weight since `before`, flattened into one float32 vector."""
    return torch.cat([(p.detach().float() - before[n]).flatten() for n, p in model.named_parameters()])


def assert_update_like_float32(bf16: torch.Tensor, fp32: torch.Tensor) -> None:
    # Every weight the float32 step reaches, the bf16 step reaches (embeddings of tokens never seen stay put in both).
    reached = fp32 != 0
    assert (bf16[reached] != 0).float().mean() > 0.99
    assert float(torch.nn.functional.cosine_similarity(bf16, fp32, dim=0)) > UPDATE_COSINE
    assert abs(float(bf16.norm() / fp32.norm()) - 1) < NORM_TOLERANCE
