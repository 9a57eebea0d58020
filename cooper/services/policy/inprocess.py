"""`InProcessPolicy`: the policy service as its client speaks it (client.py), over a `PolicyCore` in this process.

The same calls, replies and refusals as `PolicyClient` (a version not held is `VersionNotHeld`, a rollout the
trainer must not take is `StaleRollout`, a bad request is `ValueError`), without gRPC between: for a run in one
process (`cooper train --in-process`), for tests and for benches.
"""

from __future__ import annotations

from collections.abc import Sequence

from cooper.config import PolicyConfig
from cooper.runtime.ledger import SavedCheckpoint, idempotency_key
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.messages import (
    Completion,
    Generation,
    PolicyInfo,
    RestoreResult,
    TrainResult,
)
from cooper.services.policy.trainer import RolloutSample


class InProcessPolicy:
    def __init__(self, config: PolicyConfig, max_staleness: int = 0):
        self.config = config
        self.core = PolicyCore(config, max_staleness)

    def generate(self, prompts: Sequence[tuple[str, str]], *, n: int, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 1024, stop: Sequence[str] = (), seed: int = 0, version: int | None = None
                 ) -> Generation:
        sampling = SamplingParams(n=n, temperature=temperature, top_p=top_p or 1.0, max_new_tokens=max_new_tokens,
                                  stop=tuple(stop), seed=seed)
        groups, sampled = self.core.generate([text for _, text in prompts], sampling, version)
        return Generation([Completion(pid, index, c.text, list(c.token_ids), list(c.logprobs), c.finish_reason,
                                      list(c.prompt_token_ids))
                           for (pid, _), group in zip(prompts, groups, strict=True)
                           for index, c in enumerate(group)], sampled)

    def train(self, run_id: str, step: int, rollout: Sequence[Completion], rewards: Sequence[float], group_size: int,
              sampled_version: int) -> TrainResult:
        samples = [RolloutSample(list(c.prompt_token_ids), list(c.token_ids), list(c.logprobs) or None)
                   for c in rollout]
        return self.core.train(idempotency_key(run_id, step), samples, list(rewards), group_size, sampled_version)

    def info(self) -> PolicyInfo:
        return self.core.info()

    def save(self, tag: str = "") -> SavedCheckpoint:
        return self.core.save(tag)

    def restore(self, run_id: str, step: int, at_most_version: int) -> RestoreResult:
        return self.core.restore(idempotency_key(run_id, step), at_most_version)

    def close(self) -> None:
        """As the service stops: save what is unsaved (policy.save_on_stop), then stop the engine and the ranks."""
        try:
            if self.config.save_on_stop:
                self.core.save_if_unsaved("stop")
        finally:
            self.core.close()
