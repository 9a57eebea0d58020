"""gRPC front of the generator: translates messages to and from the core (negatives.py, judge.py).

Requests are served concurrently by grpc.aio; the one shared assistant bounds the assistant calls in flight over
all of them (assistant.py). The assistant is built at start-up when the strategy needs it (`llm`), otherwise on
the first Judge call, so a perturb-only generator never loads a model it does not use.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from cooper.config import ConfigError, CooperConfig, GeneratorConfig
from cooper.protos.generator.v1 import generator_pb2, generator_pb2_grpc
from cooper.runtime.client import ServiceUnavailable
from cooper.runtime.server import GrpcService
from cooper.services.generator.assistant import Assistant, AssistantError, build_assistant
from cooper.services.generator.judge import JudgeTask, judge
from cooper.services.generator.negatives import (
    LLMStrategy,
    NegativeTask,
    RuleStrategy,
    Strategy,
    make_negatives,
    rule_name,
)
from cooper.services.verifier.client import VerifierClient
from cooper.services.verifier.messages import Check, as_checks

SERVICE_NAME = generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name
log = logging.getLogger("cooper.generator")


class RemoteVerifier:
    """The verifier service as the core's `verify` callable; the blocking client runs in a thread."""

    def __init__(self, client: VerifierClient):
        self.client = client

    async def __call__(self, pairs: list[tuple[str, str]]) -> list[Check]:
        return as_checks(await asyncio.to_thread(self.client.verify_pairs, pairs))


class LazyAssistant:
    """Builds the assistant on first use (in a thread: loading weights blocks)."""

    def __init__(self, config: GeneratorConfig):
        self.config = config
        self._assistant: Assistant | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Assistant:
        async with self._lock:
            if self._assistant is None:
                log.info("loading the assistant (%s, %s)", self.config.assistant.backend, self.config.assistant.model)
                self._assistant = await asyncio.to_thread(build_assistant, self.config.assistant)
            return self._assistant

    async def close(self) -> None:
        if self._assistant is not None:
            await self._assistant.close()


class GeneratorServicer(generator_pb2_grpc.GeneratorServicer):
    def __init__(self, config: GeneratorConfig, assistant: LazyAssistant, verify: RemoteVerifier):
        self.config = config
        self.assistant = assistant
        self.verify = verify

    async def _strategy(self) -> Strategy:
        rule = rule_name(self.config.strategy)
        if rule is not None:
            return RuleStrategy(rule)
        return LLMStrategy(await self.assistant.get(), self.config.temperature, self.config.extra_tokens)

    async def Negatives(
        self, request: generator_pb2.NegativesRequest, context: grpc.aio.ServicerContext
    ) -> generator_pb2.NegativesResponse:
        tasks = [NegativeTask(i.id, i.question, i.reference, i.positive) for i in request.items]
        try:
            outcomes = await make_negatives(tasks, await self._strategy(), self.verify, self.config.attempts)
        except (AssistantError, ServiceUnavailable) as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        return generator_pb2.NegativesResponse(
            results=[
                generator_pb2.NegativeResult(
                    id=o.id, negative=o.negative, attempts=o.attempts, valid=o.valid, reason=o.reason,
                    rejections=o.rejections,
                )
                for o in outcomes
            ]
        )

    async def Judge(self, request: generator_pb2.JudgeRequest, context: grpc.aio.ServicerContext) -> generator_pb2.JudgeResponse:
        tasks = [JudgeTask(i.question, i.reference, i.completion) for i in request.items]
        try:
            verdicts = await judge(
                tasks, await self.assistant.get(), self.config.judge_temperature, self.config.judge_max_tokens,
                self.config.judge_ask_verdict,
            )
        except AssistantError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        return generator_pb2.JudgeResponse(
            results=[generator_pb2.JudgeResult(verdict=v, raw=raw)
                     for v, raw in verdicts]
        )


async def create_service(config: CooperConfig) -> GrpcService:
    cfg = config.generator
    address = config.verifier.server.address
    if not address:
        raise ConfigError(
            "the generator verifies every negative with the verifier service: set verifier.server.address=HOST:PORT "
            "(start one with `cooper serve verifier`)"
        )
    verifier = VerifierClient(address, config.verifier.server, config.security)
    assistant = LazyAssistant(cfg)
    if cfg.strategy == "llm":
        await assistant.get()

    def add_servicers(server: grpc.aio.Server) -> list[str]:
        servicer = GeneratorServicer(cfg, assistant, RemoteVerifier(verifier))
        generator_pb2_grpc.add_GeneratorServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    async def on_stop() -> None:
        await assistant.close()
        verifier.close()

    service = GrpcService("generator", cfg.server, add_servicers, on_stop, config.security)
    service.ready_info.update(strategy=cfg.strategy, verifier=address)
    return service
