"""The driver of one run: seeds the graph, runs stage workers, logs each finished step, checkpoints, cleans up.

The driver only watches Redis: it turns finished steps into metrics, asks services to save every
`checkpoint_every` steps, and deletes a step's payloads once no stage can read them any more
(StepGraph.steps_read_back). Stage workers (threads here; other processes or pods may join through the same Redis)
do the work.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cooper.config import CooperConfig
from cooper.evaluation.exploit_check import false_positives_by_prompt
from cooper.evaluation.monitor import auroc, false_positive_rate
from cooper.evaluation.rm_bench import BenchItem, load_bench
from cooper.metric_names import (
    ALARM_RM_NEGATIVES,
    ALARM_ROLLED_BACK_TO,
    CRITICAL,
    CRITICAL_QUEUE,
    ELAPSED,
    KL_FROM_INITIAL,
    MODE,
    PAIR_ACCURACY_AFTER,
    PAIR_ACCURACY_BEFORE,
    PAIRS,
    POLICY,
    POLICY_KL,
    POLICY_KL_SEQ,
    POLICY_RESPONSE_LENGTH,
    POLICY_VERSION,
    POLICY_VERSION_SAMPLED,
    REWARD_ACCURACY_GAP,
    REWARD_MEAN,
    REWARD_SOURCE,
    REWARD_VERSION,
    REWARD_VERSION_USED,
    RM_AUROC,
    RM_AUROC_SUPPORT,
    RM_BENCH,
    RM_BENCH_INITIAL,
    RM_FALSE_POSITIVE_RATE,
    RM_FALSE_POSITIVES_BY_PROMPT,
    RM_VERIFIER_DISAGREEMENT,
    ROLLOUTS,
    STEP,
    TEST,
    TEST_INITIAL,
    TIME,
    VERIFIER_ACCURACY,
)
from cooper.modes import reward_mode
from cooper.orchestrator import graph as g
from cooper.orchestrator.alarm_watch import AlarmWatch
from cooper.orchestrator.data import StepData, load_data
from cooper.orchestrator.graph import StepGraph
from cooper.orchestrator.outputs import MetricsLog, read_metrics, trim_metrics
from cooper.orchestrator.run_store import JobStatus, Logged, RunStore
from cooper.orchestrator.services import Services
from cooper.orchestrator.stage_results import EvaluationResult, StageResult, to_json
from cooper.orchestrator.stages import StageContext, rm_accepts
from cooper.orchestrator.trackers import Tracker
from cooper.orchestrator.worker import StageWorker, worker_name
from cooper.runtime.client import ServiceUnavailable
from cooper.runtime.files import write_atomically
from cooper.services.verifier.messages import Verdict

log = logging.getLogger("cooper.orchestrator")


class RunFailed(RuntimeError):
    """A job failed past its retries, or a service was lost; the message names the job (or service), the error,
    and how to go on."""


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


@dataclass
class StepRecord:
    """One finished step as the driver logs it."""

    metrics: dict[str, Any]
    """The reward-hacking monitor's and the training numbers: the step's line of metrics.jsonl."""
    logged: Logged
    """Where the run stands after it: where a resumed run starts, in the data and in the steps."""


def step_record(ctx: StageContext, graph: StepGraph, step: int) -> StepRecord:
    """One finished step's record, from its jobs' results (`stage_results`)."""
    ro, ve, sc, pu = ctx.rollout(step), ctx.verification(step), ctx.scores(step), ctx.policy_update(step)
    verdicts = ve.verdicts
    correct = [v is Verdict.CORRECT for v in verdicts]
    rewards = sc.rewards
    record: dict[str, Any] = {
        STEP: step,
        MODE: graph.mode,
        REWARD_MEAN: _mean(rewards),
        VERIFIER_ACCURACY: _mean([float(c) for c in correct]),
        "no_answer_rate": _mean([float(v is Verdict.NO_ANSWER) for v in verdicts]),
        REWARD_VERSION_USED: sc.reward_version,
        POLICY_VERSION: pu.policy_version,
        REWARD_SOURCE: pu.reward_source,
        POLICY_VERSION_SAMPLED: ro.policy_version,
        # Versions between the one that sampled the rollout and the one its update started from (run.max_staleness).
        "policy_staleness": pu.policy_version - 1 - ro.policy_version,
        "prompt_ids": [p.example for p in ro.prompts],
        "data_epoch": ro.data_position.epoch,
        "data_offset": ro.data_position.offset,
    }
    reward_version = sc.reward_version  # VerifyRM's version after the step: the one that scored it, or its update's
    if graph.reward.reward_model_scores:
        # How often VerifyRM and the verifier disagree: the first sign of reward hacking.
        accepted = rm_accepts(sc)
        record[RM_VERIFIER_DISAGREEMENT] = _mean([float(a != c) for a, c in zip(accepted, correct, strict=True)])
        record[REWARD_ACCURACY_GAP] = record[REWARD_MEAN] - record[VERIFIER_ACCURACY]
        # Threshold-free: does VerifyRM still rank the verifier's correct rollouts above its wrong ones? On the
        # logits, which the discrete variant keeps. And how many wrong ones does it accept?
        record[RM_AUROC] = auroc(sc.logits or rewards, correct)
        record[RM_AUROC_SUPPORT] = min(sum(correct), len(correct) - sum(correct))  # the smaller class it ranks
        record[RM_FALSE_POSITIVE_RATE] = false_positive_rate(accepted, correct)
        record[ROLLOUTS] = len(correct)  # with the two rates above, the alarm's counts (exploit_check.step_counts)
        # The alarm's absolute check counts prompts, not rollouts: a blind spot is usually a prompt's (exploit_check.py)
        record[RM_FALSE_POSITIVES_BY_PROMPT] = false_positives_by_prompt(accepted, correct,
                                                                         len(correct) // len(ro.prompts))
    if pu.rolled_back_to is not None:  # the alarm's rollback took this step's update: the version it restored
        record[ALARM_ROLLED_BACK_TO] = pu.rolled_back_to
    for key, value in pu.metrics.items():
        record[POLICY + key] = value
    if POLICY_KL_SEQ in pu.metrics:  # reported only when the policy measured KL against its initial weights
        # KL(pi || pi_initial) per completion, the x axis of the over-optimisation plot (Gao et al. 2022): the
        # policy's token-mean k3 estimate (against the frozen initial policy) times the mean completion length.
        record[KL_FROM_INITIAL] = pu.metrics[POLICY_KL] * pu.metrics[POLICY_RESPONSE_LENGTH]
    results: list[tuple[g.Stage, StageResult]] = [(g.ROLLOUT, ro), (g.VERIFY, ve), (g.SCORE, sc), (g.POLICY_UPDATE, pu)]
    if graph.reward.reward_model_learns:
        ng, ru = ctx.negatives(step), ctx.reward_update(step)
        results += [(g.NEGATIVES, ng), (g.REWARD_UPDATE, ru)]
        record.update({
            PAIRS: ru.pairs,
            "valid_pair_rate": (ru.pairs - ru.flagged_pairs) / max(1, ng.prompts),
            "positive_rate": ng.positives / max(1, ng.prompts),
            PAIR_ACCURACY_BEFORE: ru.pair_accuracy_before if ru.pairs else None,
            PAIR_ACCURACY_AFTER: ru.pair_accuracy_after if ru.pairs else None,
            "rm_loss": ru.loss if ru.pairs else None, "rm_grad_norm": ru.grad_norm if ru.pairs else None,
            REWARD_VERSION: ru.reward_version,
            "rm_flagged_pairs": ru.flagged_pairs, "rm_optimizer_steps": ru.optimizer_steps,
            ALARM_RM_NEGATIVES: ru.alarm_acted,
        })
        reward_version = ru.reward_version
    if graph.evaluates_after(step):
        evaluation = ctx.evaluation(step)
        results.append((g.EVALUATE, evaluation))
        record.update(evaluation_record(evaluation, TEST, RM_BENCH))
    if step == 0 and graph.evaluates_after(-1):  # the initial policy's evaluation, before any update
        initial = ctx.evaluation(-1)
        record.update(evaluation_record(initial, TEST_INITIAL, RM_BENCH_INITIAL))
        record[TIME + "evaluate_initial"] = initial.seconds
    for stage, result in results:
        record[TIME + stage] = result.seconds
    record.update({CRITICAL + part: seconds for part, seconds in critical_path(graph, step, dict(results)).items()})
    return StepRecord(record, Logged(step, pu.policy_version, reward_version, ro.data_position.epoch,
                                     ro.data_position.offset))


def critical_path(graph: StepGraph, step: int, results: dict[g.Stage, StageResult]) -> dict[str, float]:
    """What the step waited on: from the step's job that ended last, back through the job of the same step it waited
    for longest (its dependency that ended last), each stage's seconds on that chain (0 off it), and `queue`, the
    gaps between one job's end and the next one's start (Redis, a worker's wake-up, a free worker). A stage that ran
    beside the chain (VerifyRM's update beside the policy's, with run.reward_max_staleness) costs the step nothing."""
    timed = {stage: result for stage, result in results.items() if result.finished_at}
    if not timed:
        return {}
    chain: dict[str, float] = {str(stage): 0.0 for stage in timed}
    queued, stage = 0.0, max(timed, key=lambda s: timed[s].finished_at)
    while True:
        chain[str(stage)] = timed[stage].seconds
        started = timed[stage].finished_at - timed[stage].seconds
        before = [job.stage for job in graph.dependencies(g.Job(step, stage)) if job.step == step and job.stage in timed]
        if not before:
            return {**chain, CRITICAL_QUEUE: queued}
        stage = max(before, key=lambda s: timed[s].finished_at)
        queued += max(0.0, started - timed[stage].finished_at)


def evaluation_record(evaluation: EvaluationResult, test: str, rm_bench: str) -> dict[str, Any]:
    """An evaluation's metrics: accuracy per test set, and the reward model's on eval.rm_benchmark_path."""
    record: dict[str, Any] = {test + name: accuracy for name, accuracy in evaluation.accuracy.items()}
    if evaluation.rm_bench is not None:
        record.update({rm_bench + key: value for key, value in to_json(evaluation.rm_bench).items()})
    return record


def rm_benchmark(config: CooperConfig) -> list[BenchItem]:
    """The items of eval.rm_benchmark_path; none in rule mode, where no reward model runs."""
    path = config.eval.rm_benchmark_path
    if path and not reward_mode(config.run.mode).reward_model_scores:
        log.warning("eval.rm_benchmark_path is ignored in rule mode: there is no reward model to score it")
        return []
    return load_bench(path) if path else []


class Orchestrator:
    def __init__(self, config: CooperConfig, run_id: str, run_dir: Path, store: RunStore, services: Services,
                 workers: int = 3, trackers: Sequence[Tracker] = ()):
        self.config, self.run_id, self.run_dir, self.store = config, run_id, run_dir, store
        self.trackers = trackers  # W&B, MLflow: they get each step's metrics as metrics.jsonl does
        rows, tests = load_data(config)
        self.graph = StepGraph(config.run.mode, config.run.steps, config.eval.every,
                               verify_before_update=config.alarm.mode == "act",
                               max_staleness=config.run.max_staleness,
                               reward_staleness=config.run.reward_max_staleness)
        self.ctx = StageContext(config, run_id, store, StepData(rows, config.run.batch_size, config.run.seed), tests,
                                services, rm_benchmark(config))
        self.workers = [StageWorker(self.ctx, self.graph, worker_name(i)) for i in range(workers)]

    def _start(self, resume: bool) -> int:
        state = self.store.state()
        if not state:
            self.store.begin(self.run_id, self.config.run.steps)
            for job in self.graph.roots():
                self.store.enqueue(job.id)
            return 0
        if not resume:
            raise RunFailed(f"run {self.run_id} already has state in Redis; resume it with --resume {self.run_id}")
        if state.get("error"):  # the run stopped on a failure; resuming is the user's word that it is fixed
            log.info("resuming after the failure: %s", state["error"])
            self.store.clear_error()
        self.store.reset_attempts()
        # The previous orchestrator is gone: its unacknowledged jobs go back on the queue at once.
        for message_id, job_id in self.store.claim_stale("resume", 0):
            log.info("re-queueing job %s left unfinished by the previous run", job_id)
            self.store.requeue(job_id)
            self.store.ack(message_id)
        next_step = self.store.logged().through + 1
        # Said at INFO: in a container restarted by its supervisor this line is how one sees the run continued.
        log.info("resuming run %s at step %d of %d", self.run_id, next_step, self.config.run.steps)
        # A crash between recording a job and enqueueing what it unblocked leaves that job done and the next one
        # never queued; enqueue (idempotently) every job whose inputs are all done. A job that failed for good
        # was enqueued before (so enqueue() would skip it) and is on no queue: it is queued again.
        done = self.store.done()
        first = self.graph.first_step() if next_step == 0 else next_step
        for step in range(first, self.config.run.steps):
            for job in self.graph.jobs(step):
                if job.id not in done and all(d.id in done for d in self.graph.dependencies(job)):
                    if (self.store.status(job.id) or {}).get("status") == JobStatus.FAILED.value:
                        log.info("re-queueing job %s, which failed the previous run", job.id)
                        self.store.requeue(job.id)
                    else:
                        self.store.enqueue(job.id)
        return next_step

    def _failed(self, error: str, step: int) -> RunFailed:
        """The run-stopping error, with where the run stands and what to do next."""
        return RunFailed(f"{error}\nThe run stopped before step {step}; its state is kept. Fix the cause (service "
                         f"logs: {self.run_dir / 'logs'}), then continue it with: cooper train --resume {self.run_id}")

    def _checkpoint(self, step: int) -> None:
        policy = self.ctx.policy.save(tag=f"step-{step}")
        info: dict[str, Any] = {"step": step, "policy_checkpoint": policy.path, "policy_version": policy.version}
        if self.graph.reward.reward_model_scores:
            reward = self.ctx.reward.save(tag=f"step-{step}")
            info.update(reward_checkpoint=reward.path, reward_version=reward.version)
        self.store.set_state(last_checkpoint=info)
        write_atomically(self.run_dir / "checkpoint.json",
                         json.dumps({**info, "run_id": self.run_id, "state": self.store.state()}, indent=2))

    def _checkpointed(self, step: int) -> bool:
        """The run's checkpoint after `step` was taken: checkpoint.json, written last, names it."""
        try:
            return bool(json.loads((self.run_dir / "checkpoint.json").read_text())["step"] == step)
        except (OSError, ValueError, KeyError):
            return False

    def run(self, resume: bool = False, progress: bool = True) -> list[dict[str, Any]]:
        next_step = self._start(resume)
        if dropped := trim_metrics(self.run_dir, next_step - 1):
            log.info("dropped metrics.jsonl lines of steps %s, not recorded as logged; they are logged again", dropped)
        steps, every = self.config.run.steps, self.config.run.checkpoint_every
        threads = [threading.Thread(target=w.loop, name=w.name, daemon=True) for w in self.workers]
        for thread in threads:
            thread.start()
        metrics = MetricsLog(self.run_dir, "tensorboard" in self.config.run.loggers, self.trackers)
        if resume and self.trackers:
            metrics.catch_up(read_metrics(self.run_dir))
        records, started = [], time.monotonic()
        bar = tqdm(total=steps, initial=next_step, disable=not progress, unit="step", dynamic_ncols=True,
                   desc=f"{self.config.run.mode} {self.run_id}")
        last_test: dict[str, float] = {}
        watch = AlarmWatch.for_run(self.config, self.store, self.run_dir)
        if watch:
            watch.on_event = metrics.alarm
        try:
            if next_step == steps and steps and not self._checkpointed(steps - 1):
                # Killed after logging the last step and before checkpointing it: the resumed run has nothing left to
                # run but that checkpoint (the services' own saves on stop hold the same state under another tag).
                self._checkpoint(steps - 1)
            while next_step < steps:
                error = self.store.error()
                if error:
                    raise self._failed(error, next_step)
                if not self.graph.step_complete(next_step, self.store.done()):
                    time.sleep(0.02)
                    continue
                finished = step_record(self.ctx, self.graph, next_step)
                record = finished.metrics
                record[ELAPSED] = round(time.monotonic() - started, 3)
                if watch:
                    record.update(watch.observe(record))
                metrics.write(record)
                records.append(record)
                self.store.set_logged(finished.logged)
                if (every and (next_step + 1) % every == 0) or next_step == steps - 1:
                    try:
                        self._checkpoint(next_step)
                    except ServiceUnavailable as err:  # the services keep their own per-update checkpoints
                        raise self._failed(f"checkpoint after step {next_step}: {type(err).__name__}: {err}",
                                           next_step + 1) from None
                if next_step >= self.graph.steps_read_back:  # no stage reads that step's results any more
                    self.store.delete_results(
                        [job.id for job in self.graph.logged_jobs(next_step - self.graph.steps_read_back)])
                last_test.update({k.removeprefix(TEST): v for k, v in record.items() if k.startswith(TEST)})
                bar.set_postfix(reward=f"{record[REWARD_MEAN]:.2f}", verifier=f"{record[VERIFIER_ACCURACY]:.2f}",
                                **{f"test_{k}": f"{v:.2f}" for k, v in last_test.items()})
                bar.update(1)
                next_step += 1
        except KeyboardInterrupt:
            log.warning("interrupted before step %d was logged: stopping the workers, the services and Redis",
                        next_step)
            raise
        finally:
            bar.close()
            for worker in self.workers:
                worker.stop_event.set()
            # Closing the services first ends calls that wait for a service (up to unavailable_timeout_s); a job cut
            # short stays pending and the resumed run does it again (idempotently).
            self.ctx.close()
            join_all(threads, timeout_s=10)
            metrics.close()
        return records


def join_all(threads: list[threading.Thread], timeout_s: float) -> None:
    """Wait for the stage workers to end, all against one deadline; a worker still busy after it is left behind
    (a daemon thread: it cannot keep the process alive) with a warning that says where it is stuck."""
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    frames = sys._current_frames()
    for thread in threads:
        if thread.is_alive() and thread.ident in frames:
            where = "".join(traceback.format_stack(frames[thread.ident])[-8:])
            log.warning("stage worker %s did not stop within %g s; left running at:\n%s", thread.name, timeout_s,
                        where)


