"""`cooper train` end to end: real services as processes, real embedded Redis, real tiny models.

These runs use the tiny preset with few steps. They check what a user relies on: the outputs exist, cooper mode
trains VerifyRM once per step, static never does, rule never calls the reward service, and a run killed mid-way
resumes without skipping, repeating or double-applying a step.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from cooper.config import OptimConfig, load_config
from cooper.evaluation.rm_bench import reward_model_report, tiny_bench
from cooper.launcher.launch import steps_in_process
from cooper.metric_names import CRITICAL, ELAPSED, TIME
from cooper.orchestrator.data import StepData, tiny_splits
from cooper.orchestrator.outputs import read_metrics
from cooper.runtime.models import resolve_model
from cooper.services.reward.items import ScoreItem
from cooper.services.reward.verify_rm import VerifyRM

ROOT = Path(__file__).resolve().parents[2]
BASE = ["eval.every=4", "eval.k=1", "eval.max_problems=8", "run.batch_size=8"]


def _cooper(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cooper.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=420, **kwargs)


def _expected_prompts(steps: int, seed: int = 0) -> list[list[str]]:
    rows, _ = tiny_splits(seed)
    data = StepData(rows, 8, seed)
    return [[e.id for e in data.batch(t)] for t in range(steps)]


def _leftovers(run_dir: Path) -> list[str]:
    """Processes still running with this run's config: services that outlived the orchestrator."""
    needle = str(run_dir)
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(needle in part for part in proc.info["cmdline"] or []) and "redis" not in " ".join(proc.info["cmdline"]):
                found.append(" ".join(proc.info["cmdline"]))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.mark.parametrize("reward_behind", [0, 1])
def test_cooper_run_killed_mid_way_resumes_exactly(tmp_path, reward_behind):
    """Also with VerifyRM's update one step behind its scores (run.reward_max_staleness=1): the resumed run is the
    run that was never killed, metric for metric."""
    steps = 5
    settings = [f"run.steps={steps}", "run.checkpoint_every=2", f"run.reward_max_staleness={reward_behind}", *BASE]
    cmd = [sys.executable, "-m", "cooper.cli", "train", "--no-progress", "run.name=resumed",
           f"run.output_dir={tmp_path}", *settings]
    run_dir = tmp_path / "resumed"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 400
    while len(read_metrics(run_dir)) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the run did not log two steps in time"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # no clean-up of any kind
    proc.wait()
    killed_at = len(read_metrics(run_dir))
    assert killed_at < steps
    deadline = time.monotonic() + 30  # the kernel tells the services their parent died; they drain and exit
    while _leftovers(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _leftovers(run_dir)

    resumed = _cooper("train", "--no-progress", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(steps))
    assert [r["prompt_ids"] for r in records] == _expected_prompts(steps)  # same prompts, in order, once
    # Each Train and Update was applied exactly once, across the crash: versions rise by one per step.
    assert [r["policy_version"] for r in records] == list(range(1, steps + 1))
    assert all(r["pairs"] > 0 for r in records)
    # score(t) read v_{t-k} exactly; each update still made one version.
    assert [r["reward_version_used"] for r in records] == [max(0, t - reward_behind) for t in range(steps)]
    assert [r["reward_version"] for r in records] == list(range(1, steps + 1))
    assert all(f"test/{name}" in records[i] for name in ("heldout", "seen") for i in (3, 4))
    for key in ("rm_verifier_disagreement", "pair_accuracy_before", "pair_accuracy_after", "valid_pair_rate",
                "verifier_accuracy", "reward_mean", "policy/kl", "policy/clip_fraction"):
        assert key in records[-1], key
    # outputs a user looks at
    assert (run_dir / "plot.png").stat().st_size > 10_000
    assert any((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert "mode: cooper" in (run_dir / "config.yaml").read_text()
    assert json.loads((run_dir / "checkpoint.json").read_text())["step"] == steps - 1
    assert "verifier acc" in resumed.stdout and "run directory" in resumed.stdout
    assert not _leftovers(run_dir)
    if reward_behind:
        whole = _cooper("train", "--no-progress", "--in-process", "run.name=whole", f"run.output_dir={tmp_path}",
                        *settings)
        assert whole.returncode == 0, whole.stderr[-3000:]
        untimed = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]
        assert untimed == [{k: v for k, v in r.items() if not k.startswith("time/")}
                           for r in read_metrics(tmp_path / "whole")]


def test_static_mode_never_updates_the_reward_model(tmp_path):
    result = _cooper("train", "--no-progress", "run.mode=static", "run.steps=3", "run.name=s",
                     f"run.output_dir={tmp_path}", "eval.rm_benchmark_path=tiny", *BASE)
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(tmp_path / "s")
    assert len(records) == 3
    assert {r["reward_version_used"] for r in records} == {0}
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert not (tmp_path / "s" / "logs" / "generator.log").exists()
    # The labelled benchmark, scored at the (final) evaluation by the reward service: the static model's numbers.
    assert "rm_bench/accuracy" not in records[1]
    used = yaml.safe_load((tmp_path / "s" / "config.yaml").read_text())["reward"]["model"]  # the preset's VerifyRM
    rm = VerifyRM.load(resolve_model(used, "reward"), OptimConfig(), max_length=256, device="cpu")
    bench = tiny_bench()
    local = reward_model_report(bench, [s for s, _ in rm.score(
        [ScoreItem(i.question, i.reference, i.completion) for i in bench])])
    assert records[2]["rm_bench/reward_version"] == 0
    assert records[2]["rm_bench/accuracy"] == pytest.approx(local.accuracy)
    assert records[2]["rm_bench/auroc"] == pytest.approx(local.auroc, abs=1e-6)
    assert "RM bench acc" in result.stdout


def test_an_acting_alarm_rolls_the_policy_back_and_trains_it_on_the_verifier_while_it_is_up(tmp_path):
    # A trigger-happy alarm (a 2-step baseline, threshold 0: any evidence at all) raises within a few steps of a real
    # static run; then one policy update is replaced by a rollback to the checkpoint of the onset's version, and
    # from then on policy_update trains on the verifier's reward while score still asks the reward model.
    result = _cooper("train", "--no-progress", "run.mode=static", "run.steps=10", "run.name=a",
                     f"run.output_dir={tmp_path}", "alarm.mode=act", "alarm.actions=[verifier_reward,rollback]",
                     "alarm.baseline_steps=2", "alarm.threshold=0", "alarm.drift=0.01", "alarm.clear_steps=100",
                     "policy.save_every=1", "policy.keep_checkpoints=10", "eval.every=0", "run.batch_size=4")
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(tmp_path / "a")
    events = [json.loads(line) for line in (tmp_path / "a" / "alarms.jsonl").read_text().splitlines()]
    raised, onset = events[0]["step"], events[0]["onset"]
    assert events[0]["event"] == "raised" and events[0]["actions"] == ["verifier_reward", "rollback"]
    assert events[0]["policy_version"] == raised + 1 and events[0]["reward_version"] == 0
    assert [r["alarm/state"] for r in records[:2]] == ["baseline", "baseline"]
    assert all(r["alarm/state"] == "alarm" for r in records[raised:])
    assert onset["step"] < raised and onset["policy_version"] == records[onset["step"]]["policy_version_sampled"]
    # Before the raise the reward model's reward trained the policy; the driver logs a step after its update, and a
    # policy update waits for the log of the step two before it (stages.await_the_alarm), so the actions start at
    # most two steps after the raise, however busy the machine: one rollback, then the verifier to the end.
    sources = [r["reward_source"] for r in records]
    assert sources[: raised + 1] == ["reward_model"] * (raised + 1)
    back = sources.index("rollback")
    assert raised < back <= raised + 2 and sources.count("rollback") == 1
    assert set(sources[back + 1 :]) == {"verifier"} and sources[-1] == "verifier"
    assert "verifier" not in sources[:back]
    # The onset's version was checkpointed (save_every 1), so that is what serves again, as the next version: versions
    # only go up, and the next rollout samples from the restored weights.
    assert records[back]["alarm/rolled_back_to"] == onset["policy_version"]
    assert [r["policy_version"] for r in records] == list(range(1, 11))
    assert records[back + 1]["policy_version_sampled"] == records[back]["policy_version"]
    restored = tmp_path / "a" / "checkpoints" / "policy" / f"v{records[back]['policy_version']:08d}"
    assert json.loads((restored / "state.json").read_text())["tag"] == f"restored-v{onset['policy_version']}"
    assert "reward-hacking alarm raised" in result.stderr and "rolling the policy back" in result.stderr


def test_an_acting_alarm_in_cooper_mode_trains_verifyrm_harder_on_the_rollouts_it_overpays(tmp_path):
    # The same trigger-happy alarm on a cooper run with the paper's generator negatives and only rm_negatives: once
    # it is up, every reward update takes rm_update_factor times the optimizer steps and adds the rollouts VerifyRM
    # accepted and the verifier rejected as negatives; the policy keeps training on the reward model.
    result = _cooper("train", "--no-progress", "run.mode=cooper", "run.steps=12", "run.name=c",
                     f"run.output_dir={tmp_path}", "alarm.mode=act", "alarm.actions=[rm_negatives]",
                     "alarm.rm_update_factor=3", "alarm.baseline_steps=2", "alarm.threshold=0", "alarm.drift=0.01",
                     "alarm.clear_steps=100", "run.negatives=generator", "reward.replay_updates=0",
                     "reward.update_steps=1", "reward.calibration_weight=0", "eval.every=0", "run.batch_size=4")
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(tmp_path / "c")
    raised = [json.loads(line) for line in (tmp_path / "c" / "alarms.jsonl").read_text().splitlines()][0]
    assert raised["actions"] == ["rm_negatives"]
    acting = [r for r in records if r["alarm/rm_negatives"]]
    quiet = [r for r in records if not r["alarm/rm_negatives"]]
    # The driver raises when it logs a step, and the stages run up to two steps ahead of it: the action starts after
    # the raise (never before), two steps after it at most, and, with the alarm never clearing, holds to the end.
    assert acting and raised["step"] < acting[0]["step"] <= raised["step"] + 2
    assert [r["step"] for r in acting] == list(range(acting[0]["step"], 12))
    assert all(r["rm_optimizer_steps"] == 1 and r["rm_flagged_pairs"] == 0 for r in quiet)
    assert all(r["rm_optimizer_steps"] == 3 for r in acting)
    assert sum(r["rm_flagged_pairs"] for r in acting) > 0
    assert all(r["reward_source"] == "reward_model" for r in records)
    assert [r["reward_version"] for r in records] == list(range(1, 13))


def test_rule_mode_never_calls_the_reward_service(tmp_path):
    # The reward service "lives" at a dead address: one call to it would fail the run.
    result = _cooper("train", "--no-progress", "run.mode=rule", "run.steps=2", "run.name=r",
                     f"run.output_dir={tmp_path}", "reward.server.address=127.0.0.1:1", "reward.server.unavailable_timeout_s=0",
                     *BASE)
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(tmp_path / "r")
    assert len(records) == 2
    assert all(r["reward_version_used"] == -1 for r in records)
    assert all(r["reward_mean"] == r["verifier_accuracy"] for r in records)  # rewards are the verdicts
    logs = {p.name for p in (tmp_path / "r" / "logs").iterdir()}
    assert logs == {"verifier.log", "policy.log"}


@pytest.mark.slow
def test_a_long_run_leaves_only_the_newest_checkpoints(tmp_path):
    """What a 1,000-step cooper-mode run leaves, in 30 steps: a checkpoint of each trainer every 2 updates (15
    written), at most keep_checkpoints of them kept, and journals holding nothing the newest checkpoint lacks."""
    steps = 30
    result = _cooper("train", "--no-progress", "run.mode=cooper", f"run.steps={steps}", "run.name=long",
                     f"run.output_dir={tmp_path}", "eval.every=0", "run.batch_size=8", "policy.save_every=2",
                     "policy.keep_checkpoints=3", "reward.save_every=2", "reward.keep_checkpoints=3")
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(tmp_path / "long")
    assert [r["policy_version"] for r in records] == list(range(1, steps + 1))
    checkpoints = tmp_path / "long" / "checkpoints"
    policy, reward = checkpoints / "policy", checkpoints / "reward"
    assert sorted(p.name for p in policy.iterdir()) == ["journal", "v00000026", "v00000028", "v00000030"]
    version = records[-1]["reward_version"]  # one per applied update; an update skipped for its gradient keeps it
    kept = sorted(p.name for p in reward.iterdir() if p.name != "journal")
    assert len(kept) == 3 and kept[-1] == f"v{version:08d}-u{steps:08d}"
    assert [int(name[-8:]) for name in kept] == [26, 28, 30]
    assert not list((policy / "journal").iterdir()) and not list((reward / "journal").iterdir())


def test_bad_config_fails_fast_with_the_key(tmp_path):
    result = _cooper("train", "run.stepz=3", f"run.output_dir={tmp_path}")
    assert result.returncode == 2 and "unknown config key 'run.stepz'" in result.stderr
    result = _cooper("train", "--resume", "nope", f"run.output_dir={tmp_path}")
    assert result.returncode == 2 and "drop --config and the overrides" in result.stderr
    result = _cooper("train", "--resume", str(tmp_path / "missing"))
    assert result.returncode == 1 and "cannot resume" in result.stderr


def test_a_run_in_one_process_is_the_run_the_services_give(tmp_path):
    """`cooper train --in-process`: the stages call the four services' cores in this process (services.py) instead of
    their gRPC clients; every metric of every step, losses included, is the one the same run through the services
    records, and no service process is started (the verifier's checks run in its pool's workers either way)."""
    args = ["train", "--no-progress", "run.steps=3", "run.seed=4", f"run.output_dir={tmp_path}", *BASE]
    remote = _cooper(*args, "run.name=remote")
    assert remote.returncode == 0, remote.stderr[-3000:]
    local = _cooper("train", "--in-process", *args[1:], "run.name=local")
    assert local.returncode == 0, local.stderr[-3000:]
    through_grpc, in_process = read_metrics(tmp_path / "remote"), read_metrics(tmp_path / "local")
    assert [r["step"] for r in in_process] == [0, 1, 2]
    assert in_process[-1]["pairs"] > 0 and in_process[-1]["reward_version"] == 3  # cooper mode: VerifyRM trained
    for grpc_step, local_step in zip(through_grpc, in_process, strict=True):
        untimed = {k: v for k, v in grpc_step.items() if not k.startswith("time/")}
        assert untimed == {k: v for k, v in local_step.items() if not k.startswith("time/")}
        # What the step waited on, both ways: every stage that ran, no longer than it ran; the chain's parts add up to
        # at least its longest stage
        critical = {k.removeprefix(CRITICAL): v for k, v in grpc_step.items() if k.startswith(CRITICAL)}
        ran = {k.removeprefix(TIME): v for k, v in grpc_step.items() if k.startswith(TIME) and k != ELAPSED
               and not k.startswith(CRITICAL) and k != TIME + "evaluate_initial"}
        assert set(critical) == set(ran) | {"queue"}
        assert all(0 <= critical[stage] <= ran[stage] + 1e-9 for stage in ran)
        assert sum(critical.values()) >= max(ran.values()) - 1e-9
        assert {k for k in local_step if k.startswith(CRITICAL)} == {CRITICAL + part for part in critical}
    service_logs = {"policy.log", "reward.log", "verifier.log", "generator.log"}
    assert {p.name for p in (tmp_path / "remote" / "logs").iterdir()} == service_logs
    assert not (tmp_path / "local" / "logs").exists()  # nothing was started that logs

    # The first two steps again, in this process, one job after another on this thread (what bench/step.py and a
    # debugger use); the config is the run's own, its checkpoints elsewhere.
    again = steps_in_process(load_config(tmp_path / "remote" / "config.resolved.yaml", environ={}), steps=2)
    assert [r["step"] for r in again] == [0, 1]
    for record, logged in zip(again, through_grpc, strict=False):
        assert {k: v for k, v in record.items() if not k.startswith("time/")} == \
            {k: v for k, v in logged.items() if not k.startswith("time/")}


def test_a_run_killed_between_logging_its_last_step_and_checkpointing_it_checkpoints_on_resume(tmp_path):
    """The window a chaos run found: every step logged, the run's final checkpoint not yet taken, the policy's
    newest checkpoint its save on stop. The resumed run has no step left to run and takes that checkpoint."""
    settings = ["--no-progress", "--in-process"]
    result = _cooper("train", *settings, "run.mode=rule", "run.steps=2", "run.name=r", f"run.output_dir={tmp_path}",
                     *BASE)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "r"
    newest = run_dir / "checkpoints" / "policy" / "v00000002" / "state.json"
    state = json.loads(newest.read_text())
    assert state["tag"] == "step-1"
    # As the kill leaves it: the services' save on stop under its own tag, and no checkpoint.json for the last step.
    newest.write_text(json.dumps({**state, "tag": "stop"}))
    (run_dir / "checkpoint.json").unlink()

    resumed = _cooper("train", *settings, "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(read_metrics(run_dir)) == 2  # nothing run again
    checkpoint = json.loads((run_dir / "checkpoint.json").read_text())
    assert (checkpoint["step"], checkpoint["policy_version"]) == (1, 2)
    assert json.loads(newest.read_text())["tag"] == "step-1"
