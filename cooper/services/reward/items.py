"""The reward service's plain data: what is scored, compared, labelled, and what an update reports.

No torch here, so that callers that only build or read these (the orchestrator's stages, `cooper annotate`, the
CLI) do not import it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from cooper.services.verifier.messages import REJECTED, Verdict


@dataclass(frozen=True)
class ScoreItem:
    """One completion to score against its question and reference answer."""

    question: str
    reference: str
    completion: str


@dataclass(frozen=True)
class PreferencePair:
    """`positive` should score above `negative` for the same question and reference."""

    question: str
    reference: str
    positive: str
    negative: str


@dataclass(frozen=True)
class LabelledTriple:
    """A completion with its correctness label, for BCE pre-training (hybrid annotation's output)."""

    question: str
    reference: str
    completion: str
    label: bool


@dataclass(frozen=True)
class UpdateStats:
    """What one Bradley-Terry update did; `version` is the model version after it. `replayed` is set by the
    service when an idempotency key had been applied before and this is its recorded result."""

    loss: float
    grad_norm: float
    pair_accuracy_before: float
    pair_accuracy_after: float
    version: int
    skipped: bool
    replayed: bool = False


UpdateResult = UpdateStats  # the service's name for it: what Update answers (recorded per key)


@dataclass(frozen=True)
class ScoreResult:
    """Invariant: scores and logits have the length of the items, in order, all from model `version`; `tokens` is
    the number of input tokens the model read for them."""

    scores: list[float]
    logits: list[float]
    version: int
    tokens: int = 0


@dataclass(frozen=True)
class ModelInfo:
    model: str
    version: int
    parameters: int
    device: str
    last_key: str
    checkpoint: str
    pad_token: str | None = None  # the tokenizer's, for protocols that send decoded text with special tokens
    eos_token: str | None = None
    tokenizer_source: str = ""  # where the serving process loads the same tokenizer from
    label: str = "LABEL_0"  # the model config's id2label[0]: the label vLLM's /classify answers with



def pairs_within_groups(completions: Sequence[tuple[Hashable, ScoreItem, Verdict]]) -> list[PreferencePair]:
    """Cooper's pair rule over verified completions (docs/design.md, section 2.2; run.negatives=rollouts): in each
    group (a prompt's samples), the first completion the verifier marks CORRECT is the positive, against every
    completion of the group it rejects (INCORRECT or NO_ANSWER), in their order. TIMEOUT and ERROR are never used;
    a group without a correct completion gives no pair."""
    positives: dict[Hashable, str] = {}
    for group, item, verdict in completions:
        if verdict is Verdict.CORRECT and group not in positives:
            positives[group] = item.completion
    return [PreferencePair(item.question, item.reference, positives[group], item.completion)
            for group, item, verdict in completions if verdict in REJECTED and group in positives]
