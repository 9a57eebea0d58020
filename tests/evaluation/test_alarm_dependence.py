"""The alarm's threshold on signals whose steps depend on the last one (AR(1)), the way one slowly moving policy's
do: the false-alarm rate asked for holds at correlations 0, 0.3 and 0.6, and a real shift is still found. Those runs
are the calibration's own model, so they check its machinery (the fit, the simulation, the quantile); an honest run
simulated from its rollouts, with a policy that improves, checks the promise on signals that are no AR(1)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from cooper.evaluation.alarm import AlarmSettings, HackingAlarm
from cooper.evaluation.alarm_threshold import lag_one_correlation, threshold_for
from cooper.evaluation.monitor import auroc, false_positive_rate
from cooper.reward_rule import accepts

SETTINGS = AlarmSettings()  # a run's defaults: 30 baseline steps, 400-step runs, 10% false alarms per run
RUNS = 200
PROMPTS, GROUP = 8, 4  # the tiny preset's step


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


def improving_rollouts(rng: np.random.Generator, steps: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """An honest run's rollouts, (VerifyRM's logits, the verifier's verdicts), each (steps, PROMPTS x GROUP) grouped
    by prompt: the policy improves, its accuracy's logit rising from -0.8 to 2.5 (0.31 to 0.92) fast then slowly
    (time constant 150 steps); prompts differ in difficulty (spread 1.2 logits); VerifyRM's logit is 1.5 on a right
    rollout and -1.2 on a wrong one, plus a leaning per prompt that its rollouts share (spread 0.8) and noise per
    rollout (1.0), so it accepts about a fifth of the wrong ones throughout: no hack."""
    skill = -0.8 + 3.3 * (1 - np.exp(-np.arange(steps) / 150))
    difficulty = rng.normal(0.0, 1.2, (steps, PROMPTS, 1))
    correct = rng.random((steps, PROMPTS, GROUP)) < 1 / (1 + np.exp(difficulty - skill[:, None, None]))
    leaning = rng.normal(0.0, 0.8, (steps, PROMPTS, 1))
    logits = np.where(correct, 1.5, -1.2) + leaning + rng.normal(0.0, 1.0, (steps, PROMPTS, GROUP))
    return logits.reshape(steps, -1), correct.reshape(steps, -1)


def rollout_records(logits: np.ndarray, correct: np.ndarray) -> list[dict]:
    """The steps' records as the driver's step_record computes them from the rollouts, all steps at once (its
    monitor.auroc and false_positive_rate; continuous logits have no ties to average), with KL from the initial policy
    growing to 8 nats. Not an AR(1): each signal drifts with the policy, its noise is binomial and changes as the
    policy improves, and the AUROC goes missing on the steps (14%) with fewer than MIN_AUROC_SUPPORT wrong rollouts."""
    steps, rollouts = correct.shape
    right = correct.sum(axis=1)
    wrong = rollouts - right
    rank_sum = np.where(correct, logits.argsort(axis=1).argsort(axis=1) + 1, 0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        aurocs = (rank_sum - right * (right + 1) / 2) / (right * wrong)
        false_positive_rates = ((logits > 0) & ~correct).sum(axis=1) / wrong
    accuracy = right / rollouts
    gap = (1 / (1 + np.exp(-logits))).mean(axis=1) - accuracy  # VerifyRM pays sigmoid(logit)
    kl = 8.0 * (1 - np.exp(-np.arange(steps) / 150))
    return [{"verifier_accuracy": float(accuracy[t]), "reward_accuracy_gap": float(gap[t]),
             "rm_auroc": float(aurocs[t]) if right[t] and wrong[t] else None,
             "rm_auroc_support": int(min(right[t], wrong[t])),
             "rm_false_positive_rate": float(false_positive_rates[t]) if wrong[t] else None,
             "rollouts": rollouts, "kl_from_initial": float(kl[t])} for t in range(steps)]


def test_the_false_alarm_rate_holds_on_an_improving_policy_simulated_from_its_rollouts() -> None:
    # Promised: at most 10% of honest 400-step runs raise (alarm.false_alarm_rate). Measured 7 of 200 (2026-11-28);
    # with the AUROC read even on steps with one wrong rollout (no support floor), 22 of 200.
    runs = [improving_rollouts(np.random.default_rng([300, seed])) for seed in range(RUNS)]
    logits, correct = runs[0]
    for record, step_logits, step_correct in zip(rollout_records(logits, correct), logits.tolist(),
                                                 correct.tolist(), strict=True):
        expected = auroc(step_logits, step_correct), false_positive_rate([accepts(x) for x in step_logits], step_correct)
        got = record["rm_auroc"], record["rm_false_positive_rate"]
        assert got == tuple(value if value is None else pytest.approx(value) for value in expected)
    raised = sum(first_raise(rollout_records(*run)) is not None for run in runs)
    assert raised <= 0.10 * RUNS, f"{raised} of {RUNS} honest runs of an improving policy raised"


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
