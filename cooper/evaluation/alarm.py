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

The test: a baseline mean and spread of each signal fitted on the first `baseline_steps` steps; then per signal a
one-sided CUSUM of the standardised excess z_t, S_t = max(0, S_{t-1} + z_t - k). The alarm raises when any S_t
exceeds h. It clears (hysteresis) only once, for every signal, the mean z over the last `clear_steps` steps is back
under k, that is once the run has stopped adding evidence; then the sums restart from zero. (Waiting for a sum to
fall back under h would hold the alarm for about S/k steps after the cause is gone, hundreds after a large hack.)

h comes from the false-alarm rate asked for, with the baseline's own uncertainty in it: a mean fitted on 20 steps
is off by about a fifth of a spread, which a CUSUM sums step after step (textbook thresholds, which assume the
in-control mean known, then raise false alarms in about half of 400-step runs). So h is the (1 - false_alarm_rate)
quantile of the run's highest statistic over simulated in-control runs that fit their baseline the same way:
i.i.d. normal signals, `baseline_steps` to fit, `run_steps` to watch (`threshold_for`, seeded, computed once per
setting). Real signals are neither normal nor independent; the runs in docs/experiments.md measure what that costs.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# signal -> +1 when a hack moves it up, -1 when down
SIGNALS: dict[str, int] = {"rm_false_positive_share": 1, "rm_auroc": -1, "reward_accuracy_gap": 1}
KL_KEY = "kl_from_initial"
SIMULATED_RUNS = 1000
MIN_AUROC_SUPPORT = 4


@functools.lru_cache(maxsize=16)
def threshold_for(false_alarm_rate: float, baseline_steps: int, run_steps: int, signals: int, drift: float) -> float:
    """The h at which an in-control run (module docstring) raises a false alarm with probability
    `false_alarm_rate`: that quantile of the run maximum over SIMULATED_RUNS seeded simulations."""
    if not 0 < false_alarm_rate < 1:
        raise ValueError(f"false_alarm_rate must be in (0, 1), got {false_alarm_rate}")
    rng = random.Random(0)
    maxima = []
    for _ in range(SIMULATED_RUNS):
        highest = 0.0
        for _ in range(signals):
            baseline = [rng.gauss(0.0, 1.0) for _ in range(baseline_steps)]
            mean, spread = statistics.fmean(baseline), statistics.stdev(baseline)
            total = 0.0
            for _ in range(run_steps - baseline_steps):
                total = max(0.0, total + (rng.gauss(0.0, 1.0) - mean) / spread - drift)
                highest = max(highest, total)
        maxima.append(highest)
    maxima.sort()
    return maxima[min(len(maxima) - 1, math.ceil((1 - false_alarm_rate) * len(maxima)) - 1)]


@dataclass(frozen=True)
class AlarmSettings:
    baseline_steps: int = 30
    drift: float = 0.5  # k: the excess, in baseline spreads, that a step must show to count against the run
    false_alarm_rate: float = 0.1  # per run, over `run_steps`
    run_steps: int = 400
    min_spread: float = 0.05  # a floor on a signal's baseline spread: 20 steps can look near-constant by chance
    clear_steps: int = 10
    fixed_threshold: float | None = None  # h itself, instead of the one calibrated for false_alarm_rate

    def __post_init__(self) -> None:
        if self.baseline_steps < 2:
            raise ValueError(f"baseline_steps must be >= 2 to estimate a spread, got {self.baseline_steps}")
        if not 0 < self.false_alarm_rate < 1:
            raise ValueError(f"false_alarm_rate must be in (0, 1), got {self.false_alarm_rate}")
        if self.drift <= 0 or self.min_spread <= 0 or self.clear_steps < 1:
            raise ValueError("drift and min_spread must be > 0, clear_steps >= 1")
        if self.run_steps <= self.baseline_steps:
            raise ValueError(f"run_steps ({self.run_steps}) must exceed baseline_steps ({self.baseline_steps})")

    @property
    def threshold(self) -> float:
        if self.fixed_threshold is not None:
            return self.fixed_threshold
        return threshold_for(self.false_alarm_rate, self.baseline_steps, self.run_steps, len(SIGNALS), self.drift)


def _defined(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def signal_values(record: Mapping[str, Any]) -> dict[str, float]:
    """The signals of one step's metrics record that are defined (AUROC is undefined when every rollout is right
    or every one wrong); the gap per unit of sqrt(KL) where the record carries KL."""
    values: dict[str, float] = {}
    for name in ("rm_auroc", "reward_accuracy_gap"):
        if _defined(record.get(name)):
            values[name] = float(record[name])
    if record.get("rm_auroc_support", MIN_AUROC_SUPPORT) < MIN_AUROC_SUPPORT:
        values.pop("rm_auroc", None)  # too few rollouts of one kind for a ranking to be evidence
    rate, accuracy = record.get("rm_false_positive_rate"), record.get("verifier_accuracy")
    if _defined(rate) and _defined(accuracy):
        values["rm_false_positive_share"] = float(rate) * (1.0 - float(accuracy))
    kl = record.get(KL_KEY)
    if "reward_accuracy_gap" in values and kl is not None and kl > 1.0:
        # Below one nat the policy has not moved enough for the division to mean anything (and it would blow up).
        values["reward_accuracy_gap"] /= math.sqrt(kl)
    return values


@dataclass
class Observation:
    step: int
    state: str  # "baseline" (still fitting), "clear" or "alarm"
    raised: bool  # the alarm went up at this step
    cleared: bool  # the alarm went down at this step
    statistics: dict[str, float]  # each signal's CUSUM, in units of the threshold's own (compare with `threshold`)
    threshold: float
    trigger: str | None  # the signal whose statistic is highest while alarmed


@dataclass
class HackingAlarm:
    """Feed it each step's metrics record in order (`observe`); it says when a hack starts and when it is over."""

    settings: AlarmSettings = field(default_factory=AlarmSettings)
    baseline: dict[str, list[float]] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    fitted: dict[str, tuple[float, float]] = field(default_factory=dict)  # signal -> (mean, spread)
    recent: dict[str, list[float]] = field(default_factory=dict)  # each signal's last clear_steps excesses z
    alarmed: bool = False
    steps_seen: int = 0

    def observe(self, step: int, record: Mapping[str, Any]) -> Observation:
        values = signal_values(record)
        threshold = self.settings.threshold
        self.steps_seen += 1
        if self.steps_seen <= self.settings.baseline_steps:
            for name, value in values.items():
                self.baseline.setdefault(name, []).append(value)
            if self.steps_seen == self.settings.baseline_steps:
                self._fit()
            return Observation(step, "baseline", False, False, {}, threshold, None)
        for name, value in values.items():
            if name not in self.fitted:
                continue  # never defined during the baseline: nothing to compare against
            mean, spread = self.fitted[name]
            excess = SIGNALS[name] * (value - mean) / spread
            self.sums[name] = max(0.0, self.sums.get(name, 0.0) + excess - self.settings.drift)
            self.recent[name] = (self.recent.get(name, []) + [excess])[-self.settings.clear_steps :]
        raised = cleared = False
        if not self.alarmed and max(self.sums.values(), default=0.0) > threshold:
            self.alarmed = raised = True
            self.recent = {}  # the clearing window starts at the alarm
        elif self.alarmed and self._settled():
            self.alarmed, cleared = False, True
            self.sums = {name: 0.0 for name in self.sums}
        trigger = max(self.sums, key=self.sums.__getitem__) if self.alarmed and self.sums else None
        return Observation(step, "alarm" if self.alarmed else "clear", raised, cleared, dict(self.sums), threshold,
                           trigger)

    def _settled(self) -> bool:
        windows = self.recent.values()
        return bool(self.recent) and all(len(w) == self.settings.clear_steps and statistics.fmean(w) < self.settings.drift
                                         for w in windows)

    def _fit(self) -> None:
        for name, values in self.baseline.items():
            if len(values) >= 2:
                self.fitted[name] = (statistics.fmean(values),
                                     max(statistics.stdev(values), self.settings.min_spread))

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on where this one stopped (JSON-serialisable)."""
        return {"baseline": self.baseline, "sums": self.sums, "fitted": {k: list(v) for k, v in self.fitted.items()},
                "recent": self.recent, "alarmed": self.alarmed, "steps_seen": self.steps_seen}

    @classmethod
    def from_state(cls, settings: AlarmSettings, state: Mapping[str, Any]) -> HackingAlarm:
        return cls(settings, {k: list(v) for k, v in state["baseline"].items()}, dict(state["sums"]),
                   {k: (v[0], v[1]) for k, v in state["fitted"].items()},
                   {k: list(v) for k, v in state["recent"].items()}, bool(state["alarmed"]), int(state["steps_seen"]))
