"""`InProcessReward`: the reward service as its client speaks it (client.py), over a `RewardCore` in this process.

The same calls and replies as `RewardClient` without gRPC, the batcher or the model process between: for a run in
one process (`cooper train --in-process`), for tests and for benches. One model call at a time, as the service's
batcher runs them; scores are the service's (`logit_to_reward` of each logit, reward.discrete).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from cooper.config import RewardConfig
from cooper.reward_rule import logit_to_reward
from cooper.runtime.ledger import SavedCheckpoint, idempotency_key
from cooper.services.reward.core import RewardCore
from cooper.services.reward.items import (
    ModelInfo,
    PreferencePair,
    ScoreItem,
    ScoreResult,
    UpdateResult,
)


class InProcessReward:
    def __init__(self, config: RewardConfig):
        self.config = config
        self.core = RewardCore.load(config)
        self._model = threading.Lock()

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        """Rewards and logits in the order of `items`, all from one model version."""
        if not items:
            return ScoreResult([], [], self.core.rm.version)
        tokens = self.core.rm.encode(items)
        with self._model:
            scored = self.core.score_tokens(tokens)
        return ScoreResult([logit_to_reward(x, self.config.discrete) for x in scored.logits], list(scored.logits),
                           scored.version, sum(len(t) for t in tokens))

    def update(self, run_id: str, step: int, pairs: Sequence[PreferencePair], optimizer_steps: int = 0) -> UpdateResult:
        with self._model:
            return self.core.apply_update(idempotency_key(run_id, step), list(pairs), optimizer_steps)

    def info(self) -> ModelInfo:
        return self.core.info()

    def save(self, tag: str = "") -> SavedCheckpoint:
        with self._model:
            return self.core.save(tag)

    def close(self) -> None:
        """As the service stops: save what is unsaved (reward.save_on_stop), then let a background save finish."""
        try:
            if self.config.save_on_stop:
                with self._model:
                    self.core.save_if_unsaved("stop")
        finally:
            self.core.close()
