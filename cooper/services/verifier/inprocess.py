"""`InProcessVerifier`: the verifier service as its client speaks it (client.py), over a `VerifierPool` owned by this
process. The checks still run in the pool's worker processes, as the service's do: math-verify can hang in C code,
and only a process can be killed out of that. For a run in one process (`cooper train --in-process`) and tests.
"""

from __future__ import annotations

from collections.abc import Sequence

from cooper.config import VerifierConfig
from cooper.services.verifier.messages import Check, VerifyItem, VerifyResult, pair_items
from cooper.services.verifier.pool import VerifierPool


class InProcessVerifier:
    def __init__(self, config: VerifierConfig):
        self.pool = VerifierPool(config.workers, config.timeout_s, config.chunk_size, config.max_chars, config.answer)

    def check(self, pairs: list[tuple[str, str]]) -> list[Check]:
        """One Check per (completion, reference), in order (what the generator's filter reads)."""
        return self.pool.check_all(pairs)

    def verify(self, items: Sequence[VerifyItem], deadline_s: float | None = None) -> list[VerifyResult]:
        """One result per item, in order."""
        checks = self.check([(i.completion, i.reference) for i in items])
        return [VerifyResult(i.id, int(c.verdict), c.extracted, c.ms, c.detail)
                for i, c in zip(items, checks, strict=True)]

    def verify_pairs(self, pairs: Sequence[tuple[str, str]], deadline_s: float | None = None) -> list[VerifyResult]:
        return self.verify(pair_items(pairs), deadline_s)

    def close(self) -> None:
        self.pool.close()
