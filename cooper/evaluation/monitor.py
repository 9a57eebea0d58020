"""The reward-hacking monitor's pure functions: plain Python, no torch, so the orchestrator and tests use them freely.

All take the reward model's scores of a step's rollouts and the verifier's verdicts on the same rollouts
(True = CORRECT). They say how well VerifyRM still tells right from wrong *on what the policy writes now*, which is
the number that falls first when a policy finds a blind spot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def auroc(scores: Sequence[float], correct: Sequence[bool]) -> float | None:
    """Area under the ROC curve of `scores` for telling verifier-correct from verifier-wrong samples.

    The probability that a random correct sample scores above a random wrong one, ties counting half
    (Mann-Whitney U / (n_pos * n_neg)); threshold-free, so it survives a drift of all scores, unlike any
    `score > 0.5` rate. None when either class is empty (undefined). O(n log n) by ranking.
    """
    if len(scores) != len(correct):
        raise ValueError(f"{len(scores)} scores but {len(correct)} verdicts")
    positives = sum(bool(c) for c in correct)
    negatives = len(correct) - positives
    if positives == 0 or negatives == 0:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):  # average ranks over ties
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = sum(r for r, c in zip(ranks, correct, strict=True) if c)
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def false_positive_rate(accepted: Sequence[bool], correct: Sequence[bool]) -> float | None:
    """Share of verifier-wrong samples that VerifyRM accepts (cooper/reward_rule.py); None when there are none."""
    wrong = [a for a, c in zip(accepted, correct, strict=True) if not c]
    return sum(wrong) / len(wrong) if wrong else None


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """Mean of the values that are defined (not None, not NaN); None if none is."""
    kept = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(kept) / len(kept) if kept else None
