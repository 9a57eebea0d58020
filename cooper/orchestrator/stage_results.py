"""What each stage job records: the result of `stages.<stage>(ctx, step)`, a dataclass per stage.

The stages return these and read earlier jobs' results as these (`StageContext.result`); the driver's
`run.step_record` reads them too. They become JSON only at the store's edge (`to_json` when the worker records a
result, `from_json` when a reader takes it back), so that any worker process can read them and they outlive a
restart; verdicts travel as their names. The worker sets `seconds` (the job's wall time) on every result.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass, fields, is_dataclass
from functools import cache
from typing import Any, TypeVar

from cooper.services.policy.messages import Completion
from cooper.services.reward.items import PreferencePair
from cooper.services.verifier.messages import Verdict


@dataclass(kw_only=True)
class StageResult:
    seconds: float = 0.0
    """The job's wall time in the worker; set after the stage function returns."""
    finished_at: float = 0.0
    """When the job ended (time.time(), set with `seconds`): with it, when each job of a step started and what it
    waited for (run.critical_path). 0 in results recorded before it was kept."""


@dataclass(frozen=True)
class Prompt:
    id: str  # "<step>-<slot>-<example id>": a prompt that recurs in a later epoch is still its own group
    question: str
    answer: str  # the reference answer
    example: str  # the example's id in the training data


@dataclass(frozen=True)
class DataPosition:
    epoch: int
    offset: int


@dataclass
class RolloutResult(StageResult):
    policy_version: int  # the policy version that sampled the rollout
    prompts: list[Prompt]
    completions: list[Completion]  # grouped by prompt, `policy.sampling.n` per prompt
    data_position: DataPosition  # where in the training data the step's batch was taken

    def prompts_by_id(self) -> dict[str, Prompt]:
        return {p.id: p for p in self.prompts}


@dataclass
class VerificationResult(StageResult):
    verdicts: list[Verdict]  # one per completion
    extracted: list[str]  # the answer the verifier found in each completion


@dataclass
class ScoreResult(StageResult):
    rewards: list[float]  # one per completion, in rollout order
    logits: list[float]  # VerifyRM's raw logits; empty in rule mode
    reward_version: int  # the reward model version that scored; -1 in rule mode


@dataclass
class PolicyUpdateResult(StageResult):
    metrics: dict[str, float]
    policy_version: int  # after the update
    replayed: bool
    reward_source: str  # "reward_model", or "verifier" while the reward-hacking alarm acts (rule mode: "verifier"),
    # or "rollback": the alarm's rollback restored an earlier checkpoint instead of an update (metrics empty)
    rolled_back_to: int | None = None  # with "rollback": the version whose weights the policy serves again


@dataclass
class NegativesResult(StageResult):
    pairs: list[PreferencePair]
    prompts: int
    positives: int  # prompts with a verified positive
    attempts: int  # candidates the generator tried
    rejections: list[list[str]]  # per positive, why each rejected candidate was rejected


@dataclass
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


@dataclass(frozen=True)
class RmBenchResult:
    accuracy: float
    auroc: float | None  # None where the benchmark holds one class only
    reward_version: int
    false_positive_rate: float | None = None  # of its wrong items, accepted; the alarm's bound comes from it
    negatives: int = 0  # how many wrong items


@dataclass
class EvaluationResult(StageResult):
    accuracy: dict[str, float]  # per held-out benchmark
    policy_version: int
    rm_bench: RmBenchResult | None = None  # with eval.rm_benchmark_path only


# ----- the store's edge ---------------------------------------------------------------------------------------------

R = TypeVar("R")


def to_json(value: Any) -> Any:
    """A result (or any part of one) as JSON-able data: dataclasses as dicts, enums as their names."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, list):  # token ids and rewards as they are; dataclasses and enums item by item
        plain = not value or (isinstance(value[0], (int, float, str)) and not isinstance(value[0], enum.Enum))
        return value if plain else [to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    return value  # numbers, strings, lists of them (token ids) as they are


def from_json(kind: type[R], data: Any) -> R:
    """`data` (to_json's output) back as `kind`."""
    return _decode(kind, data)


@cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _decode(kind: Any, data: Any) -> Any:
    if data is None:
        return None
    if isinstance(kind, type) and is_dataclass(kind):
        hints = _hints(kind)
        return kind(**{key: _decode(hints[key], value) for key, value in data.items()})
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind[data]
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list and args and (is_dataclass(args[0]) or _is_enum(args[0]) or typing.get_origin(args[0])):
        return [_decode(args[0], item) for item in data]
    if origin is dict and args and is_dataclass(args[1]):
        return {key: _decode(args[1], item) for key, item in data.items()}
    if origin in (typing.Union, types.UnionType):
        return _decode(next(a for a in args if a is not type(None)), data)
    return data


def _is_enum(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, enum.Enum)

