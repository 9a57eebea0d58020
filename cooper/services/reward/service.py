"""The reward service, shared by gRPC and HTTP: tokenizing, the batcher in front of the model runner, metrics.

No transport code here: `server.py` (gRPC) and `serving/handler.py` (HTTP) translate their messages into these calls
and these exceptions into status codes. The model's state lives in RewardCore (core.py), which runs on a thread or in
a child process (runner.py); this object tokenizes each request as it arrives (with the model's own tokenizer, so that
the model's process only runs forward passes), or with reward.tokenize_in_model leaves that to the model's process,
a batch at a time; it queues and batches, records metrics and remembers the latest ModelInfo. A read replica
(reward.role=replica) refuses updates and saves and runs a ReplicaFollower (replica.py) that swaps in the trainer's
newer checkpoints.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import prometheus_client

from cooper.config import RewardConfig
from cooper.reward_rule import logit_to_reward
from cooper.runtime.ledger import SavedCheckpoint
from cooper.services.reward.batcher import Batcher
from cooper.services.reward.core import BatchScores, RewardCore
from cooper.services.reward.items import (
    ModelInfo,
    PreferencePair,
    ScoreItem,
    ScoreResult,
    UpdateResult,
)
from cooper.services.reward.learner import OnlineLearner
from cooper.services.reward.replica import ReadOnlyReplica, ReplicaFollower, ReplicaStale, Staleness
from cooper.services.reward.runner import CopiesRunner, Runner, ThreadRunner, start_runner
from cooper.services.reward.serving_defaults import with_model_copies
from cooper.services.reward.verify_rm import Encoder

log = logging.getLogger("cooper.reward")

__all__ = ["ReadOnlyReplica", "ReplicaStale", "RewardService", "ScoreResult"]

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


def _import_tokenizer() -> None:
    from transformers import AutoTokenizer  # noqa: F401  (Encoder.load's import, done ahead)


class RewardService:
    """Build with `await RewardService.create(config)` (inside the event loop that will serve it)."""

    def __init__(self, runner: Runner, config: RewardConfig, info: ModelInfo, encoder: Encoder | None,
                 spread_waits_ms: list[float] | None = None):
        self.runner = runner
        self.config = config
        self.encoder = encoder
        self._info = info
        self.batcher = Batcher(self._submit_batch, config.batching, model_copies=config.model_copies,
                               waits_ms=spread_waits_ms)
        self.stopping = False
        MODEL_VERSION.set(info.version)
        self.follower: ReplicaFollower | None = None
        self.learner: OnlineLearner | None = None  # reward.learn_online: set by create()
        self.on_readiness: Callable[[bool], None] | None = None  # the gRPC health service's, set by server.py
        if config.role == "replica":
            self.follower = ReplicaFollower(config.replica, config.checkpoint_dir, lambda: self.version,
                                            self.load_checkpoint, self._replica_polled)

    @classmethod
    async def create(cls, config: RewardConfig) -> RewardService:
        """Load the latest checkpoint under config.checkpoint_dir, else config.model; start the batcher."""
        # The tokenizer's import (transformers: 1-2 s of CPU on 2 cores) runs while the model process loads.
        importing = (asyncio.ensure_future(asyncio.to_thread(_import_tokenizer))
                     if config.model_process and not config.tokenize_in_model else None)
        config, copies = with_model_copies(config)
        runner = await start_runner(config)
        try:
            if importing is not None:
                await importing
            info: ModelInfo = await runner.info()
            batching, reasons, spread_waits_ms = await runner.call(RewardCore.batching)
            kernel = await runner.call(RewardCore.linear_kernel)
            if isinstance(runner, CopiesRunner):  # the first copy chose (RewardCore.load); all batch alike
                await runner.call(RewardCore.use_batching, batching)
                await runner.call(RewardCore.use_linear_kernel, kernel)
            config = config.model_copy(update={"batching": batching, "cpu_linear": kernel})
            encoder: Encoder | None = None  # reward.tokenize_in_model: the model's process tokenizes
            if isinstance(runner, ThreadRunner):
                encoder = runner.core.rm.encoder
            elif not config.tokenize_in_model:
                encoder = await asyncio.to_thread(Encoder.load, info.tokenizer_source, config.max_length)
        except BaseException:
            await runner.close()
            raise
        chosen = ([f"model_copies={config.model_copies}: {copies.why}"] if copies else []) + reasons
        if chosen:
            log.info("reward serving settings chosen at start-up (set them in reward.* to override): %s",
                     "; ".join(chosen))
        service = cls(runner, config, info, encoder, spread_waits_ms)
        if config.learn_online.enabled:
            # its verifier workers start (and import math-verify) off the event loop
            service.learner = await asyncio.to_thread(OnlineLearner, config.learn_online, service.update,
                                                      lambda: service.version)
        service.batcher.start()
        if service.follower is not None:
            service.follower.start()
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
        """Serving: the model runs, and a replica set to refuse when stale is not stale."""
        return self.batcher.running and self.runner.alive and not self.stopping and not self._refusing()

    def staleness(self) -> Staleness | None:
        """How far a replica is behind the trainer; None for the trainer."""
        return self.follower.staleness() if self.follower is not None else None

    def _refusing(self) -> bool:
        staleness = self.staleness()
        return staleness is not None and staleness.stale and self.config.replica.on_stale == "refuse"

    def check_fresh(self) -> Staleness | None:
        """Raise ReplicaStale when this replica is stale and reward.replica.on_stale=refuse, else its staleness."""
        staleness = self.staleness()
        if staleness is not None and staleness.stale and self.config.replica.on_stale == "refuse":
            assert self.follower is not None
            raise ReplicaStale(f"this reward replica is stale ({staleness.describe()}; reward.replica limits "
                               f"max_lag_s={self.config.replica.max_lag_s}, max_versions_behind="
                               f"{self.config.replica.max_versions_behind}); retry, another replica may be current",
                               self.follower.retry_after_s)
        return staleness

    def _replica_polled(self, staleness: Staleness) -> None:
        if self.on_readiness is not None:
            self.on_readiness(self.ready)

    @property
    def alive(self) -> bool:
        """False once the model process has died: the service cannot score again until it is restarted."""
        return self.runner.alive

    def info(self) -> ModelInfo:
        return self._info

    # ----- scoring -----

    def _submit_batch(self, batch: list[Any]) -> Awaitable[tuple[list[Any], int]]:
        """Submit now (the batcher's order is the model's order); the batch's timings are recorded when it is back.
        A batch of token ids gives a logit per item; of texts (reward.tokenize_in_model), a (logit, tokens) pair."""
        if self.config.tokenize_in_model:
            return self._scored(self.runner.score_texts(batch))
        return self._scored(self.runner.score_tokens(batch))

    @staticmethod
    async def _scored(pending: Awaitable[BatchScores]) -> tuple[list[Any], int]:
        scores = await pending
        for seconds in scores.forward_s:
            MODEL_SECONDS.observe(seconds)
        if scores.tokens is not None:
            return list(zip(scores.logits, scores.tokens, strict=True)), scores.version
        return scores.logits, scores.version

    async def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        """Rewards (sigmoid(logit), or 1[> 0.5] when reward.discrete) and logits, with the model version."""
        if not items:
            return ScoreResult([], [], self.version)
        if self.config.tokenize_in_model:
            scored, version = await self.batcher.submit([(i.question, i.reference, i.completion) for i in items])
            logits = [logit for logit, _ in scored]
            tokens = sum(count for _, count in scored)
        else:
            token_lists = await self._encode(items)
            logits, version = await self.batcher.submit(token_lists)
            tokens = sum(len(t) for t in token_lists)
        return ScoreResult([logit_to_reward(x, self.config.discrete) for x in logits], logits, version, tokens)

    async def _encode(self, items: Sequence[ScoreItem]) -> list[list[int]]:
        assert self.encoder is not None  # loaded unless reward.tokenize_in_model
        start = time.perf_counter()
        if sum(len(i.question) + len(i.reference) + len(i.completion) for i in items) <= INLINE_TOKENIZE_CHARS:
            tokens = self.encoder.encode(items)
        else:
            tokens = await asyncio.to_thread(self.encoder.encode, items)
        TOKENIZE_SECONDS.observe(time.perf_counter() - start)
        return tokens

    # ----- updates and checkpoints -----

    def observe(self, items: Sequence[ScoreItem]) -> None:
        """Completions just scored over HTTP: the learning mode's material (reward.learn_online); nothing when off."""
        if self.learner is not None:
            self.learner.observe(items)

    def _refuse_writes(self, what: str) -> None:
        if self.config.role == "replica":
            raise ReadOnlyReplica(f"{what} refused: this reward service is a read replica (reward.role=replica) and "
                                  "never changes the model; send it to the trainer (reward.server.address)")

    async def update(self, key: str, pairs: Sequence[PreferencePair], optimizer_steps: int = 0) -> UpdateResult:
        """One Bradley-Terry update over `pairs` -> version + 1 (`optimizer_steps` steps; 0: reward.update_steps);
        a key applied before returns its recorded result."""
        self._refuse_writes("Update")
        result: UpdateResult = await self.batcher.run_exclusive(
            lambda: self.runner.apply_update(key, list(pairs), optimizer_steps))
        UPDATES.labels("replayed" if result.replayed else "skipped" if result.skipped else "applied").inc()
        await self._refresh_info()
        return result

    async def save(self, tag: str = "") -> SavedCheckpoint:
        """Write a checkpoint now (between batches and updates, so it holds one consistent state)."""
        self._refuse_writes("Save")
        saved: SavedCheckpoint = await self.batcher.run_exclusive(lambda: self.runner.save(tag))
        await self._refresh_info()
        return saved

    async def load_checkpoint(self, path: str) -> ModelInfo:
        """A replica's weight swap: read `path` beside the scoring (the model's loader thread), then install it
        between batches, like an update, so that no score sees half of it."""
        await self.runner.stage_checkpoint(path)
        while not await self.runner.staged():
            await asyncio.sleep(0.02)
        info: ModelInfo = await self.batcher.run_exclusive(lambda: self.runner.swap_staged())
        self._info = info
        MODEL_VERSION.set(info.version)
        return info

    async def _refresh_info(self) -> None:
        self._info = await self.runner.info()
        MODEL_VERSION.set(self._info.version)

    async def stop(self) -> None:
        """Save unsaved updates (reward.save_on_stop), fail waiting requests, stop the model runner."""
        self.stopping = True
        if self.follower is not None:
            await self.follower.stop()
        if self.learner is not None:
            await self.learner.close()
        try:
            if self.config.save_on_stop and self.config.role == "trainer" and self.runner.alive:
                save = partial(self.runner.save_if_unsaved, "stop")
                # Without its loop (it died on a bug) the batcher submits nothing more: the save goes to the runner,
                # which runs it after whatever it was given, so the updates it applied are not lost.
                await (self.batcher.run_exclusive(save) if self.batcher.running else save())
        finally:
            await self.batcher.stop()
            await self.runner.close()
