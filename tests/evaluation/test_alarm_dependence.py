"""The alarm's threshold on signals whose steps depend on the last one (AR(1)), the way one slowly moving policy's
do: the false-alarm rate asked for holds at correlations 0, 0.3 and 0.6, and a real shift is still found."""

from __future__ import annotations

import math
import random

import pytest

from cooper.evaluation.alarm import AlarmSettings, HackingAlarm
from cooper.evaluation.alarm_threshold import lag_one_correlation, threshold_for

SETTINGS = AlarmSettings()  # a run's defaults: 30 baseline steps, 400-step runs, 10% false alarms per run
RUNS = 200


def ar1_records(rng: random.Random, correlation: float, steps: int = 400, shift_from: int | None = None,
                shift: float = 0.0) -> list[dict[str, float]]:
    """One in-control run's records: each of the three signals an AR(1) with `correlation` (stationary, its own
    draws); from `shift_from`, the false-positive rate `shift` of its marginal spreads higher."""
    innovation = math.sqrt(1 - correlation**2)
    state = [rng.gauss(0, 1) for _ in range(3)]
    records = []
    for step in range(steps):
        rate = 0.5 + 0.15 * (state[0] + (shift if shift_from is not None and step >= shift_from else 0.0))
        # the share the alarm watches is rate x 0.6: a spread of 0.09, well above the alarm's floor of 0.05
        records.append({"rm_false_positive_rate": rate, "verifier_accuracy": 0.4,
                        "rm_auroc": 0.8 + 0.1 * state[1], "reward_accuracy_gap": 0.1 + 0.1 * state[2]})
        state = [correlation * x + innovation * rng.gauss(0, 1) for x in state]
    return records


def first_raise(records: list[dict[str, float]]) -> int | None:
    alarm = HackingAlarm(SETTINGS)
    for step, record in enumerate(records):
        if alarm.observe(step, record).raised:
            return step
    return None


@pytest.mark.parametrize("correlation", [0.0, 0.3, 0.6])
def test_the_false_alarm_rate_holds_at_the_signals_correlation(correlation: float) -> None:
    # 200 in-control 400-step runs per correlation, seeds the calibration never drew. With a threshold calibrated
    # on independent steps the shares were 0.01, 0.20 and 0.60 (docs/alarm.md); asked: 0.10, within sampling
    # error (sd ~0.021) and the error of a correlation fitted on 30 steps.
    raised = sum(first_raise(ar1_records(random.Random(f"ar1:{correlation}:{seed}"), correlation)) is not None
                 for seed in range(RUNS))
    assert 0.02 <= raised / RUNS <= 0.18, f"{raised} of {RUNS} in-control runs raised at correlation {correlation}"


@pytest.mark.parametrize(("correlation", "median_at_most"), [(0.0, 15), (0.3, 30)])
def test_a_shift_is_still_found_at_the_signals_correlation(correlation: float, median_at_most: int) -> None:
    # The false-positive rate 2 marginal spreads higher from step 150 on: found in every run, the median delay
    # within `median_at_most` steps (a correlated signal carries less evidence per step, so it takes longer).
    delays = []
    for seed in range(30):
        rng = random.Random(f"shift:{correlation}:{seed}")
        step = first_raise(ar1_records(rng, correlation, shift_from=150, shift=2.0))
        assert step is not None, f"seed {seed}: a 2-spread shift for 250 steps was never found"
        delays.append(max(0, step - 150))
    delays.sort()
    assert delays[len(delays) // 2] <= median_at_most


def test_the_fitted_correlation_is_near_the_true_one_and_clipped() -> None:
    for correlation in (0.0, 0.3, 0.6):
        rng = random.Random(f"fit:{correlation}")
        fits = []
        for _ in range(200):
            x, values = rng.gauss(0, 1), []
            for _ in range(30):
                values.append(x)
                x = correlation * x + math.sqrt(1 - correlation**2) * rng.gauss(0, 1)
            fits.append(lag_one_correlation(values))
        # clipped at 0, so at 0 the mean sits above it; the short-sample bias is corrected
        assert abs(sum(fits) / len(fits) - correlation) < 0.1
    alternating = [(-1.0) ** i for i in range(30)]
    assert lag_one_correlation(alternating) == 0.0
    assert lag_one_correlation([float(i) for i in range(30)]) == 0.9


def test_a_correlated_baseline_needs_more_evidence() -> None:
    independent = threshold_for(0.1, 30, 400, 3, 0.5)
    assert independent < threshold_for(0.1, 30, 400, 3, 0.5, (0.3, 0.3, 0.3)) < threshold_for(
        0.1, 30, 400, 3, 0.5, (0.6, 0.6, 0.6))
    assert threshold_for(0.1, 30, 400, 3, 0.5, (0.6,)) < threshold_for(0.1, 30, 400, 3, 0.5, (0.6, 0.6, 0.6))


def test_the_threshold_reported_is_the_fitted_one() -> None:
    alarm = HackingAlarm(SETTINGS)
    observations = [alarm.observe(step, record)
                    for step, record in enumerate(ar1_records(random.Random("reported"), 0.6, steps=40))]
    assert observations[0].threshold == SETTINGS.threshold  # before the fit: independent steps
    fitted = tuple(fit.correlation for fit in alarm.fitted.values())
    assert observations[-1].threshold == SETTINGS.threshold_at(fitted) > SETTINGS.threshold
