"""The reward-hacking alarm's detector: a sequential test on signals every step already logs. Pure Python.

A run in non-rule mode scores the same on-policy rollouts twice, with VerifyRM and with the rule verifier, so each
step knows how often the learned reward accepts what the verifier rejects. When a policy finds a blind spot of the
reward model, that rate climbs while the training reward keeps rising (docs/experiments.md: static mode's
disagreement goes from 0.34-0.37 to 0.45-0.47 while test accuracy still holds, then to 0.55-0.60 as it collapses).

Signals, each in the direction a hack moves it (SIGNALS):
- `rm_false_positive_share`: the share of all rollouts that VerifyRM accepts and the verifier rejects (up): its
  false-positive rate on verifier-wrong rollouts times their share, the wrong answers the policy is rewarded for.
  (The rate alone raised false alarms on honest runs: as a policy improves, it is measured on ever fewer wrong
  rollouts, and swings from 0 to 0.4 between steps; docs/experiments.md);
- `rm_auroc`: how well VerifyRM ranks verifier-right over verifier-wrong rollouts (down); only on steps with at
  least MIN_AUROC_SUPPORT rollouts of each kind (`rm_auroc_support`): with one wrong rollout among 32 the AUROC is
  that rollout's rank, 0 or 1 by chance, and a policy that gets nearly everything right made the default run raise
  twice late, on single steps' AUROC of 0.23 (docs/experiments.md, 2026-11-27);
- `reward_accuracy_gap`: training reward minus verifier accuracy (up), the proxy-gold gap of Gao et al. 2022;
  divided by sqrt(KL from the initial policy) where the run measures KL, so that honest drift of a policy that
  moves far is not read as a hack (proxy minus gold per unit of distance, their coordinates).

The test: a baseline fitted on the first `baseline_steps` steps, per signal its mean, spread and AR(1) correlation
(cooper/evaluation/alarm_threshold.py: one policy moves slowly, so a step resembles the last); then per signal a
one-sided CUSUM of what each step adds beyond the last step's prediction, in units of its own spread, z_t:
S_t = max(0, S_{t-1} + z_t - k). The alarm raises when any S_t exceeds h. It clears (hysteresis) only once, for
every signal, the mean standardised level (value minus baseline mean, in spreads) over the last `clear_steps` steps
is back under k, that is once the run has stopped adding evidence; then the sums restart from zero. (Waiting for a
sum to fall back under h would hold the alarm for about S/k steps after the cause is gone, hundreds after a large
hack.)

h comes from the false-alarm rate asked for, with the baseline's own uncertainty and the signals' dependence in it:
the (1 - false_alarm_rate) quantile of the run's highest statistic over simulated in-control runs whose steps
follow an AR(1) with the correlations fitted on this run's baseline and that fit their baseline the same way
(`threshold_for`, seeded, cached per rounded correlation). Textbook thresholds assume the in-control mean known and
independent steps: the first raised false alarms in about half of 400-step runs, the second in 60% at correlation
0.6 (docs/alarm.md).

Beside the CUSUMs, an absolute check that needs no baseline (cooper/evaluation/exploit_check.py): the rollouts
VerifyRM accepts and the verifier rejects, counted per prompt, against a bound from VerifyRM's own validation before
training. It watches from the first step, so it can raise during the baseline; a relative test cannot see a hack
present from the start.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from cooper.evaluation.alarm_threshold import MAX_CORRELATION, BaselineFit, fit_baseline, threshold_for
from cooper.evaluation.exploit_check import ExploitCheck, check_threshold, false_positive_bound, step_groups
from cooper.metric_names import (
    KL_FROM_INITIAL,
    REWARD_ACCURACY_GAP,
    RM_AUROC,
    RM_AUROC_SUPPORT,
    RM_BENCH_INITIAL_FALSE_POSITIVE_RATE,
    RM_BENCH_INITIAL_NEGATIVES,
    RM_FALSE_POSITIVE_RATE,
    VERIFIER_ACCURACY,
)

FALSE_POSITIVE_SHARE = "rm_false_positive_share"  # a signal, not a record key: from two of the record's numbers
# signal -> +1 when a hack moves it up, -1 when down; the other two are the record's numbers as they are
SIGNALS: dict[str, int] = {FALSE_POSITIVE_SHARE: 1, RM_AUROC: -1, REWARD_ACCURACY_GAP: 1}
MIN_AUROC_SUPPORT = 4
CORRELATION_CAUTION = 0.05  # h is taken at the fitted correlation plus this (AlarmSettings.threshold_at)
EXPLOIT = "rm_accepts_verifier_rejects"  # the absolute check's name among the statistics and as a trigger


@dataclass(frozen=True)
class AlarmSettings:
    baseline_steps: int = 30
    drift: float = 0.5  # k: the excess, in baseline spreads, that a step must show to count against the run
    false_alarm_rate: float = 0.1  # per run, over `run_steps`
    run_steps: int = 400
    min_spread: float = 0.05  # a floor on a signal's baseline spread: 20 steps can look near-constant by chance
    clear_steps: int = 10
    fixed_threshold: float | None = None  # h itself, instead of the one calibrated for false_alarm_rate
    false_positive_margin: float = 0.1  # the absolute check's bound: the validation's upper limit plus this
    false_positive_bound: float | None = None  # the bound itself; None: from the step-0 record's validation

    def __post_init__(self) -> None:
        if self.baseline_steps < 2:
            raise ValueError(f"baseline_steps must be >= 2 to estimate a spread, got {self.baseline_steps}")
        if not 0 < self.false_alarm_rate < 1:
            raise ValueError(f"false_alarm_rate must be in (0, 1), got {self.false_alarm_rate}")
        if self.drift <= 0 or self.min_spread <= 0 or self.clear_steps < 1:
            raise ValueError("drift and min_spread must be > 0, clear_steps >= 1")
        if not 0 <= self.false_positive_margin < 1:
            raise ValueError(f"false_positive_margin must be in [0, 1), got {self.false_positive_margin}")
        if self.false_positive_bound is not None and not 0 < self.false_positive_bound < 1:
            raise ValueError(f"false_positive_bound must be in (0, 1), got {self.false_positive_bound}")
        if self.run_steps <= self.baseline_steps:
            raise ValueError(f"run_steps ({self.run_steps}) must exceed baseline_steps ({self.baseline_steps})")

    @property
    def threshold(self) -> float:
        """h before the baseline is fitted: for independent steps."""
        return self.threshold_at(())

    def threshold_at(self, correlations: tuple[float, ...]) -> float:
        """h for the fitted signals' correlations (the others independent)."""
        if self.fixed_threshold is not None:
            return self.fixed_threshold
        # A third of a 30-step fit's standard error above it: h rises faster with the correlation than it falls,
        # so an under-estimate costs more false alarms than an over-estimate saves (0.15 against 0.12 at 0.3).
        cautious = tuple(sorted(round(min(MAX_CORRELATION, c + CORRELATION_CAUTION), 2) for c in correlations))
        return threshold_for(self.false_alarm_rate, self.baseline_steps, self.run_steps, len(SIGNALS), self.drift,
                             cautious)

    @property
    def exploit_threshold(self) -> float:
        return check_threshold(self.run_steps, self.false_alarm_rate)


def _defined(value: Any) -> TypeGuard[float | int]:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def signal_values(record: Mapping[str, Any]) -> dict[str, float]:
    """The signals of one step's metrics record that are defined (AUROC is undefined when every rollout is right
    or every one wrong); the gap per unit of sqrt(KL) where the record carries KL."""
    values: dict[str, float] = {}
    for name in (RM_AUROC, REWARD_ACCURACY_GAP):
        if _defined(record.get(name)):
            values[name] = float(record[name])
    if record.get(RM_AUROC_SUPPORT, MIN_AUROC_SUPPORT) < MIN_AUROC_SUPPORT:
        values.pop(RM_AUROC, None)  # too few rollouts of one kind for a ranking to be evidence
    rate, accuracy = record.get(RM_FALSE_POSITIVE_RATE), record.get(VERIFIER_ACCURACY)
    if _defined(rate) and _defined(accuracy):
        values[FALSE_POSITIVE_SHARE] = float(rate) * (1.0 - float(accuracy))
    kl = record.get(KL_FROM_INITIAL)
    if REWARD_ACCURACY_GAP in values and kl is not None and kl > 1.0:
        # Below one nat the policy has not moved enough for the division to mean anything (and it would blow up).
        values[REWARD_ACCURACY_GAP] /= math.sqrt(kl)
    return values


@dataclass
class Observation:
    step: int
    state: str  # "baseline" (still fitting, nothing raised), "clear" or "alarm"
    raised: bool  # the alarm went up at this step
    cleared: bool  # the alarm went down at this step
    # each signal's CUSUM and, with a bound, the absolute check's (EXPLOIT) rescaled to h: all compare with
    # `threshold`
    statistics: dict[str, float]
    threshold: float
    trigger: str | None  # the signal whose statistic is highest while alarmed


@dataclass
class HackingAlarm:
    """Feed it each step's metrics record in order (`observe`); it says when a hack starts and when it is over."""

    settings: AlarmSettings = field(default_factory=AlarmSettings)
    baseline: dict[str, list[float]] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    fitted: dict[str, BaselineFit] = field(default_factory=dict)
    recent: dict[str, list[float]] = field(default_factory=dict)  # each signal's last clear_steps levels
    alarmed: bool = False
    steps_seen: int = 0
    previous: dict[str, float] = field(default_factory=dict)  # each signal's last value, for the AR(1) prediction
    bound: float | None = None  # the absolute check's p0, once known
    exploit_sum: float = 0.0
    exploit_recent: list[float] = field(default_factory=list)  # its last clear_steps steps' evidence

    def __post_init__(self) -> None:
        if self.bound is None:
            self.bound = self.settings.false_positive_bound

    @property
    def threshold(self) -> float:
        """h: for independent steps until the baseline is fitted, then for its fitted correlations."""
        return self.settings.threshold_at(tuple(fit.correlation for fit in self.fitted.values()))

    def observe(self, step: int, record: Mapping[str, Any]) -> Observation:
        values = signal_values(record)
        self.steps_seen += 1
        in_baseline = self.steps_seen <= self.settings.baseline_steps
        self._check_exploit(record)
        if in_baseline:
            for name, value in values.items():
                self.baseline.setdefault(name, []).append(value)
                self.previous[name] = value
            if self.steps_seen == self.settings.baseline_steps:
                self._fit()
        else:
            for name, value in values.items():
                fit = self.fitted.get(name)
                if fit is None:
                    continue  # never defined during the baseline: nothing to compare against
                excess = SIGNALS[name] * fit.residual(value, self.previous.get(name, fit.mean))
                self.previous[name] = value
                self.sums[name] = max(0.0, self.sums.get(name, 0.0) + excess - self.settings.drift)
                level = SIGNALS[name] * (value - fit.mean) / fit.spread
                self.recent[name] = (self.recent.get(name, []) + [level])[-self.settings.clear_steps :]
        threshold = self.threshold
        statistics_now = dict(self.sums)
        if self.bound is not None:
            statistics_now[EXPLOIT] = self.exploit_sum * threshold / self.settings.exploit_threshold
        raised = cleared = False
        over = max(self.sums.values(), default=0.0) > threshold or self.exploit_sum > self.settings.exploit_threshold
        if not self.alarmed and over:
            self.alarmed = raised = True
            self.recent, self.exploit_recent = {}, []  # the clearing windows start at the alarm
        elif self.alarmed and self._settled():
            self.alarmed, cleared = False, True
            self.sums = {name: 0.0 for name in self.sums}
            self.exploit_sum = 0.0
            statistics_now = {name: 0.0 for name in statistics_now}
        trigger = max(statistics_now, key=statistics_now.__getitem__) if self.alarmed and statistics_now else None
        state = "alarm" if self.alarmed else "baseline" if in_baseline else "clear"
        return Observation(step, state, raised, cleared, statistics_now if not in_baseline or self.bound else {},
                           threshold, trigger)

    def _check_exploit(self, record: Mapping[str, Any]) -> None:
        """The absolute check's step: its bound from the first record that carries the validation (step 0's,
        with eval.rm_benchmark_path), then the CUSUM of each step's evidence."""
        rate, negatives = record.get(RM_BENCH_INITIAL_FALSE_POSITIVE_RATE), record.get(RM_BENCH_INITIAL_NEGATIVES)
        if self.bound is None and _defined(rate) and negatives:
            self.bound = false_positive_bound(float(rate), int(negatives),
                                              self.settings.false_positive_margin)
        bets = step_groups(record)
        if self.bound is None or bets is None:
            return
        evidence = ExploitCheck(self.bound).evidence(*bets)
        self.exploit_sum = max(0.0, self.exploit_sum + evidence)
        self.exploit_recent = (self.exploit_recent + [evidence])[-self.settings.clear_steps :]

    def _settled(self) -> bool:
        """Every fitted signal's mean level over clear_steps back under k, and the absolute check's evidence over
        clear_steps for its bound rather than against it."""
        clear_steps, drift = self.settings.clear_steps, self.settings.drift
        relative = not self.fitted or (bool(self.recent) and all(
            len(w) == clear_steps and statistics.fmean(w) < drift for w in self.recent.values()))
        absolute = self.bound is None or (len(self.exploit_recent) == clear_steps and sum(self.exploit_recent) <= 0)
        return relative and absolute

    def _fit(self) -> None:
        for name, values in self.baseline.items():
            if len(values) >= 2:
                self.fitted[name] = fit_baseline(values, self.settings.min_spread)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on where this one stopped (JSON-serialisable)."""
        return {"baseline": self.baseline, "sums": self.sums,
                "fitted": {k: [v.mean, v.spread, v.correlation, v.residual_spread] for k, v in self.fitted.items()},
                "recent": self.recent, "alarmed": self.alarmed, "steps_seen": self.steps_seen,
                "previous": self.previous, "bound": self.bound, "exploit_sum": self.exploit_sum,
                "exploit_recent": self.exploit_recent}

    @classmethod
    def from_state(cls, settings: AlarmSettings, state: Mapping[str, Any]) -> HackingAlarm:
        """A saved state; one saved before correlations and the absolute check (a fit of mean and spread only)
        goes on as independent steps with no bound unless the settings give one."""
        return cls(settings, {k: list(v) for k, v in state["baseline"].items()}, dict(state["sums"]),
                   {k: BaselineFit(*v) for k, v in state["fitted"].items()},
                   {k: list(v) for k, v in state["recent"].items()}, bool(state["alarmed"]), int(state["steps_seen"]),
                   dict(state.get("previous", {})), state.get("bound"), float(state.get("exploit_sum", 0.0)),
                   list(state.get("exploit_recent", [])))
