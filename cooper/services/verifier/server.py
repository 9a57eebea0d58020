"""gRPC front of the verifier: translates messages to and from the pool; no verification logic here."""

from __future__ import annotations

import asyncio

import grpc

from cooper.config import CooperConfig
from cooper.protos.verifier.v1 import verifier_pb2, verifier_pb2_grpc
from cooper.runtime.server import GrpcService
from cooper.services.verifier.pool import PoolLost, VerifierPool

SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, pool: VerifierPool):
        self.pool = pool

    async def Verify(self, request: verifier_pb2.VerifyRequest, context: grpc.aio.ServicerContext) -> verifier_pb2.VerifyResponse:
        items = [(item.completion, item.reference) for item in request.items]
        try:
            # A caller that goes away cancels this await, which cancels the pool's future: the pool drops the
            # batch's queued chunks and discards its results (pool.py).
            checks = await asyncio.wrap_future(self.pool.submit(items))
        except PoolLost as err:  # the service is stopping to be restarted; the client retries UNAVAILABLE
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        return verifier_pb2.VerifyResponse(
            results=[
                verifier_pb2.VerifyResult(
                    id=item.id, verdict=int(c.verdict), extracted=c.extracted, ms=c.ms, detail=c.detail
                )
                for item, c in zip(request.items, checks, strict=True)
            ]
        )


async def create_service(config: CooperConfig) -> GrpcService:
    cfg = config.verifier
    pool = await asyncio.to_thread(VerifierPool, cfg.workers, cfg.timeout_s, cfg.chunk_size, cfg.max_chars,
                                    cfg.answer)
    loop = asyncio.get_running_loop()

    def add_servicers(server: grpc.aio.Server) -> list[str]:
        verifier_pb2_grpc.add_VerifierServicer_to_server(VerifierServicer(pool), server)
        return [SERVICE_NAME]

    async def on_stop() -> None:
        await asyncio.to_thread(pool.close)

    service = GrpcService("verifier", cfg.server, add_servicers, on_stop, config.security)
    service.ready_info["workers"] = pool.workers
    # No slot left means no capacity: stop (health NOT_SERVING) and exit non-zero, so that the supervisor restarts
    # the service; a health check that still said SERVING would leave every later call waiting for its deadline.
    pool.on_lost = lambda reason: loop.call_soon_threadsafe(service.fail, reason)
    return service
