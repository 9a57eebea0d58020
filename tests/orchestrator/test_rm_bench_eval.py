"""eval.rm_benchmark_path: the evaluation stage scores a labelled benchmark with the reward model's current
version through a real reward service (Score RPC), and the step record carries rm_bench/* metrics."""

from __future__ import annotations

import random

import pytest

from cooper.config import ConfigError, CooperConfig, OptimConfig, load_config
from cooper.evaluation.rm_bench import reward_model_report, tiny_bench
from cooper.orchestrator import graph as g
from cooper.orchestrator import stages
from cooper.orchestrator.data import StepData, tiny_splits
from cooper.orchestrator.graph import Job, StepGraph
from cooper.orchestrator.run import rm_benchmark, step_record
from cooper.orchestrator.run_store import RunStore
from cooper.orchestrator.services import RemoteServices
from cooper.orchestrator.stage_results import (
    DataPosition,
    EvaluationResult,
    PolicyUpdateResult,
    Prompt,
    RmBenchResult,
    RolloutResult,
    ScoreResult,
    VerificationResult,
    to_json,
)
from cooper.orchestrator.stages import StageContext
from cooper.runtime.models import resolve_model
from cooper.runtime.processes import start_service
from cooper.services.policy.messages import Completion
from cooper.services.reward.items import PreferencePair, ScoreItem
from cooper.services.reward.verify_rm import VerifyRM
from cooper.services.verifier.messages import Verdict
from cooper.tiny.task import make_split, wrong_solution


@pytest.fixture(scope="module")
def reward_service(tmp_path_factory):
    """A real reward service on the random tiny VerifyRM, with a learning rate that moves its scores."""
    service = start_service("reward", overrides=[
        "reward.model=tiny", "reward.device=cpu", "reward.torch_threads=1", "reward.http.enabled=false",
        "reward.server.metrics_port=null", "reward.optim.lr=3e-3",
        f"reward.checkpoint_dir={tmp_path_factory.mktemp('rm-checkpoints')}"])
    yield service
    service.stop()


def test_evaluation_scores_the_benchmark_with_the_current_reward_version(reward_service, redis_client, run_id):
    bench = tiny_bench(48, seed=1)
    config = CooperConfig.model_validate({"run": {"mode": "cooper"}, "eval": {"every": 1}})
    rows, _ = tiny_splits(0, train_size=10)
    ctx = StageContext(config, run_id, RunStore(redis_client, "test", run_id), StepData(rows, 2, 0), {},
                       RemoteServices(config, {"reward": reward_service.address}), bench)
    try:
        first = stages.evaluate(ctx, 0).rm_bench
        # The service's numbers are those of the same weights loaded here, thresholded at 0.5.
        rm = VerifyRM.load(resolve_model("tiny", "reward"), OptimConfig(), device="cpu")
        local = reward_model_report(bench, [s for s, _ in rm.score(
            [ScoreItem(i.question, i.reference, i.completion) for i in bench])])
        assert first.reward_version == 0
        assert first.accuracy == pytest.approx(local.accuracy)
        assert first.auroc == pytest.approx(local.auroc, abs=1e-6)

        # One Bradley-Terry update later, the next evaluation sees version 1 and its changed scores.
        pairs = [PreferencePair(p.question, p.answer, p.solution, wrong_solution(p, random.Random(0)))
                 for p in make_split(16, 5, "rm-bench-update")]
        assert ctx.reward.update(run_id, 0, pairs).version == 1
        second = stages.evaluate(ctx, 1).rm_bench
        assert second.reward_version == 1
        assert second.auroc != first.auroc
    finally:
        ctx.close()


def test_step_record_logs_rm_bench_metrics_on_evaluation_steps(redis_client, run_id):
    config = CooperConfig.model_validate({"run": {"mode": "static", "steps": 2}, "eval": {"every": 2}})
    rows, _ = tiny_splits(0, train_size=10)
    store = RunStore(redis_client, "test", run_id)
    ctx = StageContext(config, run_id, store, StepData(rows, 2, 0), {}, RemoteServices(config, {}))
    graph = StepGraph("static", 2, 2)
    results = {
        g.ROLLOUT: RolloutResult(policy_version=0, prompts=[Prompt("1-0-a", "q", "1", "a")],
                                 completions=[Completion("1-0-a", 0, "\\boxed{1}", [5], [-0.1], "stop", [3])],
                                 data_position=DataPosition(0, 0)),
        g.VERIFY: VerificationResult(verdicts=[Verdict.CORRECT], extracted=["1"]),
        g.SCORE: ScoreResult(rewards=[0.9], logits=[], reward_version=0),
        g.POLICY_UPDATE: PolicyUpdateResult(metrics={}, policy_version=1, replayed=False, reward_source="reward_model"),
        g.EVALUATE: EvaluationResult(accuracy={"heldout": 0.5, "seen": 0.75}, policy_version=1,
                                     rm_bench=RmBenchResult(accuracy=0.75, auroc=0.8, reward_version=0)),
    }
    for stage, result in results.items():
        result.seconds = 0.1
        store.finish(Job(1, stage).id, to_json(result))
    record = step_record(ctx, graph, 1).metrics
    assert (record["rm_bench/accuracy"], record["rm_bench/auroc"], record["rm_bench/reward_version"]) == (0.75, 0.8, 0)
    assert record["verifier_accuracy"] == 1.0 and record["time/evaluate"] == 0.1
    assert ctx.verification(1) == results[g.VERIFY]  # back from its JSON as it went in, the verdict an enum again
    assert (record["test/heldout"], record["test/seen"]) == (0.5, 0.75)


def test_rm_benchmark_config(tmp_path):
    with pytest.raises(ConfigError, match="eval.every is 0"):
        load_config(None, ["eval.rm_benchmark_path=tiny", "eval.every=0"])
    assert load_config(None, []).eval.rm_benchmark_path is None  # off by default
    assert rm_benchmark(load_config(None, ["eval.rm_benchmark_path=tiny", "eval.every=5"]))
    assert rm_benchmark(load_config(None, ["eval.rm_benchmark_path=tiny", "eval.every=5", "run.mode=rule"])) == []
    with pytest.raises(ValueError, match="missing.jsonl: no such file"):
        rm_benchmark(load_config(None, [f"eval.rm_benchmark_path={tmp_path / 'missing.jsonl'}", "eval.every=5"]))
