import itertools
import random

import pytest

from cooper.evaluation.monitor import auroc, false_positive_rate, mean_or_none
from cooper.reward_rule import accepts_score


def brute_auroc(scores, correct):
    pos = [s for s, c in zip(scores, correct, strict=True) if c]
    neg = [s for s, c in zip(scores, correct, strict=True) if not c]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)) / (len(pos) * len(neg))


def test_auroc_extremes_and_ties():
    assert auroc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auroc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == 0.0
    assert auroc([0.5, 0.5, 0.5], [True, False, False]) == 0.5
    assert auroc([0.3, 0.7], [True, True]) is None and auroc([], []) is None


def test_auroc_matches_pairwise_definition():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(2, 40)
        scores = [rng.choice([0.1, 0.2, 0.5, rng.random()]) for _ in range(n)]
        correct = [rng.random() < 0.5 for _ in range(n)]
        if 0 < sum(correct) < n:
            assert auroc(scores, correct) == pytest.approx(brute_auroc(scores, correct))


def test_auroc_is_threshold_free():
    scores, correct = [0.9, 0.7, 0.8, 0.6], [True, False, True, False]
    shifted = [s / 10 for s in scores]  # every score drifts down: rates at 0.5 change, AUROC does not
    assert auroc(scores, correct) == auroc(shifted, correct) == 1.0
    assert false_positive_rate([accepts_score(s) for s in scores], correct) == 1.0
    assert false_positive_rate([accepts_score(s) for s in shifted], correct) == 0.0


def test_false_positive_rate():
    assert false_positive_rate([True, False, True, False], [True, False, False, False]) == pytest.approx(1 / 3)
    assert false_positive_rate([True], [True]) is None
    with pytest.raises(ValueError):
        auroc([0.1], [True, False])


def test_mean_or_none():
    assert mean_or_none([None, 1.0, float("nan"), 3.0]) == 2.0 and mean_or_none([None]) is None
