"""The reward service learning from what it scores (reward.learn_online): Cooper's method behind a plain scoring
API, for trainers that call a reward model and nothing more (TRL's reward functions, verl's reward loop).

The scoring routes hand every scored completion here (`observe`, no waiting); a learning step (`learn`: POST
/v1/learn at the trainer's step boundary, or every reward.learn_online.every_requests scoring requests) checks them
with the rule verifier against their references, pairs them by Cooper's rule (items.pairs_within_groups, the
question and reference being the group) and applies one Bradley-Terry update through the service, as Cooper's
reward_update stage does: a new version, journaled and checkpointed. The scores of one batch come from the version
before the step that learns from it, as in Cooper's loop (score(t) with v_t, then the update to v_{t+1}).

What a learning step has not yet taken is held in memory: a restart loses it (at most one step's completions), never
an applied update.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from cooper.config import LearnOnlineConfig
from cooper.services.reward.items import PreferencePair, ScoreItem, UpdateResult, pairs_within_groups
from cooper.services.verifier.inprocess import InProcessVerifier
from cooper.services.verifier.messages import REJECTED, Verdict

log = logging.getLogger("cooper.reward")


@dataclass(frozen=True)
class LearnResult:
    """What one learning step did."""

    version: int
    """VerifyRM's version after it: one more than before when it had pairs to learn from."""
    completions: int
    """Scored completions it took (every one since the last step, up to reward.learn_online.max_buffered)."""
    correct: int
    rejected: int
    """Verified INCORRECT or NO_ANSWER."""
    unchecked: int
    """TIMEOUT or ERROR: never paired."""
    pairs: int
    pair_accuracy_before: float | None
    """Of the update's pairs, the share VerifyRM ranked right before it and after it (None without pairs)."""
    pair_accuracy_after: float | None
    dropped: int
    """Completions dropped since the last step because the buffer was full."""


class OnlineLearner:
    def __init__(self, config: LearnOnlineConfig, update: Callable[[str, list[PreferencePair]], Awaitable[UpdateResult]],
                 version: Callable[[], int]):
        self.config = config
        self._update, self._version = update, version
        self._buffer: deque[ScoreItem] = deque(maxlen=config.max_buffered)
        self._dropped = 0
        self._requests = 0
        self._steps = 0
        self._lock = asyncio.Lock()  # one learning step at a time, in the order they were asked for
        self._pending: set[asyncio.Task[LearnResult]] = set()
        self.verifier = InProcessVerifier(config.verifier)  # its checks run in worker processes of its own

    def observe(self, items: Sequence[ScoreItem]) -> None:
        """Completions a scoring request has just been answered for."""
        overflow = len(self._buffer) + len(items) - self.config.max_buffered
        if overflow > 0:
            self._dropped += min(overflow, len(self._buffer) + len(items))
        self._buffer.extend(items)
        self._requests += 1
        every = self.config.every_requests
        if every and self._requests % every == 0:
            task = asyncio.ensure_future(self.learn())
            self._pending.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[LearnResult]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("learning step failed: %s: %s", type(task.exception()).__name__, task.exception())

    async def learn(self) -> LearnResult:
        """One learning step over everything scored since the last one."""
        async with self._lock:
            items, dropped = list(self._buffer), self._dropped
            self._buffer.clear()
            self._dropped = 0
            checks = await asyncio.to_thread(self.verifier.check, [(i.completion, i.reference) for i in items])
            verdicts = [check.verdict for check in checks]
            pairs = pairs_within_groups([((i.question, i.reference), i, v)
                                         for i, v in zip(items, verdicts, strict=True)])
            version, before, after = self._version(), None, None
            if pairs:
                self._steps += 1
                # a key of its own per step, so that a retried update is recognised (RewardCore's idempotency)
                result = await self._update(f"learn_online:{version}:{self._steps}", pairs)
                version, before, after = result.version, result.pair_accuracy_before, result.pair_accuracy_after
            return LearnResult(version=version, completions=len(items), pair_accuracy_before=before,
                               pair_accuracy_after=after,
                               correct=sum(v is Verdict.CORRECT for v in verdicts),
                               rejected=sum(v in REJECTED for v in verdicts),
                               unchecked=sum(v not in REJECTED and v is not Verdict.CORRECT for v in verdicts),
                               pairs=len(pairs), dropped=dropped)

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
        await asyncio.to_thread(self.verifier.close)
