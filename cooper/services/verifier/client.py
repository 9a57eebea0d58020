"""Client of the verifier service, for the orchestrator and the generator; speaks `messages`' dataclasses."""

from __future__ import annotations

from collections.abc import Sequence

from cooper.config import SecurityConfig, ServerConfig
from cooper.protos.verifier.v1 import verifier_pb2, verifier_pb2_grpc
from cooper.runtime.client import ServiceClient
from cooper.services.verifier.messages import Verdict, VerifyItem, VerifyResult, pair_items

__all__ = ["SERVICE_NAME", "Verdict", "VerifierClient", "VerifyItem", "VerifyResult"]

SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name


class VerifierClient(ServiceClient):
    service_name = SERVICE_NAME

    def __init__(self, address: str, config: ServerConfig | None = None, security: SecurityConfig | None = None):
        super().__init__(address, config, security)
        self.stub = verifier_pb2_grpc.VerifierStub(self.channel)

    def verify(self, items: Sequence[VerifyItem], deadline_s: float | None = None) -> list[VerifyResult]:
        """One result per item, in order."""
        request = verifier_pb2.VerifyRequest(items=[
            verifier_pb2.VerifyItem(id=i.id, completion=i.completion, reference=i.reference) for i in items
        ])
        reply = self.call(self.stub.Verify, request, deadline_s)
        return [VerifyResult(r.id, r.verdict, r.extracted, r.ms, r.detail) for r in reply.results]

    def verify_pairs(self, pairs: Sequence[tuple[str, str]], deadline_s: float | None = None) -> list[VerifyResult]:
        """Convenience: [(completion, reference)] -> results, ids are the positions."""
        return self.verify(pair_items(pairs), deadline_s)
