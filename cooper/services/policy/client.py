"""`PolicyClient`: the orchestrator's side of the policy service; speaks `messages`' dataclasses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from cooper.config import SecurityConfig, ServerConfig
from cooper.protos.common.v1 import common_pb2
from cooper.protos.policy.v1 import policy_pb2, policy_pb2_grpc
from cooper.runtime.client import ServiceClient
from cooper.runtime.ledger import SavedCheckpoint
from cooper.services.policy.errors import StaleRollout, VersionNotHeld
from cooper.services.policy.messages import (
    Completion,
    Generation,
    PolicyInfo,
    RestoreResult,
    TrainResult,
)


class PolicyClient(ServiceClient):
    service_name = "cooper.policy.v1.Policy"

    def __init__(self, address: str, config: ServerConfig | None = None, security: SecurityConfig | None = None):
        super().__init__(address, config, security)
        self.stub = policy_pb2_grpc.PolicyStub(self.channel)

    def generate(
        self,
        prompts: Sequence[tuple[str, str]],
        *,
        n: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 1024,
        stop: Sequence[str] = (),
        seed: int = 0,
        version: int | None = None,
    ) -> Generation:
        """`n` completions per (id, text) prompt; grouped by prompt in order, `index` ascending. `version`: the
        policy version to sample from (VersionNotHeld when the service does not hold it); None: the current."""
        request = policy_pb2.GenerateRequest(
            prompts=[policy_pb2.Prompt(id=pid, text=text) for pid, text in prompts],
            sampling=policy_pb2.Sampling(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                         stop=list(stop), seed=seed),
            version=version,
        )
        reply = self.call_refusing(self.stub.Generate, request, VersionNotHeld)
        # Plain fields, not json_format: that costs ~0.7 ms a completion, on the critical path of every step.
        completions = [Completion(c.prompt_id, c.index, c.text, list(c.token_ids), list(c.logprobs), c.finish_reason,
                                  list(c.prompt_token_ids)) for c in reply.completions]
        return Generation(completions, reply.version)

    def train(
        self,
        run_id: str,
        step: int,
        rollout: Sequence[Completion],
        rewards: Sequence[float],
        group_size: int,
        sampled_version: int,
    ) -> TrainResult:
        """One GRPO update on a rollout that policy version `sampled_version` sampled; retrying the same
        (run_id, step) returns the recorded result (`replayed`). StaleRollout when the trainer must not take it."""
        request = policy_pb2.TrainRequest(
            key=common_pb2.IdempotencyKey(run_id=run_id, step=step),
            rollout=[policy_pb2.Completion(prompt_id=c.prompt_id, index=c.index, text=c.text, token_ids=c.token_ids,
                                           logprobs=c.logprobs, finish_reason=c.finish_reason,
                                           prompt_token_ids=c.prompt_token_ids) for c in rollout],
            rewards=list(rewards), group_size=group_size, sampled_version=sampled_version,
        )
        reply = self.call_refusing(self.stub.Train, request, StaleRollout)
        return TrainResult(dict(reply.metrics), reply.version, reply.replayed)

    def call_refusing(self, method: Any, request: Any, refusal: type[Exception]) -> Any:
        """`call`, with the service's FAILED_PRECONDITION raised as the core's `refusal`, as an in-process core
        raises it (inprocess.py): callers handle one exception whichever way they reach the service."""
        try:
            return self.call(method, request)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise refusal(err.details()) from err
            raise

    def info(self) -> PolicyInfo:
        r = self.call(self.stub.Info, policy_pb2.InfoRequest())
        return PolicyInfo(r.model, r.version, r.parameters, r.device, r.engine, r.last_key, r.checkpoint)

    def save(self, tag: str = "") -> SavedCheckpoint:
        r = self.call(self.stub.Save, common_pb2.SaveRequest(tag=tag))
        return SavedCheckpoint(r.path, r.version)

    def restore(self, run_id: str, step: int, at_most_version: int) -> RestoreResult:
        """Roll back to the newest kept checkpoint at or below `at_most_version`, as the next version; retrying the
        same (run_id, step) returns the recorded reply (`replayed`)."""
        r = self.call(self.stub.Restore, policy_pb2.RestoreRequest(
            key=common_pb2.IdempotencyKey(run_id=run_id, step=step), at_most_version=at_most_version))
        return RestoreResult(r.restored_version, r.version, r.checkpoint, r.replayed)
