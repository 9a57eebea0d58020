"""The run's picture (plot.png, drawn when `cooper train` ends) and the reward-hacking alarm's marks on a per-step
panel, which the experiment's figures draw too."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cooper import metric_names as names
from cooper.metric_names import REWARD_MEAN, STEP, TEST, VERIFIER_ACCURACY
from cooper.modes import reward_mode

PLOTTED = [(REWARD_MEAN, "training reward"), (VERIFIER_ACCURACY, "rollout verifier accuracy")]


def plot(records: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Training reward, rollout verifier accuracy and test accuracy per step, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    steps = [r[STEP] for r in records]
    for key, label in PLOTTED:
        ax.plot(steps, [r.get(key, math.nan) for r in records], marker=".", label=label)
    test_keys = sorted({k for r in records for k in r if k.startswith(TEST)})
    for key in test_keys:
        points = [(r[STEP], r[key]) for r in records if key in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", linestyle="--",
                label=f"test accuracy ({key.removeprefix(TEST)})")
    from matplotlib.ticker import MaxNLocator

    mark_alarm(ax, records, "tab:gray")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title or "Cooper run")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def action_spans(records: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """The runs of consecutive steps (first, last) in which a reward-hacking alarm action was in force: the policy
    trained on the verifier's reward instead of the reward model's, was rolled back, or VerifyRM's update was raised
    (rule mode, whose reward is always the verifier's, has none)."""
    spans: list[tuple[int, int]] = []
    for r in records:
        reward_model_pays = names.MODE not in r or reward_mode(r[names.MODE]).reward_model_scores
        acting = (reward_model_pays and r.get(names.REWARD_SOURCE) in ("verifier", "rollback")) or bool(
            r.get(names.ALARM_RM_NEGATIVES))
        if not acting:
            continue
        step = int(r[names.STEP])
        if spans and spans[-1][1] == step - 1:
            spans[-1] = (spans[-1][0], step)
        else:
            spans.append((step, step))
    return spans


def mark_alarm(ax, records: Sequence[Mapping[str, Any]], color: str | None) -> None:  # type: ignore[no-untyped-def]
    """On a per-step panel: a dotted line at each raise of the reward-hacking alarm, a dash-dot line at each
    rollback, and a faint band over the steps an action was in force."""
    for r in records:
        if r.get(names.ALARM_EVENT) == "raised":
            ax.axvline(r[names.STEP], color=color, linestyle=":", linewidth=1.0, alpha=0.7)
        if names.ALARM_ROLLED_BACK_TO in r:
            ax.axvline(r[names.STEP], color=color, linestyle="-.", linewidth=1.2, alpha=0.9)
    for first, last in action_spans(records):
        ax.axvspan(first - 0.5, last + 0.5, color=color, alpha=0.05, linewidth=0)
