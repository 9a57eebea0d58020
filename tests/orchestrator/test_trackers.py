"""Weights & Biases and MLflow beside metrics.jsonl (run.loggers; cooper/orchestrator/trackers.py), with the real
packages and no network: W&B in offline mode, its run files read back in W&B's own record format; MLflow in a SQLite
store, read back with its own client. What they hold must be what metrics.jsonl holds, step for step, across a kill
of `cooper train` and `--resume`."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from train_process import FAST, Train, assert_consistent

from cooper.config import ConfigError, load_config, preset_path
from cooper.metric_names import ELAPSED, STEP
from cooper.orchestrator import trackers
from cooper.orchestrator.outputs import numbers, read_metrics

wandb = pytest.importorskip("wandb")  # in the dev lock: CI has both; a user's environment need not
mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402  (after the skip: without mlflow the module is skipped, not broken)
from wandb.proto import wandb_internal_pb2  # noqa: E402

BLOCK, HEADER = 32768, 7
"""W&B's transaction log (run-<id>.wandb): a 7-byte file header, then LevelDB's log format: 32 KiB blocks of
chunks, each with a 7-byte header (CRC-32, length, type: 1 full, 2 first, 3 middle, 4 last)."""


def wandb_records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B transaction log"
    records, pos, parts = [], 7, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        parts += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


def wandb_history(run_dir: Path, tracked_id: str) -> dict[int, dict[str, float]]:
    """Every step W&B holds for the tracked run, over all its offline directories (one per start), as `wandb sync`
    merges them: a later start's value for a step wins."""
    history: dict[int, dict[str, float]] = {}
    logs = sorted(run_dir.glob(f"wandb/offline-run-*-{tracked_id}/run-{tracked_id}.wandb"))
    assert logs, f"no offline W&B run {tracked_id} under {run_dir / 'wandb'}"
    for log in logs:
        for record in wandb_records(log):
            if record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                step = int(items.pop("_step"))
                history[step] = {k: v for k, v in items.items()  # plots/: the image logged at the end
                                 if not k.startswith(("_", "plots/")) and isinstance(v, float | int)}
    return history


def same_numbers(got: dict[str, float], want: dict[str, float], where: str) -> None:
    assert set(got) == set(want), f"{where}: keys differ: {sorted(set(got) ^ set(want))}"
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {key} {got[key]} != {value}"


@pytest.mark.slow
def test_wandb_and_mlflow_hold_every_step_of_metrics_jsonl_across_a_kill_and_resume(tmp_path):
    steps, run_dir, store = 6, tmp_path / "tracked", tmp_path / "mlflow.db"
    train = Train(tmp_path, f"run.steps={steps}", "run.name=tracked", f"run.output_dir={tmp_path}", *FAST,
                  "run.loggers=[tensorboard,wandb,mlflow]", "run.wandb.mode=offline",
                  f"run.mlflow.tracking_uri=sqlite:///{store}", "run.mlflow.experiment=trackers-test")
    train.wait_for_steps(run_dir, 2)
    ids = json.loads((run_dir / trackers.IDS_FILE).read_text())
    train.kill_cli()
    # What the SIGKILL left in TMPDIR: W&B's own folders, made when it is imported and removed at a normal exit;
    # empty, as nothing had been sent to W&B that would go through them (the plot goes at the end).
    left = sorted(path for path in train.tmp.iterdir() if not path.name.startswith("torchinductor_"))
    assert all(path.name.endswith(("wandb-media", "wandb-artifacts")) and not any(path.iterdir()) for path in left), \
        left
    resumed = Train(tmp_path, "--resume", str(run_dir))
    assert resumed.wait() == 0, resumed.stderr[-3000:]
    assert_consistent(run_dir, steps)
    resumed.assert_nothing_left(allowed=tuple(path.name for path in left))
    assert json.loads((run_dir / trackers.IDS_FILE).read_text()) == ids  # the same tracked runs, not new ones

    records = read_metrics(run_dir)
    want = {record[STEP]: numbers(record) for record in records}
    assert len(want) == steps

    history = wandb_history(run_dir, ids["wandb"])
    assert sorted(history) == list(range(steps))
    for step, values in want.items():
        same_numbers(history[step], values, f"W&B step {step}")
    starts = sorted(run_dir.glob(f"wandb/offline-run-*-{ids['wandb']}"))
    # One directory per start of the same tracked run (`wandb sync` merges them). W&B buffers its offline log: the
    # SIGKILLed start's may hold nothing at all, and the resumed run's catch-up sent its steps again.
    assert len(starts) == 2
    run_record = next(r.run for r in wandb_records(next(starts[-1].glob("*.wandb")))
                      if r.WhichOneof("record_type") == "run")
    config = {item.key: json.loads(item.value_json) for item in run_record.config.update}
    assert config["run"]["steps"] == steps and config["run"]["seed"] == 0
    images = list(starts[-1].glob("files/media/images/plots/plot*.png"))
    assert images, "the plot was not attached to the W&B run at the end"

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("trackers-test")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [ids["mlflow"]]  # resumed, not started again
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["run.steps"] == str(steps) and run.data.params["run.mode"] == "cooper"
    for key in {key for values in want.values() for key in values}:
        # a step logged again after the resume (the kill came after its line, before it was recorded as logged)
        # has a second entry: the later one is metrics.jsonl's last line for it
        latest = {m.step: m.value for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                   key=lambda m: m.timestamp)}
        assert sorted(latest) == sorted(step for step in want if key in want[step]), key
        for step, value in latest.items():
            assert math.isclose(value, want[step][key], rel_tol=1e-9, abs_tol=1e-12), (key, step)
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"config.json", "plot.png"}
    assert ELAPSED in run.data.metrics


def test_alarm_events_reach_wandb_as_alerts_and_mlflow_as_tags(tmp_path):
    config = load_config(preset_path("tiny"), ["run.loggers=[wandb,mlflow]", "run.wandb.mode=offline",
                                               f"run.mlflow.tracking_uri=sqlite:///{tmp_path / 'm.db'}"])
    opened = trackers.open_trackers(config, "alarmed", tmp_path)
    event = {"step": 3, "event": "raised", "trigger": "disagreement", "statistics": {"disagreement": 9.5},
             "threshold": 8.0, "policy_version": 4, "reward_version": 4, "actions": []}
    for tracker in opened:
        tracker.log(3, {"reward/mean": 0.5})
        tracker.alarm(event)
        tracker.finish([])
    ids = json.loads((tmp_path / trackers.IDS_FILE).read_text())

    alerts = [r.alert for log in tmp_path.glob(f"wandb/offline-run-*-{ids['wandb']}/*.wandb")
              for r in wandb_records(log) if r.WhichOneof("record_type") == "alert"]
    assert [(a.title, a.level) for a in alerts] == [("reward-hacking alarm raised at step 3", "WARN")]
    assert json.loads(alerts[0].text) == event

    tags = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}").get_run(ids["mlflow"]).data.tags
    assert json.loads(tags["alarm.step-3.raised"]) == event


def test_a_tracker_not_installed_stops_the_run_before_it_starts(tmp_path, monkeypatch):
    from cooper.launcher.launch import train

    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name, *a: None if name in {"wandb", "alembic"}
                        else real(name, *a))
    for loggers, package in (("[wandb]", "pip install wandb"), ("[mlflow]", "pip install alembic")):
        config = load_config(preset_path("tiny"), [f"run.loggers={loggers}", f"run.output_dir={tmp_path}",
                                                   "run.name=never"])
        with pytest.raises(ConfigError, match=package):
            train(config)
        assert not (tmp_path / "never").exists()  # nothing started, nothing written
    # A tracking server needs no database packages; the default run needs neither tracker.
    trackers.require_packages(load_config(preset_path("tiny"), ["run.loggers=[mlflow]",
                                                                "run.mlflow.tracking_uri=http://mlflow:5000"]))
    trackers.require_packages(load_config(preset_path("tiny")))


def test_loggers_are_checked_by_name():
    with pytest.raises(ConfigError, match="twice"):
        load_config(preset_path("tiny"), ["run.loggers=[wandb,wandb]"])
    with pytest.raises(ConfigError, match=r"run\.loggers\.0.*'tensorboard', 'wandb' or 'mlflow'"):
        load_config(preset_path("tiny"), ["run.loggers=[comet]"])
