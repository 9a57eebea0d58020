"""The stage jobs: plain functions `stage(ctx, step) -> result`, keyed by their graph.Stage in STAGES (their results' types in
RESULTS).

Each reads its inputs from the results of the jobs it depends on, calls the services through `ctx.services`
(services.py: their gRPC clients, or their cores in this process; both speak plain dataclasses), and returns its
result (a dataclass of `stage_results`), which the worker records in Redis as JSON. Re-running a job is harmless:
Generate is seeded by (run seed, step), Train and Update carry the idempotency key (run id, step), the rest are pure
reads.

Every job that touches a model checks that the model is at the version the run recorded (`expect_version`): a
service restarted from a checkpoint behind the run without its update journal would otherwise train step t on the
weights of an earlier step, a mixture no metric would show. Such a job fails the run at once (InconsistentRun).
"""

from __future__ import annotations

import hashlib
import statistics
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cooper.config import ALARM_REACTION_STEPS, CooperConfig
from cooper.evaluation.rm_bench import BenchItem, reward_model_report
from cooper.modes import RewardMode, reward_mode
from cooper.orchestrator import graph
from cooper.orchestrator.alarm_watch import acts, alarm_orders
from cooper.orchestrator.data import Example, StepData, prompt_text
from cooper.orchestrator.run_store import AlarmOrders, RunStore
from cooper.orchestrator.services import Generator, Policy, Reward, Services, Verifier
from cooper.orchestrator.stage_results import (
    DataPosition,
    EvaluationResult,
    NegativesResult,
    PolicyUpdateResult,
    Prompt,
    RewardUpdateResult,
    RmBenchResult,
    RolloutResult,
    ScoreResult,
    StageResult,
    VerificationResult,
    from_json,
)
from cooper.reward_rule import accepts, accepts_score, logit_to_reward
from cooper.runtime.ledger import idempotency_key
from cooper.services.generator.messages import NegativeItem
from cooper.services.policy.errors import StaleRollout, VersionNotHeld
from cooper.services.policy.messages import Generation, PolicyInfo
from cooper.services.reward.items import PreferencePair, ScoreItem, pairs_within_groups
from cooper.services.verifier.messages import REJECTED, Verdict, VerifyItem


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A stable 31-bit seed per (run seed, step, purpose), the same in every process and on every re-run."""
    digest = hashlib.sha256(f"{seed}:{step}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass
class StageContext:
    """What stage jobs share: config, run id, the store, the data, and the services (services.py: their gRPC
    clients, or their cores in this process)."""

    config: CooperConfig
    run_id: str
    store: RunStore
    data: StepData
    tests: dict[str, list[Example]]
    services: Services
    rm_bench: list[BenchItem] = field(default_factory=list)  # eval.rm_benchmark_path's items; empty: none

    @property
    def mode(self) -> RewardMode:
        return reward_mode(self.config.run.mode)

    @property
    def policy(self) -> Policy:
        return self.services.policy

    @property
    def reward(self) -> Reward:
        return self.services.reward

    @property
    def verifier(self) -> Verifier:
        return self.services.verifier

    @property
    def generator(self) -> Generator:
        return self.services.generator

    def result(self, stage: graph.Stage, step: int) -> StageResult:
        """The recorded result of job stage:step, as its stage's type (RESULTS); KeyError when none is recorded."""
        return from_json(RESULTS[stage], self.store.result(graph.Job(step, stage).id))

    # Each stage's recorded result, typed, so that an editor follows a step from job to job.
    def rollout(self, step: int) -> RolloutResult:
        return typing.cast(RolloutResult, self.result(graph.ROLLOUT, step))

    def verification(self, step: int) -> VerificationResult:
        return typing.cast(VerificationResult, self.result(graph.VERIFY, step))

    def scores(self, step: int) -> ScoreResult:
        return typing.cast(ScoreResult, self.result(graph.SCORE, step))

    def policy_update(self, step: int) -> PolicyUpdateResult:
        return typing.cast(PolicyUpdateResult, self.result(graph.POLICY_UPDATE, step))

    def negatives(self, step: int) -> NegativesResult:
        return typing.cast(NegativesResult, self.result(graph.NEGATIVES, step))

    def reward_update(self, step: int) -> RewardUpdateResult:
        return typing.cast(RewardUpdateResult, self.result(graph.REWARD_UPDATE, step))

    def evaluation(self, step: int) -> EvaluationResult:
        return typing.cast(EvaluationResult, self.result(graph.EVALUATE, step))

    @property
    def stopping(self) -> bool:
        return self.services.closed

    def close(self) -> None:
        self.services.close()


class InconsistentRun(RuntimeError):
    """A service's model is not at the version the run recorded. Not retried: nothing but a person can fix it."""

    retryable = False


def reward_version_after(ctx: StageContext, step: int) -> int:
    """VerifyRM's version after reward_update(`step`) (its result is kept while a stage may read it:
    StepGraph.steps_read_back)."""
    return ctx.reward_update(step).reward_version


def expect_version(service: str, actual: int, expected: int, job: str) -> None:
    """Refuse to go on when a model is not at the version the run recorded for it."""
    if actual == expected:
        return
    where = "behind" if actual < expected else "ahead of"
    raise InconsistentRun(
        f"{job}: the {service} service's model is at version {actual}, but the run recorded version {expected}; "
        f"its checkpoint is {where} the run (a restart from a checkpoint older than the last update without its "
        f"update journal: {service}.journal=false, or its checkpoint_dir/journal lost; or another run's "
        f"{service}.checkpoint_dir). Training on would mix two states, so the run stops. Put back the {service} "
        f"checkpoint of version {expected} and resume, or start a new run; with {service}.journal (the default) a "
        "restart loses nothing.")


def policy_version_after(ctx: StageContext, step: int) -> int:
    """The policy version policy_update(`step`) made; step -1: the version the run started from (rollout(0)'s).
    Their results are kept while a stage may read them (StepGraph.steps_read_back)."""
    return ctx.policy_update(step).policy_version if step >= 0 else ctx.rollout(0).policy_version


def sample(ctx: StageContext, job: str, version: int | None, prompts: list[tuple[str, str]], *, n: int,
           temperature: float, top_p: float, seed: int) -> Generation:
    """Generate with the policy of `version` (None: its current one). A version the service does not hold fails the
    run (InconsistentRun): the service is behind or ahead of the run, or was restarted without the versions kept
    behind its trainer."""
    policy, sampling = ctx.policy, ctx.config.policy.sampling
    try:
        return policy.generate(prompts, n=n, temperature=temperature, top_p=top_p,
                               max_new_tokens=sampling.max_new_tokens, stop=sampling.stop, seed=seed, version=version)
    except VersionNotHeld as err:
        if version is None:
            raise
        actual = policy.info().version
        if not version <= actual <= version + ctx.config.run.max_staleness:
            expect_version("policy", actual, version, job)
        raise InconsistentRun(f"{job}: {err}") from None


def expect_before_update(service: str, info: Any, expected: int, key: str, job: str) -> None:
    """Before Train/Update of `key`: the model is at `expected`, or that very update was applied already (a
    crash between the service's reply and the recorded result; the call is then a replay)."""
    if info.last_key == key and info.version >= expected:
        return
    expect_version(service, info.version, expected, job)


def rollout(ctx: StageContext, step: int) -> RolloutResult:
    """Step `step`'s prompts, sampled by the version policy_update(step - 1 - run.max_staleness) made (graph.py);
    rollout(0) samples the policy as the run finds it."""
    examples = ctx.data.batch(step)
    sampling = ctx.config.policy.sampling
    # Prompt ids carry the step and slot, so a prompt that recurs in a later epoch is still a distinct group.
    prompts = [Prompt(id=f"{step}-{k}-{e.id}", question=e.question, answer=e.answer, example=e.id)
               for k, e in enumerate(examples)]
    version = policy_version_after(ctx, max(step - 1 - ctx.config.run.max_staleness, -1)) if step > 0 else None
    reply = sample(ctx, f"rollout:{step}", version,
                   [(p.id, prompt_text(ctx.config, e)) for p, e in zip(prompts, examples, strict=True)],
                   n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                   seed=step_seed(ctx.config.run.seed, step, "rollout"))
    if version is not None:
        expect_version("policy", reply.version, version, f"rollout:{step}")
    return RolloutResult(policy_version=reply.version, prompts=prompts, completions=reply.completions,
                         data_position=DataPosition(*ctx.data.position(step)))


def verify(ctx: StageContext, step: int) -> VerificationResult:
    ro = ctx.rollout(step)
    by_id = ro.prompts_by_id()
    items = [VerifyItem(id=str(k), completion=c.text, reference=by_id[c.prompt_id].answer)
             for k, c in enumerate(ro.completions)]
    results = ctx.verifier.verify(items)
    return VerificationResult(verdicts=[Verdict(r.verdict) for r in results], extracted=[r.extracted for r in results])


def verifier_rewards(verification: VerificationResult) -> list[float]:
    """The verifier's reward: 1 for CORRECT, 0 for anything else (rule mode's, and the alarm's fallback)."""
    return [1.0 if v is Verdict.CORRECT else 0.0 for v in verification.verdicts]


def score(ctx: StageContext, step: int) -> ScoreResult:
    if not ctx.mode.reward_model_scores:  # the verifier's 1/0; the reward service is never called
        return ScoreResult(rewards=verifier_rewards(ctx.verification(step)), logits=[], reward_version=-1)
    ro = ctx.rollout(step)
    by_id = ro.prompts_by_id()
    items = [ScoreItem(question=by_id[c.prompt_id].question, reference=by_id[c.prompt_id].answer, completion=c.text)
             for c in ro.completions]
    result = ctx.reward.score(items)
    # score(t) must use exactly the model reward_update(t-1-k) made (graph.py); the first k+1 steps read the run's
    # first version.
    source = graph.reward_update_read_by(step, ctx.config.run.reward_max_staleness)
    if ctx.mode.reward_model_learns and source >= 0:
        expect_version("reward", result.version, reward_version_after(ctx, source), f"score:{step}")
    return ScoreResult(rewards=list(result.scores), logits=list(result.logits), reward_version=result.version)


def await_the_alarm(ctx: StageContext, step: int) -> None:
    """In act mode, wait until the driver has logged step `step - ALARM_REACTION_STEPS`: the alarm raises when the
    driver logs a step, and the stages run ahead of it, on a busy machine by any number of steps; with this wait an
    action raised at step s is in force from step s + 2 at the latest. Every job of that step is done before the
    job calling this can start (graph.py), so the wait is only for the driver, which polls every 20 ms."""
    if not acts(ctx.config):
        return
    while ctx.store.logged().through < step - ALARM_REACTION_STEPS:
        if ctx.stopping:  # the run is stopping: the job stays pending for the resumed run
            raise RuntimeError(f"the run is stopping before step {step - ALARM_REACTION_STEPS} was logged")
        time.sleep(0.02)


def rollback_policy(ctx: StageContext, orders: AlarmOrders, info: PolicyInfo, sampled: int, job: str
                    ) -> PolicyUpdateResult | None:
    """The alarm's rollback, when one is due: the policy service restores its newest kept checkpoint at or below
    the requested version as version `sampled + 1`, and this step's update is skipped (its rollout came from the
    weights being rolled back). None when no rollback is due, and the update goes on. Only with run.max_staleness
    0 (config.py refuses the two together), where the version that sampled is the one the update starts from."""
    request = orders.rollback
    if request is None:
        return None
    key_run = f"{ctx.run_id}/rollback"
    retried = info.last_key == idempotency_key(key_run, request.raise_number) and info.version == sampled + 1  # this job's again
    if not retried and (request.raise_number <= orders.rollback_done or info.version != sampled):
        return None
    reply = ctx.policy.restore(key_run, request.raise_number, request.at_most_version)
    expect_version("policy", reply.version, sampled + 1, job)
    ctx.store.rollback_taken(request)
    return PolicyUpdateResult(metrics={}, policy_version=reply.version, replayed=reply.replayed,
                              reward_source="rollback", rolled_back_to=reply.restored_version)


def policy_update(ctx: StageContext, step: int) -> PolicyUpdateResult:
    ro, sc = ctx.rollout(step), ctx.scores(step)
    policy, job, sampled = ctx.policy, f"policy_update:{step}", ro.policy_version
    # The version this update starts from: the one that sampled the rollout, or with rollouts ahead of training up
    # to run.max_staleness versions after it.
    start = policy_version_after(ctx, step - 1) if ctx.config.run.max_staleness else sampled
    await_the_alarm(ctx, step)
    orders = alarm_orders(ctx.config, ctx.store)
    info = policy.info()
    if rolled_back := rollback_policy(ctx, orders, info, sampled, job):
        return rolled_back
    expect_before_update("policy", info, start, idempotency_key(ctx.run_id, step), job)
    rewards, source = sc.rewards, ctx.mode.reward_source
    # While the reward-hacking alarm acts, the policy learns from the verifier; score(t) still asks the reward model,
    # whose disagreement with the verifier is what tells the alarm when to clear.
    if orders.verifier_reward:
        rewards, source = verifier_rewards(ctx.verification(step)), "verifier"
    try:
        reply = policy.train(ctx.run_id, step, ro.completions, rewards, ctx.config.policy.sampling.n, sampled)
    except StaleRollout as err:  # a rollout the trainer refuses (too stale): no retry will make it fresher
        raise InconsistentRun(f"{job}: {err}") from None
    expect_version("policy", reply.version, start + 1, job)  # GRPO on the weights of the version it started from
    return PolicyUpdateResult(metrics=dict(reply.metrics), policy_version=reply.version, replayed=reply.replayed,
                              reward_source=source)


def verified_positives(ro: RolloutResult, ve: VerificationResult) -> dict[str, str]:
    """Each prompt's positive: its first completion the verifier marks correct (docs/design.md, section 2.2)."""
    positives: dict[str, str] = {}
    for completion, verdict in zip(ro.completions, ve.verdicts, strict=True):
        if verdict is Verdict.CORRECT and completion.prompt_id not in positives:
            positives[completion.prompt_id] = completion.text
    return positives


def flagged_false_positives(ro: RolloutResult, ve: VerificationResult, sc: ScoreResult) -> list[PreferencePair]:
    """The rollouts VerifyRM accepted and the verifier rejected (INCORRECT or NO_ANSWER), each as the negative
    against its prompt's verified positive; prompts without one give none."""
    positives, by_id = verified_positives(ro, ve), ro.prompts_by_id()
    return [PreferencePair(question=by_id[c.prompt_id].question, reference=by_id[c.prompt_id].answer,
                           positive=positives[c.prompt_id], negative=c.text)
            for c, v, accepted in zip(ro.completions, ve.verdicts, rm_accepts(sc), strict=True)
            if v in REJECTED and accepted and c.prompt_id in positives]


def rm_accepts(sc: ScoreResult) -> list[bool]:
    """Per rollout, whether VerifyRM accepted it: from its logits, or its rewards where no logits were recorded."""
    return [accepts(x) for x in sc.logits] if sc.logits else [accepts_score(r) for r in sc.rewards]


def negatives(ctx: StageContext, step: int) -> NegativesResult:
    """The step's preference pairs, per config.RunConfig.negatives: each prompt's verified positive against its
    group's verifier-rejected completions (rollouts), against the generator's rewrite of it (generator), or both."""
    ro, ve = ctx.rollout(step), ctx.verification(step)
    positives = verified_positives(ro, ve)
    by_id = ro.prompts_by_id()
    source = ctx.config.run.negatives
    pairs: list[PreferencePair] = []
    if source in ("rollouts", "both"):
        pairs += pairs_within_groups([(c.prompt_id, ScoreItem(by_id[c.prompt_id].question, by_id[c.prompt_id].answer,
                                                              c.text), v)
                                      for c, v in zip(ro.completions, ve.verdicts, strict=True)])
    results = []
    if source in ("generator", "both") and positives:
        items = [NegativeItem(id=pid, question=by_id[pid].question, reference=by_id[pid].answer, positive=text)
                 for pid, text in positives.items()]
        results = ctx.generator.negatives(items)
        pairs += [PreferencePair(question=by_id[r.id].question, reference=by_id[r.id].answer,
                                 positive=positives[r.id], negative=r.negative) for r in results if r.valid]
    return NegativesResult(pairs=pairs, prompts=len(ro.prompts), positives=len(positives),
                           attempts=sum(r.attempts for r in results),
                           rejections=[list(r.rejections) for r in results])


def reward_update(ctx: StageContext, step: int) -> RewardUpdateResult:
    ng, sc = ctx.negatives(step), ctx.scores(step)
    pairs = list(ng.pairs)
    reward, job = ctx.reward, f"reward_update:{step}"
    # The model this update starts from: the one score(t) read, or with reward updates behind their scores the one
    # reward_update(t-1) made (graph.py).
    used = reward_version_after(ctx, step - 1) if ctx.config.run.reward_max_staleness and step > 0 else sc.reward_version
    optimizer_steps = flagged = 0
    await_the_alarm(ctx, step)
    acting = alarm_orders(ctx.config, ctx.store).rm_negatives
    if acting:
        # While the alarm acts: VerifyRM learns faster, and from the very rollouts it overpays (those not already
        # among the pairs: the rollouts variant pairs every rejected rollout anyway).
        known = {(p.positive, p.negative) for p in pairs}
        extra = [p for p in flagged_false_positives(ctx.rollout(step), ctx.verification(step),
                                                    sc) if (p.positive, p.negative) not in known]
        pairs, flagged = pairs + extra, len(extra)
        optimizer_steps = ctx.config.reward.update_steps * ctx.config.alarm.rm_update_factor
    expect_before_update("reward", reward.info(), used, idempotency_key(ctx.run_id, step), job)
    r = reward.update(ctx.run_id, step, pairs, optimizer_steps)
    expect_version("reward", r.version, used + (0 if r.skipped else 1), job)
    return RewardUpdateResult(loss=r.loss, grad_norm=r.grad_norm, pair_accuracy_before=r.pair_accuracy_before,
                              pair_accuracy_after=r.pair_accuracy_after, reward_version=r.version, skipped=r.skipped,
                              replayed=r.replayed, pairs=len(pairs), flagged_pairs=flagged,
                              optimizer_steps=optimizer_steps or ctx.config.reward.update_steps, alarm_acted=acting)


def evaluate(ctx: StageContext, step: int) -> EvaluationResult:
    """Mean verifier accuracy of k samples per held-out problem, per benchmark; and, with eval.rm_benchmark_path,
    the reward model's accuracy on that labelled benchmark (score_rm_bench)."""
    ev = ctx.config.eval
    accuracies: dict[str, float] = {}
    version = -1
    for name, rows in ctx.tests.items():
        rows = rows[: ev.max_problems] if ev.max_problems else rows
        # Step -1 evaluates the initial policy, version 0, before policy_update(0) (graph.py).
        expected = 0 if step == -1 else ctx.policy_update(step).policy_version
        reply = sample(ctx, f"evaluate:{step}", expected, [(row.id, prompt_text(ctx.config, row)) for row in rows],
                       n=ev.k, temperature=ev.temperature, top_p=ev.top_p,
                       seed=step_seed(ctx.config.run.seed, step, f"eval:{name}"))
        version = reply.version
        expect_version("policy", version, expected, f"evaluate:{step}")
        answers = {row.id: row.answer for row in rows}
        items = [VerifyItem(id=str(k), completion=c.text, reference=answers[c.prompt_id])
                 for k, c in enumerate(reply.completions)]
        verdicts = ctx.verifier.verify(items)
        accuracies[name] = statistics.fmean(v.verdict == Verdict.CORRECT for v in verdicts) if verdicts else 0.0
    return EvaluationResult(accuracy=accuracies, policy_version=version,
                            rm_bench=score_rm_bench(ctx) if ctx.rm_bench else None)


def score_rm_bench(ctx: StageContext) -> RmBenchResult:
    """The reward model's current version against the human labels of eval.rm_benchmark_path: accuracy (score >
    0.5 says correct) and AUROC. One Score call, so every score comes from the one version it reports; in cooper
    mode that is v_t or v_{t+1}, whichever the reward service holds when evaluation runs beside reward_update(t)."""

    items = [ScoreItem(i.question, i.reference, i.completion) for i in ctx.rm_bench]
    scored = ctx.reward.score(items)
    # The probabilities, from the logits: with reward.discrete the scores are 0/1, which keeps accuracy but ties
    # every AUROC comparison.
    probabilities = [logit_to_reward(logit) for logit in scored.logits] if scored.logits else list(scored.scores)
    report = reward_model_report(ctx.rm_bench, probabilities)
    return RmBenchResult(accuracy=report.accuracy, auroc=report.auroc, reward_version=scored.version,
                         false_positive_rate=report.false_positive_rate, negatives=report.negatives)


RESULTS: dict[graph.Stage, type[StageResult]] = {
    graph.ROLLOUT: RolloutResult,
    graph.VERIFY: VerificationResult,
    graph.SCORE: ScoreResult,
    graph.POLICY_UPDATE: PolicyUpdateResult,
    graph.NEGATIVES: NegativesResult,
    graph.REWARD_UPDATE: RewardUpdateResult,
    graph.EVALUATE: EvaluationResult,
}
"""What each stage's job records."""

STAGES: dict[graph.Stage, Callable[[StageContext, int], StageResult]] = {
    graph.ROLLOUT: rollout,
    graph.VERIFY: verify,
    graph.SCORE: score,
    graph.POLICY_UPDATE: policy_update,
    graph.NEGATIVES: negatives,
    graph.REWARD_UPDATE: reward_update,
    graph.EVALUATE: evaluate,
}
