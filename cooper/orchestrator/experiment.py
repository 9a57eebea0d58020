"""`cooper experiment`: the three reward modes on the same data and seed, one after another, and their curves.

This is the paper's comparison in one command: rule (the verifier's 1/0), static (a frozen VerifyRM, which the
policy learns to exploit) and cooper (VerifyRM trained alongside). Each mode is an ordinary run in
`<output_dir>/<name>-<mode>/`; the comparison plot and table go to `<output_dir>/<name>/`.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from cooper.config import CooperConfig
from cooper.orchestrator.outputs import read_metrics

MODES = ("rule", "static", "cooper")
COLORS = {"rule": "tab:blue", "static": "tab:red", "cooper": "tab:green"}
PANELS = [("reward_mean", "training reward"), ("verifier_accuracy", "rollout verifier accuracy"),
          ("rm_verifier_disagreement", "VerifyRM vs verifier disagreement")]


def compare_plot(runs: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """One panel per monitored quantity (and per benchmark's test accuracy), one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    tests = sorted({k for records in runs.values() for r in records for k in r if k.startswith("test/")})
    panels = PANELS + [(k, f"test accuracy ({k[5:]})") for k in tests]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), dpi=110, squeeze=False)
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        for mode, records in runs.items():
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) > 1 else "o",
                        label=mode, color=COLORS.get(mode))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def compare_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Last-step numbers per mode: what the paper's table reports, plus the hacking monitor."""
    keys = ["reward_mean", "verifier_accuracy", "rm_verifier_disagreement"]
    keys += sorted({k for records in runs.values() for r in records for k in r if k.startswith("test/")})
    rows = [["mode", *keys]]
    for mode, records in runs.items():
        rows.append([mode, *[_fmt(_last_value(records, k)) for k in keys]])
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def _last_value(records: list[dict[str, Any]], key: str) -> Any:
    return next((r[key] for r in reversed(records) if r.get(key) is not None), None)


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def run_experiment(config: CooperConfig, modes: tuple[str, ...] = MODES, progress: bool = True) -> Path:
    from cooper.config import with_overrides
    from cooper.orchestrator.launch import train

    name = config.run.name or f"experiment-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(config.run.output_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {}
    for mode in modes:
        run_dir = train(with_overrides(config, [f"run.mode={mode}", f"run.name={name}-{mode}"]), progress=progress)
        runs[mode] = read_metrics(run_dir)
    compare_plot(runs, out / "compare.png")
    (out / "runs.json").write_text(json.dumps({m: f"{name}-{m}" for m in modes}, indent=2))
    table = compare_table(runs)
    (out / "summary.txt").write_text(table + "\n")
    print(f"\n{table}\n\ncomparison: {out / 'compare.png'}")
    return out
