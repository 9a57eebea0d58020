"""gRPC translation for the policy service: messages in, `PolicyCore` calls (in a worker thread), messages out.

Bad requests (and requests the vLLM engine refuses) become INVALID_ARGUMENT with the core's message; a vLLM engine
that failed on an accepted request (`EngineError`) becomes INTERNAL with its message. A call that failed because a
training rank died (world_size > 1) becomes UNAVAILABLE: on one machine the core has already started its ranks again
from the latest checkpoint; across machines (torchrun) the service stops, exit 1, and its launcher starts every rank
again. Either way the retry that clients make on UNAVAILABLE is applied. Nothing else is caught, so a real failure reaches the caller
as INTERNAL with its message rather than being dressed up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

import grpc

from cooper.config import CooperConfig
from cooper.protos.common.v1 import common_pb2
from cooper.protos.policy.v1 import policy_pb2, policy_pb2_grpc
from cooper.runtime.durability import UnjournaledUpdate
from cooper.runtime.ledger import idempotency_key
from cooper.runtime.server import GrpcService
from cooper.runtime.vllm_support import EngineError
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.errors import GroupLost, NotOffered, RanksRestarted, StaleRollout, VersionNotHeld
from cooper.services.policy.trainer import RolloutSample

log = logging.getLogger("cooper.policy")
T = TypeVar("T")


def sampling_params(msg: policy_pb2.Sampling) -> SamplingParams:
    return SamplingParams(
        n=msg.n,
        temperature=msg.temperature,
        top_p=msg.top_p or 1.0,  # proto3 default 0 means "not set"
        max_new_tokens=msg.max_new_tokens,
        stop=tuple(msg.stop),
        seed=msg.seed,
    )


class PolicyServicer(policy_pb2_grpc.PolicyServicer):
    def __init__(self, core: PolicyCore):
        self.core = core
        self.on_must_restart: Callable[[str], None] | None = None  # GrpcService.fail (build_service): stop, exit 1

    async def _run(self, context: grpc.aio.ServicerContext, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise AssertionError("unreachable") from err
        except RanksRestarted as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            raise AssertionError("unreachable") from err
        except (GroupLost, UnjournaledUpdate) as err:  # its launcher or supervisor starts it again once it stops:
            # every rank from the latest checkpoint and journal, or, after a journal write failed, the trainer from
            # the state its journal holds (the update not journaled is applied once, by the caller's retry)
            if self.on_must_restart is not None:
                self.on_must_restart(str(err))
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            raise AssertionError("unreachable") from err
        except (NotOffered, StaleRollout, VersionNotHeld) as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            raise AssertionError("unreachable") from err
        except EngineError as err:
            await context.abort(grpc.StatusCode.INTERNAL, str(err))
            raise AssertionError("unreachable") from err

    async def Generate(self, request: policy_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> policy_pb2.GenerateResponse:
        try:
            sampling = sampling_params(request.sampling)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        wanted = request.version if request.HasField("version") else None
        groups, version = await self._run(context, self.core.generate, [p.text for p in request.prompts], sampling,
                                          wanted)
        response = policy_pb2.GenerateResponse(version=version)
        for prompt, group in zip(request.prompts, groups, strict=True):
            for index, c in enumerate(group):
                response.completions.append(policy_pb2.Completion(
                    prompt_id=prompt.id, index=index, text=c.text, token_ids=c.token_ids, logprobs=c.logprobs,
                    finish_reason=c.finish_reason, prompt_token_ids=c.prompt_token_ids,
                ))
        return response

    async def Train(self, request: policy_pb2.TrainRequest, context: grpc.aio.ServicerContext
                    ) -> policy_pb2.TrainResponse:
        if not request.HasField("sampled_version"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Train needs sampled_version: the policy version "
                                "that sampled the rollout (GenerateResponse.version)")
        samples = [RolloutSample(list(c.prompt_token_ids), list(c.token_ids), list(c.logprobs) or None)
                   for c in request.rollout]
        result = await self._run(context, self.core.train, idempotency_key(request.key.run_id, request.key.step), samples,
                                 list(request.rewards), request.group_size, request.sampled_version)
        return policy_pb2.TrainResponse(metrics=result.metrics, version=result.version, replayed=result.replayed)

    async def Info(self, request: policy_pb2.InfoRequest, context: grpc.aio.ServicerContext
                   ) -> policy_pb2.InfoResponse:
        return policy_pb2.InfoResponse(**asdict(await self._run(context, self.core.info)))

    async def Save(self, request: common_pb2.SaveRequest, context: grpc.aio.ServicerContext
                   ) -> common_pb2.SaveResponse:
        saved = await self._run(context, self.core.save, request.tag)
        return common_pb2.SaveResponse(path=saved.path, version=saved.version)

    async def Restore(self, request: policy_pb2.RestoreRequest, context: grpc.aio.ServicerContext
                      ) -> policy_pb2.RestoreResponse:
        result = await self._run(context, self.core.restore, idempotency_key(request.key.run_id, request.key.step),
                                 request.at_most_version)
        return policy_pb2.RestoreResponse(restored_version=result.restored_version, version=result.version,
                                          checkpoint=result.checkpoint, replayed=result.replayed)


def build_service(config: CooperConfig, core: PolicyCore) -> GrpcService:
    """The gRPC service around an already built core (tests and benchmarks share one core this way)."""
    servicer = PolicyServicer(core)

    def add(server: grpc.aio.Server) -> list[str]:
        policy_pb2_grpc.add_PolicyServicer_to_server(servicer, server)
        return [policy_pb2.DESCRIPTOR.services_by_name["Policy"].full_name]

    async def on_stop() -> None:
        # After the server drained its calls, so no Train runs beside it: a SIGTERM (compose down or restart, a pod
        # rolled) then costs no update, and the restarted service is at the version the run recorded. Then the
        # other ranks (policy.world_size > 1) are stopped.
        try:
            if config.policy.save_on_stop:
                await asyncio.to_thread(core.save_if_unsaved, "stop")
        finally:
            await asyncio.to_thread(core.close)

    service = GrpcService("policy", config.policy.server, add, on_stop=on_stop, security=config.security)
    servicer.on_must_restart = service.fail
    service.ready_info = {"version": core.version, "engine": core.engine.name, "world_size": core.world_size}
    return service


async def create_service(config: CooperConfig) -> GrpcService:
    """Entry point of `cooper serve policy`: load the model (resuming from the latest checkpoint), then serve."""
    core = await asyncio.to_thread(PolicyCore, config.policy, config.run.max_staleness)
    return build_service(config, core)
