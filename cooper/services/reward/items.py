"""The reward service's plain data: what is scored, compared, labelled, and what an update reports.

No torch here, so that callers that only build or read these (the orchestrator's stages, `cooper annotate`, the
CLI) do not import it.
"""

from __future__ import annotations

from dataclasses import dataclass


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

