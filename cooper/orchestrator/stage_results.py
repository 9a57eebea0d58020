"""What each stage job records in Redis: the JSON result of `stages.<stage>(ctx, step)`, as typed dicts.

The stages write these, the stages of later jobs and the driver's `run.step_record` read them; both import the keys
from here. They stay dicts (JSON in Redis, readable by any worker process and kept across a resume), typed so that
a reader and the writer agree on the keys. The worker adds `seconds` (the job's wall time) to every result.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from cooper.services.verifier.messages import Verdict


class StageResult(TypedDict, total=False):
    seconds: float
    """The job's wall time in the worker; added after the stage function returns."""


class PromptRecord(TypedDict):
    id: str  # "<step>-<slot>-<example id>": a prompt that recurs in a later epoch is still its own group
    question: str
    answer: str  # the reference answer
    example: str  # the example's id in the training data


class CompletionRecord(TypedDict):
    """A `policy.messages.Completion` as JSON (`stages.completion_record`)."""

    prompt_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    prompt_token_ids: list[int]


class DataPosition(TypedDict):
    epoch: int
    offset: int


class RolloutResult(StageResult):
    policy_version: int  # the policy version that sampled the rollout
    prompts: list[PromptRecord]
    completions: list[CompletionRecord]  # grouped by prompt, `policy.sampling.n` per prompt
    data_position: DataPosition  # where in the training data the step's batch was taken


class VerificationResult(StageResult):
    verdicts: list[str]  # verdict names (CORRECT, INCORRECT, NO_ANSWER, TIMEOUT, ERROR), one per completion
    extracted: list[str]  # the answer the verifier found in each completion


def verdicts_of(result: VerificationResult) -> list[Verdict]:
    """The recorded verdicts as the enum: names in the store (JSON), members everywhere they are read."""
    return [Verdict[name] for name in result["verdicts"]]


class ScoreResult(StageResult):
    rewards: list[float]  # one per completion, in rollout order
    logits: list[float]  # VerifyRM's raw logits; empty in rule mode
    reward_version: int  # the reward model version that scored; -1 in rule mode


class PolicyUpdateResult(StageResult):
    metrics: dict[str, float]
    policy_version: int  # after the update
    replayed: bool
    reward_source: str  # "reward_model", or "verifier" while the reward-hacking alarm acts (rule mode: "verifier"),
    # or "rollback": the alarm's rollback restored an earlier checkpoint instead of an update (metrics empty)
    rolled_back_to: NotRequired[int]  # with "rollback": the version whose weights the policy serves again


class PairRecord(TypedDict):
    """A `reward.items.PreferencePair` as JSON."""

    question: str
    reference: str
    positive: str
    negative: str


class NegativesResult(StageResult):
    pairs: list[PairRecord]
    prompts: int
    positives: int  # prompts with a verified positive
    attempts: int  # candidates the generator tried
    rejections: list[list[str]]  # per positive, why each rejected candidate was rejected


class RewardUpdateResult(StageResult):
    loss: float
    grad_norm: float
    pair_accuracy_before: float
    pair_accuracy_after: float
    reward_version: int  # after the update (unchanged when skipped)
    skipped: bool
    replayed: bool
    pairs: int  # the flagged pairs included
    flagged_pairs: int  # the alarm's rm_negatives action: flagged false positives added to the negatives' pairs
    optimizer_steps: int  # reward.update_steps, or rm_update_factor times it while rm_negatives acts
    alarm_acted: bool  # the alarm's rm_negatives action was in force for this update


class RmBenchResult(TypedDict):
    accuracy: float
    auroc: float
    reward_version: int
    false_positive_rate: NotRequired[float | None]  # of its wrong items, accepted; the alarm's bound comes from it
    negatives: NotRequired[int]  # how many wrong items


class EvaluationResult(StageResult):
    accuracy: dict[str, float]  # per held-out benchmark
    policy_version: int
    rm_bench: NotRequired[RmBenchResult]  # with eval.rm_benchmark_path only
