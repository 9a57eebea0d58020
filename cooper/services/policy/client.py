"""`PolicyClient`: the orchestrator's side of the policy service."""

from __future__ import annotations

from collections.abc import Sequence

from cooper.protos.common.v1 import common_pb2
from cooper.protos.policy.v1 import policy_pb2, policy_pb2_grpc
from cooper.runtime.client import ServiceClient


class PolicyClient(ServiceClient):
    service_name = "cooper.policy.v1.Policy"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
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
    ) -> policy_pb2.GenerateResponse:
        """`n` completions per (id, text) prompt; grouped by prompt in order, `index` ascending."""
        request = policy_pb2.GenerateRequest(
            prompts=[policy_pb2.Prompt(id=pid, text=text) for pid, text in prompts],
            sampling=policy_pb2.Sampling(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                         stop=list(stop), seed=seed),
        )
        return self.call(self.stub.Generate, request)

    def train(
        self,
        run_id: str,
        step: int,
        rollout: Sequence[policy_pb2.Completion],
        rewards: Sequence[float],
        group_size: int,
    ) -> policy_pb2.TrainResponse:
        """One GRPO update; retrying the same (run_id, step) returns the recorded result (`replayed`)."""
        request = policy_pb2.TrainRequest(
            key=common_pb2.IdempotencyKey(run_id=run_id, step=step),
            rollout=list(rollout), rewards=list(rewards), group_size=group_size,
        )
        return self.call(self.stub.Train, request)

    def info(self) -> policy_pb2.InfoResponse:
        return self.call(self.stub.Info, policy_pb2.InfoRequest())

    def save(self, tag: str = "") -> common_pb2.SaveResponse:
        return self.call(self.stub.Save, common_pb2.SaveRequest(tag=tag))
