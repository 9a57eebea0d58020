"""`cooper experiment`: the three reward modes on the same data, models and seeds, and the pictures that compare them.

This is the paper's comparison in one command: rule (the verifier's 1/0), static (a frozen VerifyRM, which the
policy learns to exploit) and cooper (VerifyRM trained alongside). Each (mode, seed) is an ordinary `cooper train`
run in `<output_dir>/<name>-<mode>-s<seed>/`, started as a process of its own so that several can share the machine
(`--parallel`); every run gets the identical config but for `run.mode` and `run.seed`. Before the runs, best-of-n
of the initial VerifyRM against the initial policy measures the RM's blind spots without any training (the baseline
of the over-optimisation plot). The comparison goes to `<output_dir>/<name>/`: compare.png, overoptimization.png,
rm_health.png, best_of_n.json, results.md (the table) and results.json (the reproduction verdict,
cooper/experiments/reproduction.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from cooper.config import CooperConfig
from cooper.experiments.figures import (
    COLORS,
    finish_panel,
    mean_over_seeds,
    overoptimization_plot,
    rm_health_plot,
    save,
)
from cooper.experiments.reproduction import across_seeds, across_seeds_table, judge, results_table, summarize
from cooper.launcher.plot import mark_alarm
from cooper.metric_names import (
    ALARM_EVENT,
    ALARM_RM_NEGATIVES,
    ALARM_ROLLED_BACK_TO,
    ALARM_STATE,
    KL_FROM_INITIAL,
    REWARD_MEAN,
    REWARD_SOURCE,
    RM_AUROC,
    RM_VERIFIER_DISAGREEMENT,
    STEP,
    TEST,
    TEST_INITIAL,
    VERIFIER_ACCURACY,
)
from cooper.modes import EXPERIMENT_LABELS, reward_mode
from cooper.modes import MODES as REWARD_MODES
from cooper.orchestrator.outputs import read_metrics
from cooper.runtime.processes import die_with_parent

MODES = tuple(REWARD_MODES)
PANELS = [(REWARD_MEAN, "training reward"), (VERIFIER_ACCURACY, "rollout verifier accuracy"),
          (RM_VERIFIER_DISAGREEMENT, "VerifyRM vs verifier disagreement"),
          (RM_AUROC, "VerifyRM AUROC vs verifier (rollouts)")]
Runs = Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]

NO_ACTION = "-noaction"
"""Suffix of a control run's label: the same mode and seed with the alarm only warning (`--no-action-control`)."""


def judged_recipe(config: CooperConfig) -> dict[str, Any]:
    """What the verdict's `cooper` ran: the settings of cooper mode's reward-model update in `config` (the other
    recipes, `cooper-paper` and `cooper-rollouts`, are reported beside it under their own labels)."""
    reward = config.reward
    return {"label": "cooper", "negatives": config.run.negatives, "generator": config.generator.strategy,
            "update_steps": reward.update_steps, "replay_updates": reward.replay_updates,
            "calibration_weight": reward.calibration_weight, "lr": reward.optim.lr, "discrete": reward.discrete}


def recipe_of(label: str) -> str:
    """The experiment label without its control's suffix: `static-noaction` is static's control."""
    return label.removesuffix(NO_ACTION)


def mode_of(label: str) -> str:
    """The reward mode of a run label: `static` and `static-noaction` are static, `cooper-paper` is cooper."""
    return EXPERIMENT_LABELS[recipe_of(label)][0]


def scores_with_reward_model(label: str) -> bool:
    """Whether the runs of an experiment label have a VerifyRM (to watch, to plot, to sample best-of-n with)."""
    return reward_mode(mode_of(label)).reward_model_scores


def run_order(labels: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """Every (label, seed), the longest runs first: cooper's update VerifyRM every step, static's only score with it,
    rule's do neither. With runs in parallel the last to finish is then a short one, not a cooper run that started
    when the rest were nearly done (on 2 cores that tail was most of a cooper run)."""
    def cost(job: tuple[str, int]) -> int:
        mode = reward_mode(mode_of(job[0]))
        return mode.reward_model_scores + mode.reward_model_learns

    return sorted(((label, seed) for seed in seeds for label in labels), key=cost, reverse=True)


def _as_seeds(runs: Mapping[str, Any]) -> dict[str, list[list[Mapping[str, Any]]]]:
    """Accept {mode: records} (one seed) or {mode: [records, ...]} (several)."""
    out = {}
    for mode, value in runs.items():
        out[mode] = [value] if value and isinstance(value[0], Mapping) else list(value)
    return out


def accuracy_points(records: Sequence[Mapping[str, Any]], benchmark: str) -> list[tuple[int, float]]:
    """(updates so far, test accuracy): the initial evaluation at 0, the one after step t at t + 1."""
    points = [(0, float(records[0][TEST_INITIAL + benchmark]))] if records and \
        records[0].get(TEST_INITIAL + benchmark) is not None else []
    points += [(int(r[STEP]) + 1, float(r[TEST + benchmark])) for r in records
               if r.get(TEST + benchmark) is not None]
    return points


SMOOTHING = 20
"""Steps in the moving average of the per-step curves (one step's value is a mean over one batch: noisy)."""


def moving_average(points: Sequence[tuple[int, float]], width: int = SMOOTHING) -> list[tuple[int, float]]:
    """(x, mean of the last `width` values up to x) for each point: trailing, so a curve never looks ahead."""
    ys = [y for _, y in points]
    out = []
    for i, (x, _) in enumerate(points):
        window = ys[max(0, i - width + 1) : i + 1]
        out.append((x, sum(window) / len(window)))
    return out


def compare_plot(runs: Runs, path: Path) -> Path:
    """One panel per benchmark's test accuracy (the held-out set first, where a reader looks first), then one per
    monitored quantity, three to a row; one line per mode: the mean over seeds. Per-step curves are drawn as a moving
    average of SMOOTHING steps over the raw mean, which stays faint behind it; each seed is a thin line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    by_mode = _as_seeds(runs)
    tests = sorted({k.removeprefix(TEST) for seeds in by_mode.values() for records in seeds for r in records
                    for k in r if k.startswith(TEST)})
    tests.sort(key=lambda k: k != "heldout")
    panels = [(TEST + k, f"test accuracy ({k})") for k in tests] + PANELS
    # A grid three panels wide, so that at a page's width (README) each panel is a third of it, not a sixth.
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.6 * rows), dpi=110, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (key, title) in zip(axes.flat, panels, strict=False):  # a last row may have panels to spare
        for mode, seeds in by_mode.items():
            # A no-action control is its mode's colour, dashed: the same run with the alarm only warning.
            color, style = COLORS.get(recipe_of(mode)), "--" if mode.endswith(NO_ACTION) else "-"
            if key.startswith(TEST):
                per_seed = [accuracy_points(records, key.removeprefix(TEST)) for records in seeds]
                by_x: dict[int, list[float]] = {}
                for points in per_seed:
                    for x, y in points:
                        by_x.setdefault(x, []).append(y)
                mean = sorted((x, sum(ys) / len(ys)) for x, ys in by_x.items())
                ax.set_xlabel("policy updates")
            else:
                per_seed = [[(int(r[STEP]), float(r[key])) for r in records if r.get(key) is not None]
                            for records in seeds]
                mean = mean_over_seeds(seeds, key)
                ax.set_xlabel("step")
            per_step = not key.startswith(TEST)
            if len(seeds) > 1:
                for points in per_seed:
                    points = moving_average(points) if per_step else points
                    ax.plot([p[0] for p in points], [p[1] for p in points], color=color, alpha=0.25, linewidth=0.6)
            if mean and per_step:
                ax.plot([p[0] for p in mean], [p[1] for p in mean], color=color, alpha=0.2, linewidth=0.8)
                mean = moving_average(mean)
            if mean:
                name = f"{mode_of(mode)}, no action" if mode.endswith(NO_ACTION) else mode
                ax.plot([p[0] for p in mean], [p[1] for p in mean], marker="." if len(mean) < 40 else None,
                        label=name + (f" (mean of {len(seeds)})" if len(seeds) > 1 else ""), color=color,
                        linewidth=1.8, linestyle=style)
        if not key.startswith(TEST):  # the reward-hacking alarm: raises, rollbacks, the steps an action acted
            for mode, seeds in by_mode.items():
                if mode.endswith(NO_ACTION):
                    continue  # its raises are the acting run's until the first action: drawn once
                for records in seeds:
                    mark_alarm(ax, records, COLORS.get(recipe_of(mode)))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        finish_panel(ax, title, fontsize=10)
    return save(fig, path)


def alarm_table(runs: Runs, seeds: Sequence[int], benchmark: str | None) -> str:
    """Per run label and seed: the reward-hacking alarm's raises, the first one's step, the steps the policy trained
    on the verifier's reward instead, the steps VerifyRM's update was raised with flagged negatives and the
    rollbacks ("step:v<version restored>"; act mode), the final test accuracy and, where the run has a no-action
    control (`<label>-noaction`, the alarm only warning), the control's. Empty when no run was watched."""
    by_label = _as_seeds(runs)
    rows = [["run", "seed", "alarms", "first at", "steps on verifier", "RM updates raised", "rollbacks",
             f"test end ({benchmark})", "no-action end"]]
    for label, by_seed in by_label.items():
        controls = by_label.get(label + NO_ACTION, [])
        for index, (seed, records) in enumerate(zip(seeds, by_seed, strict=True)):
            if not any(ALARM_STATE in r for r in records):
                continue
            raises = [r[STEP] for r in records if r.get(ALARM_EVENT) == "raised"]
            acted = sum(r.get(REWARD_SOURCE) == "verifier" for r in records)
            raised_rm = sum(r.get(ALARM_RM_NEGATIVES, False) for r in records)
            rollbacks = ",".join(f"{r[STEP]}:v{r[ALARM_ROLLED_BACK_TO]}" for r in records
                                 if ALARM_ROLLED_BACK_TO in r)
            end = _last_value(records, TEST + benchmark) if benchmark else None
            control = _last_value(controls[index], TEST + benchmark) if controls and benchmark else None
            rows.append([label, str(seed), str(len(raises)), str(raises[0]) if raises else "-", str(acted),
                         str(raised_rm), rollbacks or "-", _fmt(end), _fmt(control)])
    if len(rows) == 1:
        return ""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def compare_table(runs: Runs) -> str:
    """Last-step numbers per mode (mean over seeds): what the paper's table reports, plus the hacking monitor."""
    by_mode = _as_seeds(runs)
    keys = [REWARD_MEAN, VERIFIER_ACCURACY, RM_VERIFIER_DISAGREEMENT, RM_AUROC, KL_FROM_INITIAL]
    keys += sorted({k for seeds in by_mode.values() for records in seeds for r in records for k in r
                    if k.startswith(TEST)})
    rows = [["mode", *keys]]
    for mode, seeds in by_mode.items():
        cells = []
        for key in keys:
            values = [v for v in (_last_value(records, key) for records in seeds) if v is not None]
            cells.append(_fmt(sum(values) / len(values) if values else None))
        rows.append([mode, *cells])
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def _last_value(records: Sequence[Mapping[str, Any]], key: str) -> Any:
    return next((r[key] for r in reversed(records) if r.get(key) is not None), None)


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


# ----- running -----

def _write_config(config: CooperConfig, path: Path) -> Path:
    """The experiment's config for its runs, secrets included (mode 600), like a run's resolved config."""
    from cooper.launcher.launch import revealed

    path.write_text(yaml.safe_dump(revealed(config), sort_keys=False))
    os.chmod(path, 0o600)
    return path


def _start_run(config_path: Path, label: str, seed: int, run_name: str, log_path: Path) -> subprocess.Popen:
    # Warn mode computes the same alarm and acts on nothing: the control sees when it would have raised.
    control = ["alarm.mode=warn"] if label.endswith(NO_ACTION) else []
    recipe = EXPERIMENT_LABELS[recipe_of(label)][1]
    return start_child([sys.executable, "-m", "cooper.cli", "train", "--no-progress", "--config", str(config_path),
                         f"run.mode={mode_of(label)}", *recipe, f"run.seed={seed}", f"run.name={run_name}", *control],
                        log_path)


def start_child(argv: Sequence[str], log_path: Path) -> subprocess.Popen:
    """A run's process, logging to log_path. It gets SIGTERM when the experiment dies, even by SIGTERM or SIGKILL,
    which skip the `finally` that stops the runs: otherwise it would train on, orphaned, for the rest of its steps.
    It stays in the experiment's process group, so Ctrl-C reaches it too and it stops its services gracefully."""
    with log_path.open("w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)


def run_all(config: CooperConfig, jobs: Sequence[tuple[str, int]], name: str, out: Path, parallel: int,
            progress: bool) -> dict[tuple[str, int], Path]:
    """Run every (mode, seed) as its own `cooper train` process, `parallel` at a time, with one progress bar over
    all their steps. A run that fails stops the experiment with its log's path."""
    from tqdm import tqdm

    config_path = _write_config(config, out / "config.resolved.yaml")
    run_dirs = {job: (Path(config.run.output_dir) / f"{name}-{job[0]}-s{job[1]}").resolve() for job in jobs}
    waiting, running = list(jobs), {}
    bar = tqdm(total=len(jobs) * config.run.steps, disable=not progress, unit="step", dynamic_ncols=True,
               desc=f"experiment {name}")
    counted: dict[tuple[str, int], int] = {}
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                job = waiting.pop(0)
                running[job] = _start_run(config_path, job[0], job[1], run_dirs[job].name,
                                          out / f"{job[0]}-s{job[1]}.log")
            time.sleep(0.5)
            for job, process in list(running.items()):
                done = _lines(run_dirs[job] / "metrics.jsonl")
                bar.update(done - counted.get(job, 0))
                counted[job] = done
                code = process.poll()
                if code is None:
                    continue
                del running[job]
                if code != 0:
                    raise RuntimeError(f"the {job[0]} run of seed {job[1]} failed (exit {code}); its output is in "
                                       f"{out / f'{job[0]}-s{job[1]}.log'}")
                bar.set_postfix(finished=f"{job[0]} s{job[1]}")
    finally:
        for process in running.values():
            process.terminate()
        for process in running.values():
            process.wait(timeout=60)
        bar.close()
    return run_dirs


def _lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def exploit_report(config: CooperConfig, final_runs: Mapping[str, Path], samples: int = 4,
                   max_problems: int = 32, shown: int = 5) -> str:
    """What each mode's final policy writes, judged by the initial VerifyRM and the verifier: the samples of the
    trained policy that the initial RM scores highest although the verifier says they are wrong (the exploit)."""
    from cooper.experiments.best_of_n import sample_and_judge, top_scored_wrong
    from cooper.runtime.checkpoint import latest_checkpoint

    lines = ["# What the trained policies write, judged by the initial VerifyRM", "",
             f"{samples} samples per problem on {max_problems} test problems from each mode's final policy (first "
             "seed), scored by the initial VerifyRM (the one static trains against) and checked by the verifier.", ""]
    checkpoints = {mode: latest_checkpoint(run_dir / "checkpoints" / "policy") for mode, run_dir in final_runs.items()}
    checkpoints = {mode: path for mode, path in checkpoints.items() if path is not None}
    _, by_model = sample_and_judge(config, [str(p) for p in checkpoints.values()], samples, max_problems)
    for mode, checkpoint in checkpoints.items():
        judged = by_model[str(checkpoint)]
        flat = [x for _, group in judged for x in group]
        accuracy = sum(c for _, c, _ in flat) / len(flat)
        mean_score = sum(s for s, _, _ in flat) / len(flat)
        lines += [f"## {mode} ({checkpoint.name})", "",
                  f"verifier accuracy {accuracy:.3f}, mean initial-RM score {mean_score:.3f}; "
                  "top-scored verifier-wrong samples:", ""]
        for example in top_scored_wrong(judged, shown):
            lines.append(f"- {example['score']:.3f} · reference {example['reference']} · "
                         f"`{example['completion']!r}`")
        lines.append("")
    return "\n".join(lines)


def provenance(config: CooperConfig) -> dict[str, Any]:
    """What an experiment's numbers depend on beyond its config: digests of the initial models' weights, and the
    torch build and CPU kernels that ran them. On one machine a tiny-model build and a run are bit-reproducible; on
    another CPU (other SIMD kernels, other float rounding) the built models and every number differ
    (docs/experiments.md), so two results.json compare only where these match."""
    import hashlib
    import platform

    import torch

    from cooper.runtime.models import resolve_model

    def digest(model: str, kind: str) -> str:
        weights = sorted(Path(resolve_model(model, kind)).glob("*.safetensors"))
        if not weights:
            return ""  # a hub id: its revision, not a local file, names it
        sha = hashlib.sha256()
        for path in weights:
            sha.update(path.read_bytes())
        return sha.hexdigest()[:16]

    return {"policy_weights": digest(config.policy.model, "causal"),
            "reward_weights": digest(config.reward.model, "reward"),
            "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(), "cpu_count": os.cpu_count()}


def run_experiment(config: CooperConfig, modes: tuple[str, ...] = MODES, seeds: Sequence[int] | None = None,
                   parallel: int = 1, best_of_n_samples: int = 32, progress: bool = True,
                   no_action_control: bool = False) -> tuple[Path, dict[str, Any]]:
    """Run every mode for every seed; write the comparison and the reproduction verdict; return its directory and
    the verdict (what results.json holds). With `no_action_control` (alarm.mode must be act), every watched mode
    also runs with the alarm only warning, as the control the alarm's actions are judged against; the verdict is
    judged on the acting runs, which are the configuration asked for."""
    from cooper.config import ConfigError
    from cooper.launcher.launch import prepare_models

    watched = [mode for mode in modes if scores_with_reward_model(mode)]  # rule mode has no VerifyRM to watch
    if no_action_control and (config.alarm.mode != "act" or not watched):
        raise ConfigError("a no-action control compares the alarm acting with the alarm only warning: it needs "
                          f"alarm.mode=act (got {config.alarm.mode}) and a static or cooper mode")
    labels = [*modes, *(mode + NO_ACTION for mode in watched)] if no_action_control else list(modes)

    seeds = list(seeds) if seeds else [config.run.seed]
    name = config.run.name or f"experiment-{time.strftime('%Y%m%d-%H%M%S')}"
    out = (Path(config.run.output_dir) / name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    prepare_models(config, reward=True)  # once, here, rather than raced by the first parallel runs
    curve = []
    if best_of_n_samples and any(scores_with_reward_model(mode) for mode in modes):
        from cooper.experiments.best_of_n import BestOfN, measure_best_of_n

        measured = measure_best_of_n(config, samples=best_of_n_samples)
        (out / "best_of_n.json").write_text(json.dumps(measured, indent=2))
        curve = [BestOfN(**p) for p in measured["curve"]]
    jobs = run_order(labels, seeds)
    run_dirs = run_all(config, jobs, name, out, parallel, progress)
    records = {job: read_metrics(path) for job, path in run_dirs.items()}
    runs = {label: [records[(label, seed)] for seed in seeds] for label in labels}
    compare_plot(runs, out / "compare.png")
    overoptimization_plot(runs, out / "overoptimization.png", curve)
    rm_health_plot({m: r for m, r in runs.items() if scores_with_reward_model(m)}, out / "rm_health.png")
    # The verdict reads a benchmark named `heldout` when the data has one, else the first benchmark.
    benchmarks = [k.removeprefix(TEST) for r in records.values() for k in (r[-1] if r else {}) if k.startswith(TEST)]
    benchmark = "heldout" if "heldout" in benchmarks else next(iter(benchmarks), None)
    summaries, controls = [], []
    if benchmark is not None:
        for (label, seed), recs in records.items():
            start = recs[0].get(TEST_INITIAL + benchmark) if recs else None
            if start is not None:
                summary = summarize(recipe_of(label), seed, recs, TEST + benchmark, float(start))
                (controls if label.endswith(NO_ACTION) else summaries).append(summary)
    verdict = {**judge(summaries), "across_seeds": across_seeds(summaries), "seeds": seeds, "modes": list(modes),
               "benchmark": benchmark, "judged_recipe": judged_recipe(config),
               "no_action_controls": [asdict(s) for s in controls],
               "seconds": round(time.monotonic() - started, 1), "provenance": provenance(config),
               "run_dirs": {f"{m}-s{s}": str(p) for (m, s), p in run_dirs.items()}}
    (out / "results.json").write_text(json.dumps(verdict, indent=2))
    table = results_table(summaries) + "\n\n" + across_seeds_table(verdict["across_seeds"])
    (out / "results.md").write_text(table + "\n")
    if curve:
        (out / "exploits.md").write_text(exploit_report(config, {mode: run_dirs[(mode, seeds[0])] for mode in modes}))
    summary = compare_table(runs)
    alarms = alarm_table(runs, seeds, benchmark)
    if alarms:
        summary += f"\n\nreward-hacking alarm ({config.alarm.mode}):\n{alarms}"
    (out / "summary.txt").write_text(summary + "\n")
    print(f"\n{summary}\n\n{table}\n\nreproduced: {verdict['reproduced']}   "
          f"({verdict['seconds']:.0f} s)\ncomparison: {out}/compare.png, overoptimization.png, rm_health.png")
    return out, verdict
