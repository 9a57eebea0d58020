"""RewardClient: the orchestrator's view of the reward service, in the core's plain dataclasses.

Update is retried on UNAVAILABLE like every call (ServiceClient); that is safe because its idempotency key makes a
repeat return the recorded result.
"""

from __future__ import annotations

from collections.abc import Sequence

from cooper.config import SecurityConfig, ServerConfig
from cooper.protos.common.v1 import common_pb2
from cooper.protos.reward.v1 import reward_pb2, reward_pb2_grpc
from cooper.runtime.client import ServiceClient
from cooper.runtime.ledger import SavedCheckpoint
from cooper.services.reward.items import (
    ModelInfo,
    PreferencePair,
    ScoreItem,
    ScoreResult,
    UpdateResult,
)


class RewardClient(ServiceClient):
    service_name = "cooper.reward.v1.Reward"

    def __init__(self, address: str, config: ServerConfig | None = None, security: SecurityConfig | None = None):
        super().__init__(address, config, security)
        self.stub = reward_pb2_grpc.RewardStub(self.channel)

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        """Rewards and logits in the order of `items`, all from one model version."""
        request = reward_pb2.ScoreRequest(items=[
            reward_pb2.ScoreItem(question=i.question, reference=i.reference, completion=i.completion) for i in items
        ])
        reply = self.call(self.stub.Score, request)
        return ScoreResult([s.score for s in reply.scores], [s.logit for s in reply.scores], reply.version)

    def update(self, run_id: str, step: int, pairs: Sequence[PreferencePair],
               optimizer_steps: int = 0) -> UpdateResult:
        """One Bradley-Terry update keyed by (run_id, step); a repeated key returns the recorded result.
        `optimizer_steps` > 0 takes that many optimizer steps instead of the service's reward.update_steps."""
        request = reward_pb2.UpdateRequest(
            key=common_pb2.IdempotencyKey(run_id=run_id, step=step),
            pairs=[reward_pb2.Pair(question=p.question, reference=p.reference, positive=p.positive,
                                   negative=p.negative) for p in pairs],
            optimizer_steps=optimizer_steps,
        )
        r = self.call(self.stub.Update, request)
        return UpdateResult(r.loss, r.grad_norm, r.pair_accuracy_before, r.pair_accuracy_after, r.version,
                            r.skipped, r.replayed)

    def info(self) -> ModelInfo:
        r = self.call(self.stub.Info, reward_pb2.InfoRequest())
        return ModelInfo(r.model, r.version, r.parameters, r.device, r.last_key, r.checkpoint)

    def save(self, tag: str = "") -> SavedCheckpoint:
        r = self.call(self.stub.Save, common_pb2.SaveRequest(tag=tag))
        return SavedCheckpoint(r.path, r.version)
