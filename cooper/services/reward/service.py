"""The reward service's core, shared by gRPC and HTTP: VerifyRM + batcher + versions + idempotency + checkpoints.

No transport code here: `server.py` (gRPC) and `handler.py` (HTTP) translate their messages into these calls and
these exceptions into status codes. Everything that touches the model runs on the batcher's single model thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import prometheus_client
import torch

from cooper.config import RewardConfig
from cooper.services.reward import checkpoint
from cooper.services.reward.batcher import Batcher
from cooper.services.reward.verify_rm import PreferencePair, ScoreItem, UpdateStats, VerifyRM, sigmoid

log = logging.getLogger("cooper.reward")

TOKENIZE_SECONDS = prometheus_client.Histogram(
    "cooper_reward_tokenize_seconds", "Time to build and tokenize the inputs of one scoring batch",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1),
)
MODEL_SECONDS = prometheus_client.Histogram(
    "cooper_reward_model_seconds", "Time of one scoring forward pass",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
MODEL_VERSION = prometheus_client.Gauge("cooper_reward_model_version", "Current VerifyRM version")
UPDATES = prometheus_client.Counter("cooper_reward_updates_total", "Update requests", ["outcome"])

RECORDED_RESULTS = 64  # Update results kept for replay; the orchestrator only ever retries its latest steps


@dataclass(frozen=True)
class ScoreResult:
    """Invariant: scores and logits have the length of the items, in order, all from model `version`."""

    scores: list[float]
    logits: list[float]
    version: int


UpdateResult = UpdateStats  # the service's name for it: what Update answers (recorded per key)


@dataclass(frozen=True)
class ModelInfo:
    model: str
    version: int
    parameters: int
    device: str
    last_key: str
    checkpoint: str


@dataclass(frozen=True)
class SavedCheckpoint:
    path: str
    version: int


def idempotency_key(run_id: str, step: int) -> str | None:
    """"<run_id>/<step>", or None (no idempotency) when run_id is empty."""
    return f"{run_id}/{step}" if run_id else None


class RewardService:
    """Build with `await RewardService.create(config)` (inside the event loop that will serve it)."""

    def __init__(self, rm: VerifyRM, config: RewardConfig, state: dict[str, Any] | None = None,
                 checkpoint_path: str = ""):
        self.rm = rm
        self.config = config
        state = state or {}
        self.updates: int = state.get("updates", 0)
        self.last_key: str = state.get("last_key", "")
        self._results: OrderedDict[str, UpdateResult] = OrderedDict(
            (key, UpdateResult(**value)) for key, value in state.get("results", {}).items()
        )
        self.checkpoint_path = checkpoint_path
        self._saved_state = (rm.version, self.updates) if checkpoint_path else None
        self.batcher = Batcher(self._run_batch, config.batching)
        self.stopping = False
        MODEL_VERSION.set(rm.version)

    @classmethod
    async def create(cls, config: RewardConfig) -> RewardService:
        """Load the latest checkpoint under config.checkpoint_dir, else config.model; start the batcher."""
        service = await asyncio.to_thread(cls.load, config)
        service.batcher.start()
        return service

    @classmethod
    def load(cls, config: RewardConfig) -> RewardService:
        from cooper.tiny.models import resolve_model

        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        checkpoint.remove_partial(config.checkpoint_dir)
        latest = checkpoint.latest_checkpoint(config.checkpoint_dir)
        source = str(latest) if latest else resolve_model(config.model, "reward")
        rm = VerifyRM.load(source, config.optim, config.max_length, config.device, config.dtype)
        rm.source = config.model
        if latest is None:
            log.info("reward model %s loaded (version 0, no checkpoint in %s)", config.model, config.checkpoint_dir)
            return cls(rm, config)
        state = checkpoint.read_state(latest)
        if state.get("model") != config.model:
            log.warning("checkpoint %s was trained from %r, but reward.model is %r; resuming from the checkpoint",
                        latest, state.get("model"), config.model)
        checkpoint.load_optimizer(rm, latest)
        rm.version = state["version"]
        log.info("reward model resumed from %s (version %d)", latest, rm.version)
        return cls(rm, config, state, str(latest))

    @property
    def ready(self) -> bool:
        return self.batcher.running and not self.stopping

    # ----- scoring -----

    def _run_batch(self, items: list[ScoreItem]) -> tuple[list[float], int]:
        """On the model thread: logits of one batch and the version that produced them."""
        start = time.perf_counter()
        tokens = self.rm.encode(items)
        TOKENIZE_SECONDS.observe(time.perf_counter() - start)
        batching = self.config.batching
        logits = self.rm.logits(tokens, batching.max_batch_size, batching.max_tokens, MODEL_SECONDS.observe)
        return logits, self.rm.version

    def reward(self, logit: float) -> float:
        probability = sigmoid(logit)
        if self.config.discrete:
            return 1.0 if probability > 0.5 else 0.0
        return probability

    async def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        """Rewards (sigmoid(logit), or 1[> 0.5] when reward.discrete) and logits, with the model version."""
        if not items:
            return ScoreResult([], [], self.rm.version)
        logits, version = await self.batcher.submit(items)
        return ScoreResult([self.reward(x) for x in logits], logits, version)

    # ----- updates and checkpoints -----

    async def update(self, key: str | None, pairs: Sequence[PreferencePair]) -> UpdateResult:
        """One Bradley-Terry step over `pairs` -> version + 1; a key applied before returns its recorded result."""
        return await self.batcher.run_exclusive(lambda: self._apply_update(key, list(pairs)))

    def _apply_update(self, key: str | None, pairs: list[PreferencePair]) -> UpdateResult:
        if key is not None and key in self._results:
            UPDATES.labels("replayed").inc()
            return replace(self._results[key], replayed=True)
        stats = self.rm.update(pairs)
        self.updates += 1
        result = stats
        if key is not None:
            self.last_key = key
            self._results[key] = result
            while len(self._results) > RECORDED_RESULTS:
                self._results.popitem(last=False)
        UPDATES.labels("skipped" if stats.skipped else "applied").inc()
        MODEL_VERSION.set(self.rm.version)
        if not stats.skipped and self.config.save_every and self.rm.version % self.config.save_every == 0:
            self._save("")
        return result

    async def save(self, tag: str = "") -> SavedCheckpoint:
        """Write a checkpoint now (between batches and updates, so it holds one consistent state)."""
        return await self.batcher.run_exclusive(lambda: self._save(tag))

    def _save(self, tag: str) -> SavedCheckpoint:
        state = {
            "version": self.rm.version, "updates": self.updates, "last_key": self.last_key, "model": self.config.model,
            "tag": tag, "results": {key: asdict(value) for key, value in self._results.items()},
        }
        path = checkpoint.save_checkpoint(self.rm, self.config.checkpoint_dir, state, self.config.keep_checkpoints)
        self.checkpoint_path = str(path)
        self._saved_state = (self.rm.version, self.updates)
        log.info("reward checkpoint written: %s", path)
        return SavedCheckpoint(str(path), self.rm.version)

    def info(self) -> ModelInfo:
        device = str(self.rm.device)
        return ModelInfo(self.config.model, self.rm.version, self.rm.parameters, device, self.last_key,
                         self.checkpoint_path)

    async def stop(self) -> None:
        """Save unsaved updates (reward.save_on_stop), fail waiting requests, stop the model thread."""
        self.stopping = True
        try:
            if self.config.save_on_stop and self.updates and self._saved_state != (self.rm.version, self.updates):
                await self.save("stop")
        finally:
            await self.batcher.stop()
