"""Stages off the critical path against the synchronous step: rollouts ahead of training (run.max_staleness=1),
VerifyRM's update behind its scores (run.reward_max_staleness=1), both; time and learning.

    python bench/rollouts_ahead.py [--rounds 3] [--steps 20] [--settings rule,cooper,cooper-reward-behind,...]
    python bench/rollouts_ahead.py --curves --seeds 721,722,723 --settings cooper,cooper-reward-behind

The settings (`--settings`, default all): rule, rule-ahead, cooper, cooper-ahead, cooper-reward-behind, cooper-both
(SETTINGS below). Speed (the default): `cooper train` on `configs/tiny.yaml` through the services and Redis
(bench/step.py's side (b), `launch.train` as the CLI runs it), evaluation off, `--warmup` + `--steps` steps, every
setting once per round, the order rotated from round to round. A step's time is the steady-state interval between
two steps being logged (warm-up steps left out), the command's is its whole wall time, start-up included. Reported
per setting: the median step and command time, and the median over rounds of the per-round ratio of its step to
the synchronous step of its mode (rule or cooper) and to rule's.

Curves (`--curves`): the preset's full runs (300 steps, evaluation every 50) of each seed in `--seeds`, per setting;
reported per seed: held-out accuracy at the start and the end, the end's gap to the synchronous run of the same mode,
and the time to accuracy: the wall-clock seconds (`time/elapsed`, from the start of stepping) at which the run's
held-out accuracy first reached the synchronous run's final one (None if it never did). The seeds are chosen before
the runs (docs/experiments.md states them with the results).

The rollout process and the trainer each run on one torch thread (the preset's policy.torch_threads: 1;
policy.rollout_threads unset), and so does VerifyRM (reward.torch_threads: 1). The last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from step import bench_config, medians, run_services  # noqa: E402

SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rule": ("rule", ()),
    "rule-ahead": ("rule", ("run.max_staleness=1",)),
    "cooper": ("cooper", ()),
    "cooper-ahead": ("cooper", ("run.max_staleness=1",)),
    "cooper-reward-behind": ("cooper", ("run.reward_max_staleness=1",)),
    "cooper-both": ("cooper", ("run.max_staleness=1", "run.reward_max_staleness=1")),
}
"""Name -> (run.mode, overrides). A setting's baseline is the setting named by its mode: the synchronous step."""


def speed(args: argparse.Namespace) -> dict[str, Any]:
    """Per setting: step and command times, and the medians of its per-round ratios to the synchronous step of its
    mode and to rule's."""
    steps: dict[str, list[float]] = {name: [] for name in args.settings}
    commands: dict[str, list[float]] = {name: [] for name in args.settings}
    for round_ in range(args.rounds):
        shift = round_ % len(args.settings)
        for name in args.settings[shift:] + args.settings[:shift]:
            mode, overrides = SETTINGS[name]
            with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
                config = bench_config(args.config, mode, args.warmup + args.steps, Path(tmp), True,
                                      [*overrides, *args.overrides])
                result = run_services(config, args.warmup)
            step = statistics.median(s["step"] for s in result["steps"] if "step" in s)
            steps[name].append(step)
            commands[name].append(result["total_s"])
            print(f"round {round_} {name}: step {step:.3f} s, command {result['total_s']:.1f} s, stages "
                  f"{json.dumps(medians(result['steps']))}", file=sys.stderr, flush=True)
    report: dict[str, Any] = {}
    for name in args.settings:
        row: dict[str, Any] = {"step_s": round(statistics.median(steps[name]), 3),
                               "command_s": round(statistics.median(commands[name]), 1)}
        for baseline in dict.fromkeys((SETTINGS[name][0], "rule")):
            if baseline in steps and baseline != name:
                ratios = [a / b for a, b in zip(steps[name], steps[baseline], strict=True)]
                row[f"step_ratio_to_{baseline}"] = round(statistics.median(ratios), 3)
                row[f"step_ratio_to_{baseline}_per_round"] = [round(r, 3) for r in ratios]
        report[name] = row
    return report


def time_to(target: float, records: list[dict[str, Any]], key: str) -> float | None:
    """Seconds (time/elapsed) at the first evaluation whose `key` reaches `target`; None if none does."""
    from cooper.metric_names import ELAPSED

    return next((r[ELAPSED] for r in records if key in r and r[key] >= target), None)


def curves(args: argparse.Namespace) -> dict[str, Any]:
    """Per setting and seed: held-out accuracy at the start and the end, the end's gap to the synchronous run of the
    same mode, and the time to the synchronous run's final accuracy."""
    from cooper.config import load_config
    from cooper.launcher import launch
    from cooper.metric_names import TEST, TEST_INITIAL
    from cooper.orchestrator.outputs import read_metrics

    key = TEST + "heldout"
    # The synchronous settings first: the others are measured against their final accuracy.
    order = sorted(args.settings, key=lambda name: name != SETTINGS[name][0])
    report: dict[str, Any] = {name: {"runs": []} for name in order}
    for seed in args.seeds:
        ends: dict[str, float] = {}
        for name in order:
            mode, overrides = SETTINGS[name]
            with tempfile.TemporaryDirectory(prefix=f"bench-curve-{name}-") as tmp:
                config = load_config(args.config, [f"run.mode={mode}", f"run.seed={seed}", f"run.output_dir={tmp}",
                                                   *overrides, *args.overrides], environ={})
                started = time.perf_counter()
                with contextlib.redirect_stdout(sys.stderr):
                    records = read_metrics(launch.train(config, progress=False))
                seconds = time.perf_counter() - started
            heldout = [r[key] for r in records if key in r]
            ends[name] = heldout[-1]
            row: dict[str, Any] = {"seed": seed, "start": records[0][TEST_INITIAL + "heldout"], "end": heldout[-1],
                                   "curve": heldout, "command_s": round(seconds, 1)}
            if mode in ends and mode != name:
                row["end_gap"] = round(heldout[-1] - ends[mode], 4)
                row["time_to_sync_end_s"] = time_to(ends[mode], records, key)
            if mode == name:
                row["time_to_end_s"] = time_to(heldout[-1], records, key)
            report[name]["runs"].append(row)
            print(f"{name} seed {seed}: held-out {row['start']:.3f} -> {heldout[-1]:.3f} in {seconds:.0f} s",
                  file=sys.stderr, flush=True)
    for entry in report.values():
        gaps = [r["end_gap"] for r in entry["runs"] if "end_gap" in r]
        if gaps:
            entry.update(max_abs_end_gap=max(abs(g) for g in gaps), mean_end_gap=round(statistics.fmean(gaps), 4))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny.yaml")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help=f"comma-separated settings, of {', '.join(SETTINGS)} (default all)")
    parser.add_argument("--rounds", type=int, default=3, help="speed: rounds, each running every setting (default 3)")
    parser.add_argument("--steps", type=int, default=20, help="speed: measured steps per run (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="speed: steps left out of the step time (default 2)")
    parser.add_argument("--curves", action="store_true", help="learning curves and time to accuracy instead of speed")
    parser.add_argument("--seeds", default="721,722,723", help="curves: comma-separated run.seed values")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for every run")
    args = parser.parse_args()
    args.settings = [m for m in args.settings.split(",") if m]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    if bad := [m for m in args.settings if m not in SETTINGS]:
        parser.error(f"unknown setting(s) {bad}: {', '.join(SETTINGS)}")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1: a step's time is the interval since the previous step")
    import logging

    logging.basicConfig(level=logging.WARNING)
    result: dict[str, Any] = {"bench": "rollouts_ahead", "what": "curves" if args.curves else "speed",
                              "settings": args.settings}
    if args.curves:
        result.update(seeds=args.seeds, **curves(args))
    else:
        result.update(rounds=args.rounds, steps=args.steps, warmup=args.warmup, **speed(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
