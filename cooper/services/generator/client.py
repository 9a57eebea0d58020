"""Client of the generator service, for the orchestrator (negatives) and the annotator (judge); speaks
`messages`' dataclasses."""

from __future__ import annotations

from collections.abc import Sequence

from cooper.config import SecurityConfig, ServerConfig
from cooper.protos.generator.v1 import generator_pb2, generator_pb2_grpc
from cooper.runtime.client import ServiceClient
from cooper.services.generator.messages import JudgeItem, JudgeResult, Judgment, NegativeItem, NegativeResult

__all__ = ["SERVICE_NAME", "GeneratorClient", "JudgeItem", "JudgeResult", "Judgment", "NegativeItem",
           "NegativeResult"]

SERVICE_NAME = generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name


class GeneratorClient(ServiceClient):
    service_name = SERVICE_NAME

    def __init__(self, address: str, config: ServerConfig | None = None, security: SecurityConfig | None = None):
        super().__init__(address, config, security)
        self.stub = generator_pb2_grpc.GeneratorStub(self.channel)

    def negatives(self, items: Sequence[NegativeItem], deadline_s: float | None = None) -> list[NegativeResult]:
        """One result per item, in order; `valid` says whether it holds a verified negative."""
        request = generator_pb2.NegativesRequest(items=[
            generator_pb2.NegativeItem(id=i.id, question=i.question, reference=i.reference, positive=i.positive)
            for i in items
        ])
        reply = self.call(self.stub.Negatives, request, deadline_s)
        return [NegativeResult(r.id, r.negative, r.attempts, r.valid, r.reason, list(r.rejections))
                for r in reply.results]

    def judge(self, items: Sequence[JudgeItem], deadline_s: float | None = None) -> list[JudgeResult]:
        """One judgment (YES, NO or UNKNOWN, with the judge's raw reply) per item, in order."""
        request = generator_pb2.JudgeRequest(items=[
            generator_pb2.JudgeItem(question=i.question, reference=i.reference, completion=i.completion)
            for i in items
        ])
        reply = self.call(self.stub.Judge, request, deadline_s)
        return [JudgeResult(r.verdict, r.raw) for r in reply.results]
