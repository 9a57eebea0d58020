"""The step graph's order, and the Redis queue driven by real stage workers with recording stage functions."""

from __future__ import annotations

import threading
import time
import typing
from pathlib import Path

import pytest
import redis

from cooper.config import CooperConfig, RunConfig, load_config
from cooper.experiments.figures import COLORS
from cooper.launcher.local import services_needed
from cooper.modes import COOPER, EXPERIMENT_LABELS, MODES, PAPER_RECIPE, RULE, STATIC
from cooper.orchestrator import graph as g
from cooper.orchestrator import stages
from cooper.orchestrator.data import StepData, tiny_splits
from cooper.orchestrator.graph import Job, StepGraph
from cooper.orchestrator.run_store import JobStatus, Logged, RunStore
from cooper.orchestrator.services import RemoteServices
from cooper.orchestrator.stages import StageContext
from cooper.orchestrator.worker import StageWorker


def test_cooper_graph_orders_the_two_stages():
    graph = StepGraph("cooper", steps=3, eval_every=0)
    deps = {j.id: {d.id for d in graph.dependencies(j)} for t in range(3) for j in graph.jobs(t)}
    assert deps["score:1"] == {"rollout:1", "reward_update:0"}  # v_{t+1} scores step t+1
    assert deps["reward_update:0"] == {"negatives:0", "score:0"}  # score(t) uses v_t before it is trained
    assert deps["rollout:1"] == {"policy_update:0"}
    assert deps["negatives:0"] == {"verify:0"}
    assert deps["policy_update:0"] == {"score:0"}  # stage 2 does not hold up the policy
    assert graph.dependents(Job(0, g.POLICY_UPDATE)) == [Job(1, g.ROLLOUT)]


def test_a_job_id_names_its_stage_and_a_bad_one_is_refused():
    job = Job.parse("reward_update:12")
    assert job == Job(12, g.Stage.REWARD_UPDATE) and job.id == "reward_update:12"
    assert set(stages.STAGES) == set(stages.RESULTS) == set(g.Stage)  # every stage runs and records, by its Stage
    for bad in ("reward_updates:12", "score", "score:x"):
        with pytest.raises(ValueError, match="not a job id"):
            Job.parse(bad)


def test_rule_and_static_graphs():
    rule, static = StepGraph("rule", 2, 0), StepGraph("static", 2, 0)
    assert rule.stages(0) == static.stages(0) == ["rollout", "verify", "score", "policy_update"]
    assert [d.id for d in rule.dependencies(Job(1, g.SCORE))] == ["verify:1"]
    assert [d.id for d in static.dependencies(Job(1, g.SCORE))] == ["rollout:1"]
    with pytest.raises(ValueError, match="unknown reward mode 'hybrid': one of rule, static, cooper"):
        StepGraph("hybrid", 1, 0)


def test_the_modes_are_defined_once():
    assert typing.get_args(RunConfig.model_fields["mode"].annotation) == tuple(MODES)
    assert [m for m in MODES.values() if m.reward_model_learns] == [COOPER]
    assert COOPER.services("generator") == ["verifier", "policy", "reward", "generator"]
    assert COOPER.services("rollouts") == STATIC.services("rollouts") == ["verifier", "policy", "reward"]
    assert RULE.services("generator") == ["verifier", "policy"] and RULE.reward_source == "verifier"
    # `cooper train` with no arguments (the tiny preset: negatives from the rollouts and the generator) starts all
    # four; the rollouts alone need no generator.
    tiny = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
    assert services_needed(load_config(tiny, [], environ={})) == ["verifier", "policy", "reward", "generator"]
    assert services_needed(load_config(tiny, ["run.negatives=rollouts"], environ={})) == ["verifier", "policy", "reward"]
    assert "generator" in services_needed(load_config(tiny, list(PAPER_RECIPE), environ={}))
    # Every label `cooper experiment` takes is a reward mode with overrides that load, and has its colour.
    for mode, overrides in EXPERIMENT_LABELS.values():
        assert load_config(tiny, [f"run.mode={mode}", *overrides], environ={}).run.mode == mode
    assert set(COLORS) == set(EXPERIMENT_LABELS)


def test_evaluation_runs_before_the_next_rollout():
    graph = StepGraph("cooper", steps=5, eval_every=2)
    assert [t for t in range(-1, 5) if graph.evaluates_after(t)] == [-1, 1, 3, 4]
    assert {d.id for d in graph.dependencies(Job(2, g.ROLLOUT))} == {"policy_update:1", "evaluate:1"}
    # The initial policy is evaluated before the first update changes it, beside the first rollout.
    assert [j.id for j in graph.roots()] == ["rollout:0", "evaluate:-1"] and graph.first_step() == -1
    assert {d.id for d in graph.dependencies(Job(0, g.POLICY_UPDATE))} == {"score:0", "evaluate:-1"}
    assert graph.dependencies(Job(-1, g.EVALUATE)) == [] and graph.jobs(-1) == [Job(-1, g.EVALUATE)]
    assert [j.id for j in graph.dependents(Job(-1, g.EVALUATE))] == ["policy_update:0"]
    off = StepGraph("cooper", steps=5, eval_every=0)
    assert [j.id for j in off.roots()] == ["rollout:0"] and off.first_step() == 0 and off.jobs(-1) == []


def test_rollouts_ahead_wait_for_the_update_max_staleness_steps_back():
    graph = StepGraph("cooper", steps=6, eval_every=3, max_staleness=1)
    deps = {j.id: {d.id for d in graph.dependencies(j)} for t in range(6) for j in graph.jobs(t)}
    assert deps["rollout:1"] == {"rollout:0"}  # samples the run's first version, after rollout(0) found it
    assert deps["rollout:2"] == {"policy_update:0"} and deps["rollout:5"] == {"policy_update:3"}
    # The updates keep their order themselves now, and evaluation sees its version before the next update.
    assert deps["policy_update:3"] == {"score:3", "policy_update:2", "evaluate:2"}
    assert deps["policy_update:1"] == {"score:1", "policy_update:0"}
    assert deps["score:2"] == {"rollout:2", "reward_update:1"}  # the reward side keeps its order
    assert {j.id for j in graph.dependents(Job(0, g.POLICY_UPDATE))} == {"policy_update:1", "rollout:2"}
    assert {j.id for j in graph.dependents(Job(2, g.EVALUATE))} == {"policy_update:3"}
    two = StepGraph("rule", steps=6, eval_every=0, max_staleness=2)
    assert {d.id for d in two.dependencies(Job(2, g.ROLLOUT))} == {"rollout:1"}
    assert {d.id for d in two.dependencies(Job(5, g.ROLLOUT))} == {"policy_update:2"}
    assert Job(5, g.ROLLOUT) in two.dependents(Job(2, g.POLICY_UPDATE))
    with pytest.raises(ValueError, match="max_staleness"):
        StepGraph("rule", 2, 0, max_staleness=-1)


def test_reward_updates_behind_read_exactly_the_version_k_updates_back():
    graph = StepGraph("cooper", steps=5, eval_every=0, reward_staleness=1)
    deps = {j.id: {d.id for d in graph.dependencies(j)} for t in range(5) for j in graph.jobs(t)}
    assert deps["score:1"] == {"rollout:1"}  # steps 0 and 1 read the run's first version
    assert deps["score:2"] == {"rollout:2", "reward_update:0"} and deps["score:4"] == {"rollout:4", "reward_update:2"}
    # reward_update(t) waits for score(t+1), the last score that reads v_t, and for the update before it.
    assert deps["reward_update:0"] == {"negatives:0", "score:1"}
    assert deps["reward_update:2"] == {"negatives:2", "score:3", "reward_update:1"}
    assert deps["reward_update:4"] == {"negatives:4", "score:4", "reward_update:3"}  # the last step has no later score
    # What a worker wakes when a job ends: the update one step back waits for this step's score.
    assert {j.id for j in graph.dependents(Job(3, g.SCORE))} == {"policy_update:3", "reward_update:2"}
    assert {j.id for j in graph.dependents(Job(1, g.REWARD_UPDATE))} == {"reward_update:2", "score:3"}
    # Nothing waits in a cycle: the jobs run in some order, each after what it waits for.
    done: set[str] = set()
    pending = [j for t in range(5) for j in graph.jobs(t)]
    while pending:
        ready = [j for j in pending if deps[j.id] <= done]
        assert ready, f"{[j.id for j in pending]} wait for each other"
        done |= {j.id for j in ready}
        pending = [j for j in pending if j.id not in done]
    # k = 0 is the paper's order, and modes whose reward model does not learn have no reward update to run behind.
    assert {d.id for d in StepGraph("cooper", 5, 0, reward_staleness=0).dependencies(Job(2, g.SCORE))} == {
        "rollout:2", "reward_update:1"}
    assert StepGraph("static", 5, 0, reward_staleness=1).reward_staleness == 0
    with pytest.raises(ValueError, match="reward_staleness"):
        StepGraph("cooper", 2, 0, reward_staleness=-1)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(("max_staleness", "reward_staleness"), [(0, 0), (1, 0), (0, 1), (2, 1), (1, 2)])
def test_no_job_reads_a_result_the_driver_has_deleted(mode: str, max_staleness: int, reward_staleness: int):
    # A stage reads results of its own step and of its dependencies (stages.py: the versions rollouts and scores
    # must find, the update before an update). Job j of step t runs while at most step t-1 is logged, and logging
    # step L deletes the results of step L - steps_read_back (run.py).
    graph = StepGraph(mode, steps=12, eval_every=3, max_staleness=max_staleness, reward_staleness=reward_staleness)
    for t in range(12):
        for job in graph.jobs(t):
            newest_logged = t - 1
            for read in graph.dependencies(job):
                assert read.step > newest_logged - graph.steps_read_back, (job.id, read.id)
    assert StepGraph(mode, 4, 0).steps_read_back == 1  # the paper's order: only the step just logged is read on


def test_reward_updates_behind_stay_within_the_alarms_reach():
    tiny = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
    assert load_config(tiny, ["run.reward_max_staleness=2", "alarm.mode=act"], environ={}).run.reward_max_staleness == 2
    with pytest.raises(ValueError, match="run.reward_max_staleness=3 with alarm.mode=act: at most 2"):
        load_config(tiny, ["run.reward_max_staleness=3", "alarm.mode=act"], environ={})


def test_steps_are_seeded_epochs_without_repeats():
    rows, _ = tiny_splits(seed=3, train_size=10)
    data = StepData(rows, batch_size=4, seed=3)
    first_epoch = [e.id for t in range(2) for e in data.batch(t)] + [e.id for e in data.batch(2)][:2]
    assert sorted(first_epoch) == sorted(r.id for r in rows)  # every row once per epoch
    assert [e.id for e in data.batch(1)] == [e.id for e in StepData(rows, 4, 3).batch(1)]  # a pure function of t
    assert [e.id for e in data.batch(5)] != [e.id for e in StepData(rows, 4, 4).batch(5)]
    assert data.position(3) == (1, 2)


def _context(store: RunStore, mode: str, steps: int) -> StageContext:
    config = CooperConfig.model_validate({"run": {"mode": mode, "steps": steps}})
    rows, tests = tiny_splits(0, train_size=50)
    return StageContext(config, "r", store, StepData(rows, 2, 0), tests, RemoteServices(config, {}))


def _recording_stages(monkeypatch, log: list[str], lock: threading.Lock, fail_once: set[str] | None = None):
    fail_once = fail_once if fail_once is not None else set()

    def make(stage):
        def run(ctx, step):
            job = f"{stage}:{step}"
            if job in fail_once:
                fail_once.discard(job)
                raise RuntimeError("transient")
            time.sleep(0.002)
            with lock:
                log.append(job)
            return {"job": job}
        return run

    for stage in list(stages.STAGES):
        monkeypatch.setitem(stages.STAGES, stage, make(stage))


def _drain(store: RunStore, graph: StepGraph, ctx: StageContext, workers: int, steps: int) -> None:
    pool = [StageWorker(ctx, graph, f"w{i}", max_attempts=2) for i in range(workers)]
    threads = [threading.Thread(target=w.loop, daemon=True) for w in pool]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while not all(graph.step_complete(t, store.done()) for t in range(steps)):
        assert time.monotonic() < deadline, f"not drained; done: {sorted(store.done())}"
        assert "error" not in store.state(), store.state()
        time.sleep(0.01)
    for w in pool:
        w.stop_event.set()
    for thread in threads:
        thread.join()


def test_workers_run_every_job_once_in_dependency_order(redis_client, run_id, monkeypatch):
    log: list[str] = []
    lock = threading.Lock()
    _recording_stages(monkeypatch, log, lock, fail_once={"negatives:1"})
    store = RunStore(redis_client, "cooper-test", run_id)
    graph = StepGraph("cooper", steps=4, eval_every=2)
    for job in graph.roots():
        store.enqueue(job.id)
    _drain(store, graph, _context(store, "cooper", 4), workers=3, steps=4)
    expected = {j.id for t in range(-1, 4) for j in graph.jobs(t)}
    assert sorted(log) == sorted(expected)  # once each, the failed attempt retried once
    position = {job: i for i, job in enumerate(log)}
    for t in range(-1, 4):
        for job in graph.jobs(t):
            for dep in graph.dependencies(job):
                assert position[dep.id] < position[job.id], (dep.id, job.id)
    assert store.status("negatives:1")["status"] == JobStatus.DONE.value
    score = store.result("score:2")
    assert set(score) == {"job", "seconds", "finished_at"} and score["job"] == "score:2"
    assert abs(score["finished_at"] - time.time()) < 600  # a wall-clock time: what the step's critical path reads
    assert isinstance(score["seconds"], float) and 0 <= score["seconds"] < 60  # the worker timed the stage
    assert store.pending_count() == 0


def test_a_job_failing_past_its_retries_fails_the_run(redis_client, run_id, monkeypatch):
    monkeypatch.setitem(stages.STAGES, g.ROLLOUT, lambda ctx, step: (_ for _ in ()).throw(ValueError("boom")))
    store = RunStore(redis_client, "cooper-test", run_id)
    graph = StepGraph("rule", steps=1, eval_every=0)
    store.enqueue("rollout:0")
    worker = StageWorker(_context(store, "rule", 1), graph, "w", max_attempts=2)
    thread = threading.Thread(target=worker.loop, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while "error" not in store.state() and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop_event.set()
    thread.join()
    assert "job rollout:0 failed 2 times: ValueError: boom" in store.state()["error"]
    assert store.status("rollout:0")["status"] == "failed"


def test_a_dead_workers_job_is_claimed_and_rerun(redis_client, run_id, monkeypatch):
    log: list[str] = []
    _recording_stages(monkeypatch, log, threading.Lock())
    store = RunStore(redis_client, "cooper-test", run_id)
    graph = StepGraph("rule", steps=1, eval_every=0)
    store.enqueue("rollout:0")
    taken = store.take("doomed-worker")  # taken and never acknowledged: the worker died
    assert taken is not None and taken[1] == "rollout:0"
    survivor = StageWorker(_context(store, "rule", 1), graph, "survivor", claim_idle_s=0.05)
    time.sleep(0.1)
    thread = threading.Thread(target=survivor.loop, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not graph.step_complete(0, store.done()) and time.monotonic() < deadline:
        time.sleep(0.01)
    survivor.stop_event.set()
    thread.join()
    assert log == ["rollout:0", "verify:0", "score:0", "policy_update:0"]
    assert store.pending_count() == 0


def test_enqueue_is_idempotent_and_runs_do_not_share_keys(redis_client, run_id):
    a, b = RunStore(redis_client, "cooper-test", run_id), RunStore(redis_client, "cooper-test", run_id + "-other")
    assert a.enqueue("rollout:0") and not a.enqueue("rollout:0")
    assert b.enqueue("rollout:0")
    a.finish("rollout:0", {"x": 1})
    assert a.is_done("rollout:0") and not b.is_done("rollout:0")
    a.clear()
    assert not list(redis_client.scan_iter(match=f"cooper-test:{run_id}:*"))
    assert b.status("rollout:0")["status"] == "queued"


def test_resume_existing_finds_a_started_run_only(tmp_path):
    from cooper.launcher.launch import RESOLVED, existing_run

    config = CooperConfig.model_validate({"run": {"name": "r1", "output_dir": str(tmp_path)}})
    assert existing_run(config) is None
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / RESOLVED).write_text("run: {}\n")
    assert existing_run(config) == str(tmp_path / "r1")
    assert existing_run(CooperConfig.model_validate({"run": {"output_dir": str(tmp_path)}})) is None


def test_prepare_models_builds_only_for_services_this_run_starts(monkeypatch):
    """Under compose or Kubernetes the services build their own tiny models; the orchestrator must not (it cost
    every orchestrator container start a minute of CPU, in a cache no service reads)."""
    import cooper.runtime.models as models
    from cooper.launcher.launch import prepare_models

    built: list[tuple[str, str]] = []
    monkeypatch.setattr(models, "resolve_model", lambda name, kind: built.append((name, kind)) or name)
    tree = {"policy": {"model": "tiny-sft"}, "reward": {"model": "tiny-rm"}}
    prepare_models(CooperConfig.model_validate(tree))
    assert built == [("tiny-sft", "causal"), ("tiny-rm", "reward")]
    built.clear()
    prepare_models(CooperConfig.model_validate({**tree, "run": {"mode": "rule"}}))
    assert built == [("tiny-sft", "causal")]
    built.clear()
    remote = {"policy": {"model": "tiny-sft", "server": {"address": "policy:50053"}},
              "reward": {"model": "tiny-rm", "server": {"address": "reward:50052"}}}
    prepare_models(CooperConfig.model_validate(remote))
    assert built == []
    prepare_models(CooperConfig.model_validate({**remote, "policy": {"model": "tiny-sft"}}))
    assert built == [("tiny-sft", "causal")]


def test_the_tiny_test_set_size_is_configurable_and_keeps_its_first_problems():
    from cooper.orchestrator.data import load_data

    small = load_data(CooperConfig.model_validate({"run": {"seed": 4}}))[1]
    large = load_data(CooperConfig.model_validate({"run": {"seed": 4}, "data": {"tiny_test_size": 256}}))[1]
    for name in ("heldout", "seen"):
        assert (len(small[name]), len(large[name])) == (64, 256)
        assert len({row.question for row in large[name]}) > 200  # distinct problems, not one problem repeated
        assert [row.id for row in large[name][:64]] == [row.id for row in small[name]]


def test_enqueue_is_all_or_nothing(redis_client, run_id):
    """The enqueued flag, the status and the stream entry are written together or not at all: a job marked enqueued
    that is on no queue would be skipped by every resume, and the run would wait for it forever."""
    store = RunStore(redis_client, "cooper-test", run_id)
    assert store.enqueue("rollout:0") and not store.enqueue("rollout:0")
    assert store.status("rollout:0")["status"] == JobStatus.QUEUED.value
    assert [fields["job"] for _, fields in redis_client.xrange(store.stream)] == ["rollout:0"]
    # The stream's XADD fails (its key holds a string): nothing of the job may be left behind...
    broken = RunStore(redis_client, "cooper-test", run_id + "-broken")
    redis_client.delete(broken.stream)
    redis_client.set(broken.stream, "not a stream")
    with pytest.raises(redis.ResponseError):
        broken.enqueue("rollout:0")
    assert not redis_client.exists(broken.key("enqueued:rollout:0")) and broken.status("rollout:0") is None
    # ...so that once the cause is gone the job is enqueued, not skipped as enqueued before.
    redis_client.delete(broken.stream)
    assert RunStore(redis_client, "cooper-test", run_id + "-broken").enqueue("rollout:0")


def test_in_act_mode_the_stages_taking_the_alarms_actions_wait_two_steps_behind_the_drivers_log(redis_client, run_id):
    # The alarm raises when the driver logs a step; a stage that reads its actions at step t waits until step t - 2 is
    # logged, so however slow the driver, an action raised at step s is in force from step s + 2 on.
    store = RunStore(redis_client, "cooper-test", run_id)
    store.set_logged(Logged(1))
    config = CooperConfig.model_validate({"run": {"mode": "static", "steps": 9}, "alarm": {"mode": "act"}})
    ctx = StageContext(config, "r", store, StepData(tiny_splits(0, train_size=50)[0], 2, 0), {},
                       RemoteServices(config, {}))
    started = time.monotonic()
    stages.await_the_alarm(ctx, 3)  # step 1 is logged: no wait
    assert time.monotonic() - started < 0.1
    threading.Timer(0.3, lambda: store.set_logged(Logged(2))).start()
    stages.await_the_alarm(ctx, 4)
    assert time.monotonic() - started >= 0.3 and store.logged().through == 2
    # A run that is stopping does not wait for a log that will never come: the job stays pending for the resume.
    ctx.close()
    with pytest.raises(RuntimeError, match="stopping before step 6 was logged"):
        stages.await_the_alarm(ctx, 8)
    # Warn mode (and a rule run) never waits: no action is taken from the alarm there.
    warn = CooperConfig.model_validate({"run": {"mode": "static", "steps": 9}, "alarm": {"mode": "warn"}})
    stages.await_the_alarm(StageContext(warn, "r", store, ctx.data, {}, RemoteServices(warn, {})), 8)
