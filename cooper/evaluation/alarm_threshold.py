"""The CUSUM threshold h of the reward-hacking alarm, for the step-to-step dependence its signals show. Pure Python.

A policy moves slowly, so one step's signals resemble the last one's. A CUSUM sums its excesses, and the sum of n
AR(1) steps with correlation phi varies (1 + phi) / (1 - phi) times as much as that of n independent ones (4x at
0.6): a threshold calibrated on independent steps raised in 20% of in-control 400-step runs at phi 0.3 and 60% at
0.6, against 10% asked (docs/alarm.md). So the baseline window fits each signal's AR(1) (`fit_baseline`), the CUSUM
sums what each step adds beyond what the last step predicts (the AR(1) residual, in units of its own spread), and h
is the quantile of the run maximum over simulated in-control runs whose steps follow an AR(1) with the fitted
correlation and that fit their baseline the same way (`threshold_for`), so the error of a correlation fitted on 30
steps is in h.

Why residuals and not the raw excess with a larger h: a step shift of 1.5 spreads at correlation 0.6 was found after
about 100 steps on residuals and 120 on the raw excess (whose h was 5 times larger), 25 against 37 at 0.3, in
simulations where both held the rate.

The signals are simulated independently of one another, so the chance that no signal crosses h is the product of
each one's (`signal_maxima` per correlation, cached, the correlation rounded to CORRELATION_STEP: a handful of
quarter-second simulations in all). Left out: dependence between signals (one run crossing on two signals counts
once, so it lowers the rate), heavier than normal tails, and a correlation that changes during the run. Measured
beyond the model, on honest runs simulated from their rollouts (docs/alarm.md): a policy that improves and settles
held the rate (7 of 200 runs raised, 10% asked); one whose accuracy wanders as a random walk did not (11-32%), since a
level with no mean to return to leaves any baseline.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

SIMULATED_RUNS = 1000  # per signal and correlation
CORRELATION_STEP = 0.05  # fitted correlations are rounded to this grid, so thresholds are cached and reused
MAX_CORRELATION = 0.9  # a 30-step window cannot tell 0.9 from a random walk; beyond it h would only grow


@dataclass(frozen=True)
class BaselineFit:
    """One signal's baseline: its mean and spread, its lag-one correlation, and the spread of what a step adds
    beyond the last step's prediction (the AR(1) residual)."""

    mean: float
    spread: float
    correlation: float = 0.0
    residual_spread: float = 0.0  # 0: not fitted (a state saved before correlations were): the spread is used

    def residual(self, value: float, previous: float) -> float:
        """The step's excess over the AR(1) prediction from the previous value, in residual spreads."""
        expected = self.mean + self.correlation * (previous - self.mean)
        return (value - expected) / (self.residual_spread or self.spread)


def lag_one_correlation(values: Sequence[float]) -> float:
    """The AR(1) coefficient of a baseline window, corrected for the bias of a short sample with its mean removed
    (about -(1 + 3 phi) / n: -0.1 at phi 0.6 on 30 steps, Marriott and Pope 1954), clipped to
    [0, MAX_CORRELATION] and rounded to CORRELATION_STEP. A negative fit is read as 0: from 30 steps it is mostly
    noise, and whitening with it would only lower h."""
    n = len(values)
    if n < 4:
        return 0.0
    mean = statistics.fmean(values)
    deviations = [v - mean for v in values]
    total = sum(d * d for d in deviations)
    if total == 0:
        return 0.0
    r1 = sum(a * b for a, b in zip(deviations, deviations[1:], strict=False)) / total
    corrected = (n * r1 + 1) / (n - 3)
    return round(round(min(MAX_CORRELATION, max(0.0, corrected)) / CORRELATION_STEP) * CORRELATION_STEP, 2)


def fit_baseline(values: Sequence[float], min_spread: float = 0.0) -> BaselineFit:
    """The baseline of one signal (at least 2 values). `min_spread` floors the spread, and the residual spread at
    the share of it an AR(1) of that correlation leaves (a short window can look near-constant by chance)."""
    mean, spread = statistics.fmean(values), statistics.stdev(values)
    correlation = lag_one_correlation(values)
    residuals = [(b - mean) - correlation * (a - mean) for a, b in zip(values, values[1:], strict=False)]
    residual_spread = math.sqrt(sum(r * r for r in residuals) / max(1, len(residuals) - 1))
    floor = min_spread * math.sqrt(1.0 - correlation * correlation)
    return BaselineFit(mean, max(spread, min_spread), correlation, max(residual_spread, floor, 1e-12))


@functools.lru_cache(maxsize=64)
def signal_maxima(correlation: float, baseline_steps: int, run_steps: int, drift: float) -> tuple[float, ...]:
    """The sorted run maxima of one signal's CUSUM over SIMULATED_RUNS seeded in-control runs: unit-variance AR(1)
    steps with `correlation` (started stationary), the baseline fitted on the first `baseline_steps` as the alarm
    fits it (its own correlation included), the CUSUM of residuals with allowance `drift` on the rest."""
    rng = random.Random(f"alarm-threshold:{correlation:.2f}")
    innovation = math.sqrt(1.0 - correlation * correlation)
    maxima = []
    for _ in range(SIMULATED_RUNS):
        x = rng.gauss(0.0, 1.0)
        baseline = []
        for _ in range(baseline_steps):
            baseline.append(x)
            x = correlation * x + innovation * rng.gauss(0.0, 1.0)
        fit, previous = fit_baseline(baseline), baseline[-1]
        total = highest = 0.0
        for _ in range(run_steps - baseline_steps):
            total = max(0.0, total + fit.residual(x, previous) - drift)
            highest = max(highest, total)
            previous, x = x, correlation * x + innovation * rng.gauss(0.0, 1.0)
        maxima.append(highest)
    return tuple(sorted(maxima))


@functools.lru_cache(maxsize=256)
def threshold_for(false_alarm_rate: float, baseline_steps: int, run_steps: int, signals: int, drift: float,
                  correlations: tuple[float, ...] = ()) -> float:
    """The h at which an in-control run raises a false alarm with probability `false_alarm_rate`: the smallest
    simulated run maximum at which the chance that every signal stays under it reaches 1 - false_alarm_rate.
    `correlations`: each fitted signal's lag-one correlation; the signals not listed are independent steps."""
    if not 0 < false_alarm_rate < 1:
        raise ValueError(f"false_alarm_rate must be in (0, 1), got {false_alarm_rate}")
    if len(correlations) > signals:
        raise ValueError(f"{len(correlations)} correlations for {signals} signals")
    per_signal = [signal_maxima(round(c, 2), baseline_steps, run_steps, drift)
                  for c in (*correlations, *[0.0] * (signals - len(correlations)))]

    def stays_under(h: float) -> float:
        return math.prod(bisect.bisect_right(maxima, h) / len(maxima) for maxima in per_signal)

    candidates = sorted({m for maxima in per_signal for m in maxima})
    low, high = 0, len(candidates) - 1  # stays_under rises with h: the first candidate that reaches the target
    while low < high:
        middle = (low + high) // 2
        if stays_under(candidates[middle]) >= 1 - false_alarm_rate:
            high = middle
        else:
            low = middle + 1
    return candidates[low]
