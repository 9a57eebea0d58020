"""The generator service's requests and replies as plain dataclasses: what `GeneratorClient` takes and returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from cooper.protos.wire_enum import WireEnum


class Judgment(WireEnum):
    """cooper.generator.v1.Judgment, the one enum of the judge (judge.py) and the client's callers: a Judgment is
    sent as it is, and `JudgeResult.verdict` (a number) compares equal to one."""

    YES = 1
    NO = 2
    UNKNOWN = 3


@dataclass(frozen=True)
class NegativeItem:
    """A verified-correct `positive` to turn into a wrong solution; `id` is echoed in its result."""

    id: str
    question: str
    reference: str
    positive: str


@dataclass(frozen=True)
class NegativeResult:
    """What became of one item (results come in the order of the items)."""

    id: str
    negative: str  # the kept negative; empty when `valid` is false
    attempts: int  # candidates tried
    valid: bool  # the verifier found the negative wrong against both the positive and the reference
    reason: str = ""  # why the last rejected candidate was rejected
    rejections: list[str] = field(default_factory=list)  # one reason per rejected candidate, in order


@dataclass(frozen=True)
class JudgeItem:
    """A completion for the LLM judge to compare with the reference."""

    question: str
    reference: str
    completion: str


@dataclass(frozen=True)
class JudgeResult:
    verdict: int  # a `Judgment` value
    raw: str  # the judge's full answer
