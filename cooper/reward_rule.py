"""From a VerifyRM logit to a reward, and to a judgement: the one rule (docs/design.md section 2.1).

No torch here, so that the reward service, the HTTP API, the run engine and the evaluation kits all call it
without loading the model's code, and cannot drift apart.
"""

from __future__ import annotations

import math


def logit_to_reward(logit: float, discrete: bool = False) -> float:
    """sigmoid(logit), the model's probability that the completion is correct, or with `discrete` (reward.discrete)
    1.0 when VerifyRM accepts it, else 0.0."""
    if logit >= 0:  # two branches, so that exp never overflows
        probability = 1.0 / (1.0 + math.exp(-logit))
    else:
        z = math.exp(logit)
        probability = z / (1.0 + z)
    if discrete:
        return 1.0 if accepts_score(probability) else 0.0
    return probability


def accepts(logit: float) -> bool:
    """Whether VerifyRM says the completion is correct: sigmoid(logit) > 0.5, where the discrete reward is 1."""
    return accepts_score(logit_to_reward(logit))


def accepts_score(score: float) -> bool:
    """The same judgement from a score: a probability (sigmoid(logit)) or a discrete reward."""
    return score > 0.5
