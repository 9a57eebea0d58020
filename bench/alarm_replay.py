"""The reward-hacking alarm replayed over finished runs: the raises per run, without retraining.

    python bench/alarm_replay.py bench/data/alarm-runs/*          # the alarm's regression data
    python bench/alarm_replay.py runs/NAME [runs/NAME ...] [alarm.KEY=VALUE ...]
    python bench/alarm_replay.py runs/NAME [...] --save-trimmed bench/data/alarm-runs   # how those were made

Each argument that is a directory is a run: its config.yaml and its metrics.jsonl (or metrics.jsonl.gz), as
`cooper train` leaves them or as trimmed under bench/data/alarm-runs/ (the runs of docs/experiments.md, "The alarm
on real runs that set nothing"). The others are dotted config overrides, applied on top of each run's own config.

Every step's record goes, in order, to the alarm as the driver gave it (cooper/orchestrator/alarm_watch.AlarmWatch,
the run state it keeps in Redis held in a dict here), with the run's config. The `alarm/*` fields the replay gives
are compared with the ones the run wrote at each step: with no overrides and the detector unchanged, every run is
reproduced; a change to the detector that moves a raise, a statistic or a threshold shows as a run that is not.
Overrides try a setting on the same runs (alarm.false_positive_bound=0.4 switches the absolute check on); the runs
are then expected to differ from what they recorded.

What a replay cannot show: the act-mode actions' effect on the run. An act run replays its own alarm exactly, but
a raise that moved would have changed the steps after it, which were trained with the raise where it was.

`--save-trimmed DIR` also writes each run there as the regression data holds it, in a folder named by its mode,
reward model, alarm mode, length and seed: config.yaml with the run's `run`, `reward.model` and `alarm` settings, and
metrics.jsonl.gz with, per step, only what the alarm reads (TRIMMED_FIELDS), what it wrote and the held-out
accuracy (a few KB a run). A run with the absolute check on (its initial RM validated, or a bound given) is named
`...-<alarm mode>-absolute-...`.

Prints per run the raises replayed and recorded and the held-out accuracy at the start, at the last evaluation at
or before the first raise, at the next one and at the end; the last line is one JSON object: per run those numbers
and `reproduced`, and `reproduced` for all.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from cooper import metric_names as names
from cooper.config import load_config
from cooper.orchestrator.alarm_watch import AlarmWatch
from cooper.orchestrator.outputs import read_metrics
from cooper.orchestrator.run_store import RunState

HELDOUT_START, HELDOUT = names.TEST_INITIAL + "heldout", names.TEST + "heldout"
# What AlarmWatch.observe writes into a step's record; the rest of a record's alarm/* keys come from the stages.
ALARM_FIELDS = (names.ALARM_STATE, names.ALARM_STATISTIC, names.ALARM_THRESHOLD, names.ALARM_EVENT)
# What HackingAlarm.observe reads (signal_values, exploit_check.step_groups, the absolute check's validation) and
# what AlarmWatch.observe writes into its events (the versions and the onset's).
DETECTOR_FIELDS = (names.STEP, names.RM_AUROC, names.RM_AUROC_SUPPORT, names.REWARD_ACCURACY_GAP,
                   names.RM_FALSE_POSITIVE_RATE, names.RM_FALSE_POSITIVES_BY_PROMPT, names.VERIFIER_ACCURACY,
                   names.KL_FROM_INITIAL, names.ROLLOUTS,
                   names.RM_BENCH_INITIAL_FALSE_POSITIVE_RATE, names.RM_BENCH_INITIAL_NEGATIVES,
                   names.POLICY_VERSION_SAMPLED, names.POLICY_VERSION, names.REWARD_VERSION, names.REWARD_VERSION_USED)
TRIMMED_FIELDS = (*DETECTOR_FIELDS, *ALARM_FIELDS, names.REWARD_SOURCE, HELDOUT_START, HELDOUT)


class MemoryStore(RunState):
    """The run state AlarmWatch reads and writes, in a dict; JSON in and out, as the run's Redis state is."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def state(self) -> dict[str, Any]:
        return {key: json.loads(value) for key, value in self.values.items()}

    def set_state(self, **values: Any) -> None:
        self.values.update({key: json.dumps(value) for key, value in values.items()})


def heldout_points(records: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(step, held-out accuracy): the initial evaluation at step -1, the one after step t at t."""
    points = [(-1, float(records[0][HELDOUT_START]))] if records and records[0].get(HELDOUT_START) is not None else []
    return points + [(int(r[names.STEP]), float(r[HELDOUT])) for r in records if r.get(HELDOUT) is not None]


def replay_run(run_dir: Path, records: Sequence[Mapping[str, Any]], overrides: Sequence[str]
               ) -> dict[str, Any] | None:
    """The run's alarm replayed step by step; None for a run the alarm does not watch (rule mode, alarm off)."""
    config = load_config(run_dir / "config.yaml", overrides, environ={})
    with tempfile.TemporaryDirectory() as events_dir:  # AlarmWatch appends its raises and clears to alarms.jsonl
        watch = AlarmWatch.for_run(config, MemoryStore(), Path(events_dir))
        if watch is None:
            return None
        replayed = [watch.observe({k: v for k, v in record.items() if k not in ALARM_FIELDS}) for record in records]
    differing = [r[names.STEP] for r, fields in zip(records, replayed, strict=True)
                 if fields != {k: r[k] for k in ALARM_FIELDS if k in r}]
    raises = [r[names.STEP] for r, fields in zip(records, replayed, strict=True) if fields.get(names.ALARM_EVENT) == "raised"]
    points = heldout_points(records)
    out: dict[str, Any] = {
        "mode": config.run.mode, "alarm_mode": config.alarm.mode, "steps": len(records),
        "raises": raises, "recorded_raises": [r[names.STEP] for r in records if r.get(names.ALARM_EVENT) == "raised"],
        "reproduced": not differing, "first_differing_step": differing[0] if differing else None,
        "heldout_start": points[0][1] if points else None, "heldout_end": points[-1][1] if points else None,
    }
    if raises and points:
        before = [p for p in points if p[0] <= raises[0]]
        after = [p for p in points if p[0] > raises[0]]
        out["heldout_at_first_raise"] = {"step": before[-1][0], "accuracy": before[-1][1]}
        out["heldout_next"] = {"step": after[0][0], "accuracy": after[0][1]} if after else None
    return out


def describe(name: str, result: Mapping[str, Any]) -> str:
    """One line: the raises, replayed and recorded, and the held-out accuracy around the first."""
    agreement = "reproduced" if result["reproduced"] else f"differs from step {result['first_differing_step']}"
    line = (f"{name}: {result['mode']} ({result['alarm_mode']}), raises at {result['raises'] or 'none'} "
            f"(recorded {result['recorded_raises'] or 'none'}; {agreement})")
    if result["heldout_start"] is None:
        return line
    at = result.get("heldout_at_first_raise")
    before = "" if at is None else f", {at['accuracy']:.3f} at the last evaluation before the first raise"
    return line + f"; held-out {result['heldout_start']:.3f} at start{before}, {result['heldout_end']:.3f} at the end"


def save_trimmed(run_dir: Path, records: Sequence[Mapping[str, Any]], out: Path) -> Path:
    """The run as the regression data holds it (module docstring); returns its folder."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    kept = {"run": config["run"], "reward": {"model": config["reward"]["model"]}, "alarm": config["alarm"]}
    run, model, alarm = config["run"], config["reward"]["model"], config["alarm"]["mode"]
    # The absolute check is on when the run validated its initial RM (eval.rm_benchmark_path) or was given a bound.
    absolute = "-absolute" if config["alarm"].get("false_positive_bound") is not None or any(
        r.get(names.RM_BENCH_INITIAL_FALSE_POSITIVE_RATE) is not None for r in records) else ""
    folder = out / f"{run['mode']}-{model}-{alarm}{absolute}-{run['steps']}steps-s{run['seed']}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(kept, sort_keys=False))
    lines = "".join(json.dumps({k: r[k] for k in TRIMMED_FIELDS if k in r}) + "\n" for r in records)
    (folder / "metrics.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("args", nargs="+", metavar="RUN_DIR or KEY=VALUE",
                        help="run directories, then dotted config overrides applied to each run's config")
    parser.add_argument("--save-trimmed", metavar="DIR", type=Path,
                        help="also write each run there, trimmed to what the alarm reads (module docstring)")
    args = parser.parse_args(argv)
    overrides = [a for a in args.args if "=" in a and not Path(a).is_dir()]
    run_dirs = [Path(a) for a in args.args if a not in overrides]
    if missing := [str(d) for d in run_dirs if not (d / "config.yaml").exists()]:
        parser.error(f"not a run directory (no config.yaml): {', '.join(missing)}")
    runs = {}
    for run_dir in run_dirs:
        records = read_metrics(run_dir)
        result = replay_run(run_dir, records, overrides)
        if result is None:
            print(f"{run_dir.name}: not watched by the alarm (rule mode or alarm.mode off)")
            continue
        runs[run_dir.name] = result
        if args.save_trimmed:
            result["saved_to"] = str(save_trimmed(run_dir, records, args.save_trimmed))
        print(describe(run_dir.name, result))
    print(json.dumps({"overrides": overrides, "runs": runs, "reproduced": all(r["reproduced"] for r in runs.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
