"""Client of the generator service, for the orchestrator (negatives) and the annotator (judge)."""

from __future__ import annotations

from collections.abc import Sequence

from cooper.config import SecurityConfig, ServerConfig
from cooper.protos.generator.v1 import generator_pb2, generator_pb2_grpc
from cooper.runtime.client import ServiceClient
from cooper.services.generator.judge import Judgment as Judgment  # the verdicts of JudgeResults, for callers

SERVICE_NAME = generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name

NegativeItem = generator_pb2.NegativeItem
NegativeResult = generator_pb2.NegativeResult
JudgeItem = generator_pb2.JudgeItem
JudgeResult = generator_pb2.JudgeResult


class GeneratorClient(ServiceClient):
    service_name = SERVICE_NAME

    def __init__(self, address: str, config: ServerConfig | None = None, security: SecurityConfig | None = None):
        super().__init__(address, config, security)
        self.stub = generator_pb2_grpc.GeneratorStub(self.channel)

    def negatives(
        self, items: Sequence[generator_pb2.NegativeItem], deadline_s: float | None = None
    ) -> list[generator_pb2.NegativeResult]:
        """One result per item, in order; `valid` says whether it holds a verified negative."""
        reply = self.call(self.stub.Negatives, generator_pb2.NegativesRequest(items=list(items)), deadline_s)
        return list(reply.results)

    def judge(
        self, items: Sequence[generator_pb2.JudgeItem], deadline_s: float | None = None
    ) -> list[generator_pb2.JudgeResult]:
        """One judgment (YES, NO or UNKNOWN, with the judge's raw reply) per item, in order."""
        reply = self.call(self.stub.Judge, generator_pb2.JudgeRequest(items=list(items)), deadline_s)
        return list(reply.results)
