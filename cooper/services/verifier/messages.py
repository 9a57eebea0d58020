"""The verifier service's requests and replies as plain dataclasses: what `VerifierClient` takes and returns.

No grpc and no math-verify here, so that callers that only build or read these (the orchestrator's stages, the
generator) load neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from cooper.protos.verifier.v1 import verifier_pb2

Verdict = verifier_pb2.Verdict
"""The verdict enum (`Verdict.CORRECT`, `Verdict.Name(value)`); `VerifyResult.verdict` holds its value."""


@dataclass(frozen=True)
class VerifyItem:
    """One completion to check against a reference answer; `id` is echoed in its result."""

    id: str
    completion: str
    reference: str


@dataclass(frozen=True)
class VerifyResult:
    """The verdict on one item (results come in the order of the items)."""

    id: str
    verdict: int  # a `Verdict` value
    extracted: str = ""  # the raw answer text found in the completion; empty when none
    ms: float = 0.0  # time spent on the item inside its worker
    detail: str = ""  # why, for ERROR and TIMEOUT
