"""The step graph (docs/design.md, section 5): which jobs a step has and what each waits for. Pure; no Redis.

    rollout(t) ─┬─ score(t) ──────────────── policy_update(t) ── rollout(t+1)
                └─ verify(t) ── negatives(t) ┐
                   score(t) ─────────────────┴ reward_update(t) ── score(t+1)

Modes change the graph, not the code: `rule` scores with the verifier's verdicts (score(t) waits for verify(t)
and the reward service is never called); `static` never updates VerifyRM (no negatives, no reward_update);
`cooper` has it all. Evaluation after step t, when due, runs before rollout(t+1) so that it sees exactly the
weights of version t+1. With evaluation on, the run also evaluates the initial policy: evaluate(-1), the only job of
"step -1", which policy_update(0) waits for, so it sees version 0 (where every mode starts from).

Rollouts ahead of training (`max_staleness` k > 0, run.max_staleness): rollout(t) waits for policy_update(t-k-1)
instead, and samples the version it made (rollouts 0..k sample the run's first version, one after the other), so
rollout(t) runs while policy_update(t-1) trains. policy_update(t) then waits for policy_update(t-1) itself (and
for evaluate(t-1) when due, so evaluation sees its version while the trainer stays there):

    rollout(t) ── score(t) ── policy_update(t) ── policy_update(t+1)
                                             └─── rollout(t+k+1)

Reward updates behind their scores (`reward_staleness` k > 0, run.reward_max_staleness; cooper mode): score(t)
waits for reward_update(t-k-1) instead of reward_update(t-1), and reward_update(t) waits for score(t+k) (and for
reward_update(t-1), which keeps the updates in order). So score(t) always reads exactly v_{max(0, t-k)}, a run is
as deterministic as with k = 0, and reward_update(t) runs while policy_update(t+k) and rollout(t+k+1) do. With k = 1:

    rollout(t+1) ── score(t+1) ── policy_update(t+1) ── rollout(t+2) ── score(t+2)
                             └─ reward_update(t) ──────────────────────┘
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cooper.modes import reward_mode


class Stage(enum.StrEnum):
    """A step's stage: the job kind, the key of its function in stages.STAGES and of its result type in
    stages.RESULTS. A StrEnum, so that a job id in Redis ("score:12") is its plain value."""

    ROLLOUT = "rollout"
    VERIFY = "verify"
    SCORE = "score"
    POLICY_UPDATE = "policy_update"
    NEGATIVES = "negatives"
    REWARD_UPDATE = "reward_update"
    EVALUATE = "evaluate"


ROLLOUT, VERIFY, SCORE, POLICY_UPDATE, NEGATIVES, REWARD_UPDATE, EVALUATE = Stage


def reward_update_read_by(score_step: int, reward_staleness: int) -> int:
    """The step whose reward_update made the VerifyRM version score(`score_step`) reads (below 0: the run's first
    version); `reward_staleness` is run.reward_max_staleness."""
    return score_step - reward_staleness - 1


@dataclass(frozen=True, order=True)
class Job:
    step: int
    stage: Stage

    @property
    def id(self) -> str:
        return f"{self.stage.value}:{self.step}"

    @staticmethod
    def parse(job_id: str) -> Job:
        """The job of an id `<stage>:<step>`; ValueError naming the id when it is not one."""
        stage, _, step = job_id.partition(":")
        try:
            return Job(int(step), Stage(stage))
        except ValueError:
            raise ValueError(f"not a job id: {job_id!r} (expected <stage>:<step>, the stage one of "
                             f"{', '.join(Stage)})") from None


class StepGraph:
    def __init__(self, mode: str, steps: int, eval_every: int, verify_before_update: bool = False,
                 max_staleness: int = 0, reward_staleness: int = 0):
        """`verify_before_update`: policy_update(t) waits for verify(t) too, so that it can train on the verifier's
        reward instead of the reward model's (the reward-hacking alarm's act mode). `max_staleness`: how many
        versions behind the trainer a rollout may sample; `reward_staleness`: how many updates behind VerifyRM's
        trainer a score may be (see above)."""
        self.reward = reward_mode(mode)
        for name, value in (("max_staleness", max_staleness), ("reward_staleness", reward_staleness)):
            if value < 0:
                raise ValueError(f"{name} must be at least 0 (got {value})")
        self.mode, self.steps, self.eval_every = mode, steps, eval_every
        self.verify_before_update = verify_before_update
        self.max_staleness = max_staleness
        self.reward_staleness = reward_staleness if self.reward.reward_model_learns else 0

    def evaluates_after(self, step: int) -> bool:
        """Evaluation follows step `step` every eval_every steps and after the last step, and "step -1" is the
        initial policy's evaluation (when enabled)."""
        if self.eval_every <= 0:
            return False
        return step == -1 or (step + 1) % self.eval_every == 0 or step == self.steps - 1

    def first_step(self) -> int:
        """-1 when the initial policy is evaluated (its job is step -1's only one), else 0."""
        return -1 if self.evaluates_after(-1) else 0

    def stages(self, step: int) -> list[Stage]:
        if step == -1:
            return [EVALUATE] if self.evaluates_after(-1) else []
        stages = [ROLLOUT, VERIFY, SCORE, POLICY_UPDATE]
        if self.reward.reward_model_learns:
            stages += [NEGATIVES, REWARD_UPDATE]
        if self.evaluates_after(step):
            stages.append(EVALUATE)
        return stages

    def jobs(self, step: int) -> list[Job]:
        return [Job(step, s) for s in self.stages(step)]

    def logged_jobs(self, step: int) -> list[Job]:
        """The jobs whose results step `step`'s record reads: its own, and for step 0 the initial evaluation."""
        return self.jobs(step) + (self.jobs(-1) if step == 0 else [])

    @property
    def steps_read_back(self) -> int:
        """How many of the newest logged steps a stage may still read results of. A job of step t runs before step t
        is logged (all of a step's jobs are done when it is), so at most step t-1 is logged then; it reads its own
        step and its dependencies: rollout(t) policy_update(t-k-1) and score(t) reward_update(t-k-1) (k: their
        staleness), the updates the update before them. So once step L is logged, step L - steps_read_back is
        read by nothing still to run, and the driver deletes its results."""
        return max(self.max_staleness, self.reward_staleness) + 1

    def dependencies(self, job: Job) -> list[Job]:
        t, stage = job.step, job.stage
        if stage == ROLLOUT:
            if t == 0:
                return []
            if self.max_staleness:
                source = t - self.max_staleness - 1  # the step whose update made the version rollout(t) samples
                return [Job(source, POLICY_UPDATE)] if source >= 0 else [Job(t - 1, ROLLOUT)]
            deps = [Job(t - 1, POLICY_UPDATE)]
            if self.evaluates_after(t - 1):
                deps.append(Job(t - 1, EVALUATE))
            return deps
        if stage == VERIFY:
            return [Job(t, ROLLOUT)]
        if stage == SCORE:
            if not self.reward.reward_model_scores:  # the verifier's verdicts are the reward
                return [Job(t, VERIFY)]
            deps = [Job(t, ROLLOUT)]
            source = reward_update_read_by(t, self.reward_staleness)
            if self.reward.reward_model_learns and source >= 0:
                deps.append(Job(source, REWARD_UPDATE))
            return deps
        if stage == POLICY_UPDATE:
            deps = [Job(t, SCORE)]
            if self.verify_before_update and self.reward.reward_model_scores:  # else score(t) waits for verify(t)
                deps.append(Job(t, VERIFY))
            if t == 0 and self.evaluates_after(-1):
                deps.append(Job(-1, EVALUATE))  # the initial evaluation sees version 0
            if self.max_staleness and t > 0:  # rollouts no longer order the updates: they wait for each other
                deps.append(Job(t - 1, POLICY_UPDATE))
                if self.evaluates_after(t - 1):
                    deps.append(Job(t - 1, EVALUATE))
            return deps
        if stage == NEGATIVES:
            return [Job(t, VERIFY)]
        if stage == REWARD_UPDATE:
            # Never train v_{t+1} before the last score that reads v_t has read it: score(t + k).
            deps = [Job(t, NEGATIVES), Job(min(t + self.reward_staleness, self.steps - 1), SCORE)]
            if self.reward_staleness and t > 0:  # scores no longer order the updates: they wait for each other
                deps.append(Job(t - 1, REWARD_UPDATE))
            return deps
        if stage == EVALUATE:
            return [] if t == -1 else [Job(t, POLICY_UPDATE)]
        raise ValueError(f"unknown stage {stage!r}")

    def dependents(self, job: Job) -> list[Job]:
        """Jobs that wait for `job`: in this step and the next; with rollouts ahead, up to max_staleness + 1 steps
        later; with reward updates behind, reward_staleness + 1 steps later and the reward update reward_staleness
        steps earlier (which waits for this step's score)."""
        first = max(job.step - self.reward_staleness, 0)
        near = range(first, min(job.step + max(self.max_staleness, self.reward_staleness) + 2, self.steps))
        candidates = [c for step in near for c in self.jobs(step)]
        return [c for c in candidates if job in self.dependencies(c)]

    def roots(self) -> list[Job]:
        return [Job(0, ROLLOUT)] + self.jobs(-1)

    def step_complete(self, step: int, done: set[str]) -> bool:
        return all(j.id in done for j in self.jobs(step))
