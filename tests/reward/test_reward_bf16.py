"""VerifyRM in bfloat16, on the CPU: the dtype a GPU run gets by default (`reward.dtype: auto`).

An update in bf16 must move the weights as the float32 update does: the trained model keeps float32 weights and AdamW
state and runs forward passes under bf16 autocast. Scoring in bf16 must agree with float32 within a rounding
tolerance. The contrast that makes the first point matter: AdamW on bf16 weights drops most of a small step.
"""

from __future__ import annotations

from typing import Any

import torch
from reward_testkit import tiny_items, tiny_pairs

from cooper.config import OptimConfig
from cooper.services.reward.verify_rm import VerifyRM
from cooper.tiny.models import resolve_model

UPDATE_COSINE = 0.95
"""Least cosine similarity between one update's weight change in bf16 and in float32. Not an elementwise bound:
AdamW's first step is about lr * sign(gradient), so an element whose gradient is near zero may step the other way
under bf16's rounding (measured on the tiny model: cosine 0.992, norms within 0.1%)."""
RM_LOGIT_TOLERANCE = 0.1
"""Largest |logit_bf16 - logit_fp32| of a VerifyRM score (tiny RM logits are O(1); measured: 0.039)."""


def _delta(before: dict[str, torch.Tensor], model: Any) -> torch.Tensor:
    return torch.cat([(p.detach().float() - before[n]).flatten() for n, p in model.named_parameters()])


def _weights(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def test_reward_model_in_bf16_trains_like_float32_and_scores_alike() -> None:
    source = resolve_model("tiny-rm", "reward")
    optim = OptimConfig(lr=1e-5, warmup_steps=0, weight_decay=0.0)
    pairs = tiny_pairs(16)
    fp32 = VerifyRM.load(source, optim, max_length=256, device="cpu", dtype="float32")
    bf16 = VerifyRM.load(source, optim, max_length=256, device="cpu", dtype="bfloat16")
    assert bf16.autocast_dtype == torch.bfloat16 and next(bf16.model.parameters()).dtype == torch.float32

    items = tiny_items(24)
    gap = max(abs(a[1] - b[1]) for a, b in zip(fp32.score(items), bf16.score(items), strict=True))
    assert gap < RM_LOGIT_TOLERANCE, f"bf16 scores are {gap} from float32"

    deltas = {}
    for name, rm in (("fp32", fp32), ("bf16", bf16)):
        before = _weights(rm.model)
        rm.update(pairs)
        deltas[name] = _delta(before, rm.model)
    # A 1e-5 step reaches every weight the float32 step reaches (embeddings of tokens never seen stay put in both).
    reached = deltas["fp32"] != 0
    assert (deltas["bf16"][reached] != 0).float().mean() > 0.99
    assert _cosine(deltas["bf16"], deltas["fp32"]) > UPDATE_COSINE
    assert abs(float(deltas["bf16"].norm() / deltas["fp32"].norm()) - 1) < 0.05

    # What bf16 weights under AdamW would have done (the reward model before float32 master weights): most of the
    # same step is rounded away.
    pure = VerifyRM.load(source, optim, max_length=256, device="cpu", dtype="bfloat16", trains=False)
    assert next(pure.model.parameters()).dtype == torch.bfloat16
    before = _weights(pure.model)
    pure.update(pairs)
    lost = float((_delta(before, pure.model)[reached] == 0).float().mean())
    assert lost > 0.5  # measured: 89% of them
