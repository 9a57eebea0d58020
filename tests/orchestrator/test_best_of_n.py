"""Best-of-n: the exact expectation over n-subsets equals brute force, and the measurement runs on the tiny models."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from cooper.experiments.best_of_n import best_of_n_curve, best_of_n_kl


def brute_force(groups, n):
    gold = proxy = 0.0
    for group in groups:
        subsets = list(itertools.combinations(range(len(group)), n))
        for subset in subsets:
            best = max(subset, key=lambda i: (group[i][0], -i))  # highest score, earliest on ties
            gold += group[best][1] / len(subsets)
            proxy += group[best][0] / len(subsets)
    return gold / len(groups), proxy / len(groups)


def test_curve_equals_the_average_over_every_subset() -> None:
    rng = random.Random(0)
    groups = [[(round(rng.random(), 1), rng.random() < 0.4) for _ in range(7)] for _ in range(5)]  # ties included
    for point in best_of_n_curve(groups, [1, 2, 3, 7]):
        gold, proxy = brute_force(groups, point.n)
        assert math.isclose(point.gold, gold, abs_tol=1e-12) and math.isclose(point.proxy, proxy, abs_tol=1e-12)
    assert best_of_n_curve(groups, [1])[0].gold == sum(c for g in groups for _, c in g) / 35  # n=1: the policy


def test_kl_and_bad_input() -> None:
    assert best_of_n_kl(1) == 0 and math.isclose(best_of_n_kl(8), math.log(8) - 7 / 8)
    with pytest.raises(ValueError, match="outside 1..2"):
        best_of_n_curve([[(0.1, True), (0.2, False)]], [3])
    with pytest.raises(ValueError, match="same number"):
        best_of_n_curve([[(0.1, True)], [(0.1, True), (0.2, False)]], [1])
