"""The verifier service's requests and replies as plain dataclasses: what `VerifierClient` takes and returns.

No grpc and no math-verify here, so that callers that only build or read these (the orchestrator's stages, the
generator) load neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cooper.protos.wire_enum import WireEnum


class Verdict(WireEnum):
    """cooper.verifier.v1.Verdict, the one verdict enum of the checker (rules.py), its pool and the client's callers:
    a Verdict is sent as it is, and `VerifyResult.verdict` (a number) compares equal to one."""

    CORRECT = 1
    INCORRECT = 2
    NO_ANSWER = 3
    TIMEOUT = 4
    ERROR = 5


REJECTED = frozenset({Verdict.INCORRECT, Verdict.NO_ANSWER})
"""What the verifier rejects: proven wrong, or no answer found. TIMEOUT and ERROR decide nothing, so a rollout with
either is never taken as a negative."""


@dataclass(frozen=True)
class Check:
    """The verifier's result on one (completion, reference): what rules.check returns, the pool records and the
    generator's filter reads."""

    verdict: Verdict
    extracted: str = ""
    """The raw answer text found in the completion (never a printed sympy object: str() of one can hang)."""
    ms: float = 0.0
    detail: str = ""  # why, for ERROR and TIMEOUT


@dataclass(frozen=True)
class VerifyItem:
    """One completion to check against a reference answer; `id` is echoed in its result."""

    id: str
    completion: str
    reference: str


@dataclass(frozen=True)
class VerifyResult:
    """The verdict on one item (results come in the order of the items). `as_checks` reads them back as Checks."""

    id: str
    verdict: int  # a `Verdict` value
    extracted: str = ""  # the raw answer text found in the completion; empty when none
    ms: float = 0.0  # time spent on the item inside its worker
    detail: str = ""  # why, for ERROR and TIMEOUT


def pair_items(pairs: Sequence[tuple[str, str]]) -> list[VerifyItem]:
    """(completion, reference) pairs as items whose ids are their positions."""
    return [VerifyItem(id=str(i), completion=c, reference=r) for i, (c, r) in enumerate(pairs)]


def as_checks(results: Sequence[VerifyResult]) -> list[Check]:
    """Verify results read back as the Checks they were made from (what the generator's filter reads)."""
    return [Check(Verdict(r.verdict), r.extracted, r.ms, r.detail) for r in results]
