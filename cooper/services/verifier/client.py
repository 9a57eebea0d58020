"""Client of the verifier service, for the orchestrator and the generator."""

from __future__ import annotations

from collections.abc import Sequence

from cooper.config import SecurityConfig, ServerConfig
from cooper.protos.verifier.v1 import verifier_pb2, verifier_pb2_grpc
from cooper.runtime.client import ServiceClient
from cooper.services.verifier.server import SERVICE_NAME
from cooper.services.verifier.verdict import Verdict as Verdict  # the verdicts of results, for callers

VerifyItem = verifier_pb2.VerifyItem
VerifyResult = verifier_pb2.VerifyResult


class VerifierClient(ServiceClient):
    service_name = SERVICE_NAME

    def __init__(self, address: str, config: ServerConfig | None = None, security: SecurityConfig | None = None):
        super().__init__(address, config, security)
        self.stub = verifier_pb2_grpc.VerifierStub(self.channel)

    def verify(self, items: Sequence[verifier_pb2.VerifyItem], deadline_s: float | None = None) -> list[verifier_pb2.VerifyResult]:
        """One result per item, in order."""
        reply = self.call(self.stub.Verify, verifier_pb2.VerifyRequest(items=list(items)), deadline_s)
        return list(reply.results)

    def verify_pairs(self, pairs: Sequence[tuple[str, str]], deadline_s: float | None = None) -> list[verifier_pb2.VerifyResult]:
        """Convenience: [(completion, reference)] -> results, ids are the positions."""
        items = [VerifyItem(id=str(i), completion=c, reference=r) for i, (c, r) in enumerate(pairs)]
        return self.verify(items, deadline_s)
