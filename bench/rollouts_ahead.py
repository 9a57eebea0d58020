"""Rollouts one step ahead of training (run.max_staleness=1) against the synchronous run (0): time and learning.

    python bench/rollouts_ahead.py [--rounds 3] [--steps 20] [--modes rule,cooper]
    python bench/rollouts_ahead.py --curves --seeds 11,12,13 [--modes rule]

Speed (the default): `cooper train` on `configs/tiny.yaml` through the services and Redis (bench/step.py's side
(b), `launch.train` as the CLI runs it), evaluation off, `--warmup` + `--steps` steps, per mode with max_staleness 0
and 1 in each round, alternating which goes first. A step's time is the steady-state interval between two steps
being logged (warm-up steps left out), the command's is its whole wall time, start-up included. Reported per mode:
the median step and command time of each setting, and the median over rounds of the per-round ratio (1 / 0).

Curves (`--curves`): the preset's full runs (300 steps, evaluation every 50) of each seed in `--seeds`, synchronous
and one step ahead; reported per seed: held-out accuracy at the start and the end of each, and the end's gap (1 - 0).
The seeds are chosen before the runs (docs/benchmarks.md states them with the results).

The rollout process and the trainer each run on one torch thread (the preset's policy.torch_threads: 1;
policy.rollout_threads unset), so on 2 cores each has a core. The last line printed is one JSON object.
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

SETTINGS = (0, 1)


def speed(args: argparse.Namespace) -> dict[str, Any]:
    """Per mode: step and command times of both settings, and the median of per-round ratios."""
    report: dict[str, Any] = {}
    for mode in args.modes:
        steps: dict[int, list[float]] = {k: [] for k in SETTINGS}
        commands: dict[int, list[float]] = {k: [] for k in SETTINGS}
        ratios, command_ratios = [], []
        for round_ in range(args.rounds):
            order = SETTINGS if round_ % 2 == 0 else tuple(reversed(SETTINGS))
            got: dict[int, tuple[float, float]] = {}
            for behind in order:
                with tempfile.TemporaryDirectory(prefix=f"bench-ahead-{behind}-") as tmp:
                    config = bench_config(args.config, mode, args.warmup + args.steps, Path(tmp), True,
                                          [f"run.max_staleness={behind}", *args.overrides])
                    result = run_services(config, args.warmup)
                step = statistics.median(s["step"] for s in result["steps"] if "step" in s)
                got[behind] = (step, result["total_s"])
                steps[behind].append(step)
                commands[behind].append(result["total_s"])
                stages = medians(result["steps"])
                print(f"{mode} round {round_} max_staleness={behind}: step {step:.3f} s, command "
                      f"{result['total_s']:.1f} s, stages {json.dumps(stages)}", file=sys.stderr, flush=True)
            ratios.append(got[1][0] / got[0][0])
            command_ratios.append(got[1][1] / got[0][1])
        report[mode] = {
            "step_s": {str(k): round(statistics.median(v), 3) for k, v in steps.items()},
            "command_s": {str(k): round(statistics.median(v), 1) for k, v in commands.items()},
            "step_ratio": round(statistics.median(ratios), 3),
            "step_ratio_per_round": [round(r, 3) for r in ratios],
            "command_ratio": round(statistics.median(command_ratios), 3),
        }
    return report


def curves(args: argparse.Namespace) -> dict[str, Any]:
    """Per mode and seed: held-out accuracy at the start and the end, synchronous and one step ahead."""
    from cooper.config import load_config
    from cooper.launcher import launch
    from cooper.metric_names import TEST, TEST_INITIAL
    from cooper.orchestrator.outputs import read_metrics

    report: dict[str, Any] = {}
    for mode in args.modes:
        rows = []
        for seed in args.seeds:
            row: dict[str, Any] = {"seed": seed}
            for behind in SETTINGS:
                with tempfile.TemporaryDirectory(prefix=f"bench-ahead-curve-{behind}-") as tmp:
                    config = load_config(args.config, [f"run.mode={mode}", f"run.seed={seed}",
                                                       f"run.max_staleness={behind}", f"run.output_dir={tmp}",
                                                       *args.overrides], environ={})
                    started = time.perf_counter()
                    with contextlib.redirect_stdout(sys.stderr):
                        records = read_metrics(launch.train(config, progress=False))
                    seconds = time.perf_counter() - started
                heldout = [r[TEST + "heldout"] for r in records if TEST + "heldout" in r]
                row[str(behind)] = {"start": records[0][TEST_INITIAL + "heldout"], "end": heldout[-1],
                                    "curve": heldout, "command_s": round(seconds, 1)}
                print(f"{mode} seed {seed} max_staleness={behind}: held-out {row[str(behind)]['start']:.3f} -> "
                      f"{heldout[-1]:.3f} in {seconds:.0f} s", file=sys.stderr, flush=True)
            row["end_gap"] = round(row["1"]["end"] - row["0"]["end"], 4)
            rows.append(row)
        report[mode] = {"runs": rows, "max_abs_end_gap": max(abs(r["end_gap"]) for r in rows),
                        "mean_end_gap": round(statistics.fmean(r["end_gap"] for r in rows), 4)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny.yaml")
    parser.add_argument("--modes", default="rule,cooper", help="comma-separated run.mode values (default rule,cooper)")
    parser.add_argument("--rounds", type=int, default=3, help="speed: paired rounds (default 3)")
    parser.add_argument("--steps", type=int, default=20, help="speed: measured steps per run (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="speed: steps left out of the step time (default 2)")
    parser.add_argument("--curves", action="store_true", help="learning curves instead of speed")
    parser.add_argument("--seeds", default="11,12,13", help="curves: comma-separated run.seed values")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for every run")
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    if bad := [m for m in args.modes if m not in ("rule", "static", "cooper")]:
        parser.error(f"unknown mode(s) {bad}: rule, static or cooper")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1: a step's time is the interval since the previous step")
    import logging

    logging.basicConfig(level=logging.WARNING)
    result: dict[str, Any] = {"bench": "rollouts_ahead", "what": "curves" if args.curves else "speed",
                              "modes": args.modes}
    if args.curves:
        result.update(seeds=args.seeds, **curves(args))
    else:
        result.update(rounds=args.rounds, steps=args.steps, warmup=args.warmup, **speed(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
