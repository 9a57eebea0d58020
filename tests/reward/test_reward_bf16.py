"""VerifyRM in bfloat16, on the CPU: the dtype a GPU run gets by default (`reward.dtype: auto`).

An update in bf16 must move the weights as the float32 update does: the trained model keeps float32 weights and AdamW
state and runs forward passes under bf16 autocast. Scoring in bf16 must agree with float32 within a rounding
tolerance. The contrast that makes the first point matter: AdamW on bf16 weights drops most of a small step.
"""

from __future__ import annotations

import torch
from bf16_checks import assert_update_like_float32, delta, weights
from reward_testkit import tiny_items, tiny_pairs

from cooper.config import OptimConfig
from cooper.runtime.models import resolve_model
from cooper.services.reward.verify_rm import VerifyRM

RM_LOGIT_TOLERANCE, RM_MEDIAN_LOGIT_TOLERANCE, RM_SCORE_TOLERANCE = 0.5, 0.05, 0.1
"""|logit_bf16 - logit_fp32| of VerifyRM scores: the largest, the median, and the largest score (probability) gap.
Measured on the v8 tiny RM (logits up to |7|, sharper than v7's, whose largest gap was 0.039): median 0.012, largest
0.377 on one item of 24 near the boundary (logit -1.1; scores 0.243 and 0.319)."""


def test_reward_model_in_bf16_trains_like_float32_and_scores_alike() -> None:
    source = resolve_model("tiny-rm", "reward")
    optim = OptimConfig(lr=1e-5, warmup_steps=0, weight_decay=0.0)
    pairs = tiny_pairs(16)
    fp32 = VerifyRM.load(source, optim, max_length=256, device="cpu", dtype="float32")
    bf16 = VerifyRM.load(source, optim, max_length=256, device="cpu", dtype="bfloat16")
    assert bf16.autocast_dtype == torch.bfloat16 and next(bf16.model.parameters()).dtype == torch.float32

    items = tiny_items(24)
    pairs_of_scores = list(zip(fp32.score(items), bf16.score(items), strict=True))
    gaps = sorted(abs(a[1] - b[1]) for a, b in pairs_of_scores)
    assert gaps[-1] < RM_LOGIT_TOLERANCE, f"bf16 logits are up to {gaps[-1]} from float32"
    assert gaps[len(gaps) // 2] < RM_MEDIAN_LOGIT_TOLERANCE, f"bf16 logits are {gaps[len(gaps) // 2]} from float32 (median)"
    assert max(abs(a[0] - b[0]) for a, b in pairs_of_scores) < RM_SCORE_TOLERANCE

    deltas = {}
    for name, rm in (("fp32", fp32), ("bf16", bf16)):
        before = weights(rm.model)
        rm.update(pairs)
        deltas[name] = delta(before, rm.model)
    assert_update_like_float32(deltas["bf16"], deltas["fp32"])  # a 1e-5 step reaches every weight

    # What bf16 weights under AdamW would have done (the reward model before float32 master weights): most of the
    # same step is rounded away.
    pure = VerifyRM.load(source, optim, max_length=256, device="cpu", dtype="bfloat16", trains=False)
    assert next(pure.model.parameters()).dtype == torch.bfloat16
    before = weights(pure.model)
    pure.update(pairs)
    reached = deltas["fp32"] != 0
    lost = float((delta(before, pure.model)[reached] == 0).float().mean())
    assert lost > 0.5  # measured: 89% of them
