"""What the verifier says about one (completion, reference) pair: the Verdict and the Check that carries it.

Plain data, no math-verify, so that the client side (the orchestrator, the generator, `cooper eval-rm`) imports the
same Verdict as rules.py and the worker pool without loading the checker.
"""

from __future__ import annotations

from dataclasses import dataclass

from cooper.protos.wire_enum import WireEnum


class Verdict(WireEnum):
    """cooper.verifier.v1.Verdict: a Verdict is sent as it is, and a received number compares equal to one."""

    CORRECT = 1
    INCORRECT = 2
    NO_ANSWER = 3
    TIMEOUT = 4
    ERROR = 5


@dataclass(frozen=True)
class Check:
    verdict: Verdict
    extracted: str = ""
    """The raw answer text found in the completion (never a printed sympy object: str() of one can hang)."""
    ms: float = 0.0
    detail: str = ""
