"""The experiment's pictures: the over-optimisation plot (Gao et al. 2022) and VerifyRM's health per step.

Both take runs as {mode: [records of seed 0, records of seed 1, ...]} and draw the mean over seeds per step (thin
lines for single seeds where that helps), so that one noisy seed neither hides nor fakes an effect.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cooper import metric_names as names
from cooper.experiments.best_of_n import BestOfN
from cooper.modes import reward_mode

Runs = Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]
COLORS = {"rule": "tab:blue", "static": "tab:red", "cooper": "tab:green", "cooper-rollouts": "tab:cyan",
          "cooper-paper": "tab:olive"}


def mean_over_seeds(seeds: Sequence[Sequence[Mapping[str, Any]]], key: str) -> list[tuple[int, float]]:
    """(step, mean of `key` over the seeds that logged it at that step), in step order."""
    by_step: dict[int, list[float]] = {}
    for records in seeds:
        for r in records:
            value = r.get(key)
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                by_step.setdefault(int(r[names.STEP]), []).append(float(value))
    return sorted((step, statistics.fmean(values)) for step, values in by_step.items())


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what there is)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def finish_panel(ax, title: str, fontsize: int = 9) -> None:  # type: ignore[no-untyped-def]
    """Title, a 0-1 y axis, a grid, and a legend when anything is labelled."""
    ax.set_title(title, fontsize=fontsize)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize - 2)


def save(fig, path: Path) -> Path:  # type: ignore[no-untyped-def]
    fig.tight_layout()
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _reward_model_pays(seeds: Sequence[Sequence[Mapping[str, Any]]]) -> bool:
    """Whether these runs' training reward was VerifyRM's, by the reward mode their records name (cooper/modes.py)."""
    return any(reward_mode(records[0][names.MODE]).reward_model_scores
               for records in seeds if records and names.MODE in records[0])


def bin_means(values: Sequence[float], bins: int) -> list[float]:
    """Means of `bins` consecutive, equal runs of `values` (the last run takes the remainder)."""
    size = max(1, len(values) // bins)
    return [sum(chunk) / len(chunk) for chunk in (values[i : i + size] for i in range(0, len(values), size))]


def overoptimization_plot(runs: Runs, path: Path, best_of_n: Sequence[BestOfN] = (), bins: int = 12) -> Path:
    """Gold (rollout verifier accuracy, solid) and proxy (training reward, dotted) against sqrt(KL to the initial
    policy), one pair per mode, plus best-of-n of the initial RM as the no-training baseline (grey). Each point is
    the mean over a run of consecutive steps (`bins` per run): one step's KL estimate from one batch is too noisy to
    draw against."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    for mode, seeds in runs.items():
        kl = dict(mean_over_seeds(seeds, names.KL_FROM_INITIAL))
        gold = dict(mean_over_seeds(seeds, names.VERIFIER_ACCURACY))
        proxy = dict(mean_over_seeds(seeds, names.REWARD_MEAN))
        steps = [s for s in sorted(kl) if s in gold]
        if not steps:
            continue
        x = [math.sqrt(max(0.0, v)) for v in bin_means([kl[s] for s in steps], bins)]
        ax.plot(x, bin_means([gold[s] for s in steps], bins), color=COLORS.get(mode), marker=".",
                label=f"{mode}: verifier (gold)")
        if _reward_model_pays(seeds):  # else the reward is the verifier's verdict: proxy and gold are one line
            ax.plot(x, bin_means([proxy[s] for s in steps], bins), color=COLORS.get(mode), linestyle=":",
                    label=f"{mode}: training reward (proxy)")
    if best_of_n:
        x = [math.sqrt(p.kl) for p in best_of_n]
        ax.plot(x, [p.gold for p in best_of_n], color="grey", marker="o", label="best-of-n, initial RM: gold")
        ax.plot(x, [p.proxy for p in best_of_n], color="grey", marker="o", linestyle=":",
                label="best-of-n, initial RM: proxy")
        for p in best_of_n:
            ax.annotate(f"n={p.n}", (math.sqrt(p.kl), p.gold), fontsize=7, color="grey", xytext=(2, -9),
                        textcoords="offset points")
    ax.set_xlabel("sqrt(KL from the initial policy)  [nats^0.5]")
    ax.set_ylabel("accuracy / reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Over-optimisation: gold vs proxy (mean over seeds, {bins} bins of steps per run)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


HEALTH_PANELS = [
    (names.RM_AUROC, "AUROC of VerifyRM vs verifier (policy samples)"),
    (names.RM_FALSE_POSITIVE_RATE, "false-positive rate on verifier-wrong samples"),
    ("pair_accuracy", "pair accuracy before (dotted) / after the update"),
]


def rm_health_plot(runs: Runs, path: Path, window: int = 5) -> Path:
    """Threshold-free VerifyRM health per step: AUROC and false-positive rate per mode, pair accuracy (cooper)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(HEALTH_PANELS), figsize=(4.4 * len(HEALTH_PANELS), 3.8), dpi=110)
    for ax, (key, title) in zip(axes, HEALTH_PANELS, strict=True):
        for mode, seeds in runs.items():
            if key == "pair_accuracy":
                series = [(names.PAIR_ACCURACY_BEFORE, ":"), (names.PAIR_ACCURACY_AFTER, "-")]
            else:
                series = [(key, "-")]
            for name, style in series:
                points = mean_over_seeds(seeds, name)
                if points:
                    ax.plot([p[0] for p in points], smooth([p[1] for p in points], window), linestyle=style,
                            color=COLORS.get(mode), label=f"{mode}" + ("" if style == "-" else " (before)"))
        ax.set_xlabel("step")
        finish_panel(ax, title)
    return save(fig, path)
