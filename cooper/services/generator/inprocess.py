"""`InProcessGenerator`: the generator service's Negatives as its client speaks it (client.py), in this process.

The rule strategies only (generator.strategy perturb or varied): an `llm` strategy's assistant is a model server of
its own, which the generator service runs. Every candidate is checked by the given verifier's pool, as the service
checks it with the verifier service. For a run in one process (`cooper train --in-process`) and tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from cooper.config import ConfigError, GeneratorConfig
from cooper.services.generator.messages import NegativeItem, NegativeResult
from cooper.services.generator.negatives import RULE_STRATEGIES, NegativeTask, RuleStrategy, make_negatives, rule_name
from cooper.services.verifier.messages import Check, VerifyResult, as_checks


class PairVerifier(Protocol):
    """What the generator needs of a verifier: verdicts on (completion, reference) pairs."""

    def verify_pairs(self, pairs: Sequence[tuple[str, str]], deadline_s: float | None = ...) -> list[VerifyResult]: ...


class InProcessGenerator:
    def __init__(self, config: GeneratorConfig, verifier: PairVerifier):
        rule = rule_name(config.strategy)
        if rule is None:
            raise ConfigError(f"generator.strategy={config.strategy} needs an assistant model, which only the "
                              f"generator service runs; in one process the strategy is one of {RULE_STRATEGIES}")
        self.config = config
        self.strategy = RuleStrategy(rule)
        self.verifier = verifier

    async def _verify(self, pairs: list[tuple[str, str]]) -> list[Check]:
        return as_checks(await asyncio.to_thread(self.verifier.verify_pairs, pairs))

    def negatives(self, items: Sequence[NegativeItem], deadline_s: float | None = None) -> list[NegativeResult]:
        """One result per item, in order; `valid` says whether it holds a verified negative."""
        tasks = [NegativeTask(i.id, i.question, i.reference, i.positive) for i in items]
        outcomes = asyncio.run(make_negatives(tasks, self.strategy, self._verify, self.config.attempts))
        return [NegativeResult(o.id, o.negative, o.attempts, o.valid, o.reason, list(o.rejections)) for o in outcomes]

    def close(self) -> None:
        """Nothing of its own to close: the verifier is closed by its owner."""
