"""The reward service, shared by gRPC and HTTP: tokenizing, the batcher in front of the model runner, metrics.

No transport code here: `server.py` (gRPC) and `handler.py` (HTTP) translate their messages into these calls and
these exceptions into status codes. The model's state lives in RewardCore (core.py), which runs on a thread or in a
child process (runner.py); this object tokenizes each request as it arrives (with the model's own tokenizer, so
that the model's process only runs forward passes), queues and batches token ids, records metrics and remembers
the latest ModelInfo.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence

import prometheus_client

from cooper.config import RewardConfig
from cooper.services.reward.batcher import Batcher
from cooper.services.reward.core import BatchScores, RewardCore, idempotency_key
from cooper.services.reward.items import (
    ModelInfo,
    PreferencePair,
    SavedCheckpoint,
    ScoreItem,
    ScoreResult,
    UpdateResult,
)
from cooper.services.reward.runner import Runner, ThreadRunner, start_runner
from cooper.services.reward.verify_rm import Encoder, sigmoid

__all__ = ["RewardService", "ScoreResult", "idempotency_key"]

TOKENIZE_SECONDS = prometheus_client.Histogram(
    "cooper_reward_tokenize_seconds", "Time to build and tokenize the inputs of one scoring request",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1),
)
MODEL_SECONDS = prometheus_client.Histogram(
    "cooper_reward_model_seconds", "Time of one scoring forward pass",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
# Requests with more text than this are tokenized on a worker thread (the tokenizer releases the GIL); smaller ones,
# the usual single item, inline on the event loop, where they cost less than the thread hop would.
INLINE_TOKENIZE_CHARS = 16_000

MODEL_VERSION = prometheus_client.Gauge("cooper_reward_model_version", "Current VerifyRM version")
UPDATES = prometheus_client.Counter("cooper_reward_updates_total", "Update requests", ["outcome"])


class RewardService:
    """Build with `await RewardService.create(config)` (inside the event loop that will serve it)."""

    def __init__(self, runner: Runner, config: RewardConfig, info: ModelInfo, encoder: Encoder):
        self.runner = runner
        self.config = config
        self.encoder = encoder
        self._info = info
        self.batcher = Batcher(self._submit_batch, config.batching)
        self.stopping = False
        MODEL_VERSION.set(info.version)

    @classmethod
    async def create(cls, config: RewardConfig) -> RewardService:
        """Load the latest checkpoint under config.checkpoint_dir, else config.model; start the batcher."""
        runner = await start_runner(config)
        try:
            info: ModelInfo = await runner.submit("info")
            if isinstance(runner, ThreadRunner):
                encoder = runner.core.rm.encoder
            else:
                encoder = await asyncio.to_thread(Encoder.load, info.tokenizer_source, config.max_length)
        except BaseException:
            await runner.close()
            raise
        service = cls(runner, config, info, encoder)
        service.batcher.start()
        return service

    @property
    def core(self) -> RewardCore:
        """The core itself, when it runs on a thread of this process (reward.model_process=false): for tests."""
        if not isinstance(self.runner, ThreadRunner):
            raise AttributeError("the reward core runs in a child process (reward.model_process=true)")
        return self.runner.core

    @property
    def version(self) -> int:
        return self._info.version

    @property
    def ready(self) -> bool:
        return self.batcher.running and self.runner.alive and not self.stopping

    @property
    def alive(self) -> bool:
        """False once the model process has died: the service cannot score again until it is restarted."""
        return self.runner.alive

    def info(self) -> ModelInfo:
        return self._info

    # ----- scoring -----

    def _submit_batch(self, token_lists: list[list[int]]) -> Awaitable[tuple[list[float], int]]:
        """Submit now (the batcher's order is the model's order); the batch's timings are recorded when it is back."""
        return self._scored(self.runner.submit("score_tokens", token_lists))

    @staticmethod
    async def _scored(pending: Awaitable[BatchScores]) -> tuple[list[float], int]:
        scores = await pending
        for seconds in scores.forward_s:
            MODEL_SECONDS.observe(seconds)
        return scores.logits, scores.version

    def reward(self, logit: float) -> float:
        probability = sigmoid(logit)
        if self.config.discrete:
            return 1.0 if probability > 0.5 else 0.0
        return probability

    async def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        """Rewards (sigmoid(logit), or 1[> 0.5] when reward.discrete) and logits, with the model version."""
        if not items:
            return ScoreResult([], [], self.version)
        logits, version = await self.batcher.submit(await self._encode(items))
        return ScoreResult([self.reward(x) for x in logits], logits, version)

    async def _encode(self, items: Sequence[ScoreItem]) -> list[list[int]]:
        start = time.perf_counter()
        if sum(len(i.question) + len(i.reference) + len(i.completion) for i in items) <= INLINE_TOKENIZE_CHARS:
            tokens = self.encoder.encode(items)
        else:
            tokens = await asyncio.to_thread(self.encoder.encode, items)
        TOKENIZE_SECONDS.observe(time.perf_counter() - start)
        return tokens

    # ----- updates and checkpoints -----

    async def update(self, key: str | None, pairs: Sequence[PreferencePair]) -> UpdateResult:
        """One Bradley-Terry step over `pairs` -> version + 1; a key applied before returns its recorded result."""
        result: UpdateResult = await self.batcher.run_exclusive(
            lambda: self.runner.submit("apply_update", key, list(pairs)))
        UPDATES.labels("replayed" if result.replayed else "skipped" if result.skipped else "applied").inc()
        await self._refresh_info()
        return result

    async def save(self, tag: str = "") -> SavedCheckpoint:
        """Write a checkpoint now (between batches and updates, so it holds one consistent state)."""
        saved: SavedCheckpoint = await self.batcher.run_exclusive(lambda: self.runner.submit("save", tag))
        await self._refresh_info()
        return saved

    async def _refresh_info(self) -> None:
        self._info = await self.runner.submit("info")
        MODEL_VERSION.set(self._info.version)

    async def stop(self) -> None:
        """Save unsaved updates (reward.save_on_stop), fail waiting requests, stop the model runner."""
        self.stopping = True
        try:
            if self.config.save_on_stop and self.runner.alive:
                await self.batcher.run_exclusive(lambda: self.runner.submit("save_if_unsaved", "stop"))
        finally:
            await self.batcher.stop()
            await self.runner.close()
