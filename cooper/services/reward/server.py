"""gRPC front of the reward service, and `cooper serve reward`: gRPC and HTTP in one process, one event loop.

Only message translation here; the logic is in service.py, and the status code of every refusal in errors.py (the
table HTTP uses too). A stale replica that still serves (reward.replica.on_stale=serve) answers Score with
trailing metadata `cooper-stale`.
"""

from __future__ import annotations

import logging

import grpc

from cooper.config import CooperConfig
from cooper.protos.common.v1 import common_pb2
from cooper.protos.reward.v1 import reward_pb2, reward_pb2_grpc
from cooper.runtime.ledger import SavedCheckpoint, idempotency_key
from cooper.runtime.server import GrpcService
from cooper.services.reward.errors import REFUSED, refusal
from cooper.services.reward.items import PreferencePair, ScoreItem, ScoreResult, UpdateResult
from cooper.services.reward.runner import ProcessRunner
from cooper.services.reward.service import RewardService
from cooper.services.reward.serving.http import HttpServer, create_app, start_http

log = logging.getLogger("cooper.reward")

SERVICE_NAME = reward_pb2.DESCRIPTOR.services_by_name["Reward"].full_name


class RewardServicer(reward_pb2_grpc.RewardServicer):
    def __init__(self, service: RewardService):
        self.service = service

    async def Score(self, request: reward_pb2.ScoreRequest, context: grpc.aio.ServicerContext) -> reward_pb2.ScoreResponse:
        items = [ScoreItem(i.question, i.reference, i.completion) for i in request.items]
        result: ScoreResult | None = None
        try:
            staleness = self.service.check_fresh()
            if staleness is not None and staleness.stale:
                context.set_trailing_metadata((("cooper-stale", staleness.describe()),))
            result = await self.service.score(items)
        except REFUSED as err:
            await context.abort(refusal(err).grpc_code, str(err))
        assert result is not None
        return reward_pb2.ScoreResponse(
            scores=[reward_pb2.Score(score=s, logit=x) for s, x in zip(result.scores, result.logits, strict=True)],
            version=result.version,
        )

    async def Update(self, request: reward_pb2.UpdateRequest, context: grpc.aio.ServicerContext) -> reward_pb2.UpdateResponse:
        pairs = [PreferencePair(p.question, p.reference, p.positive, p.negative) for p in request.pairs]
        result: UpdateResult | None = None
        try:
            result = await self.service.update(idempotency_key(request.key.run_id, request.key.step), pairs,
                                               request.optimizer_steps)
        except REFUSED as err:
            await context.abort(refusal(err).grpc_code, str(err))
        assert result is not None
        return reward_pb2.UpdateResponse(
            loss=result.loss, grad_norm=result.grad_norm, pair_accuracy_before=result.pair_accuracy_before,
            pair_accuracy_after=result.pair_accuracy_after, version=result.version, skipped=result.skipped,
            replayed=result.replayed,
        )

    async def Info(self, request: reward_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> reward_pb2.InfoResponse:
        info = self.service.info()
        return reward_pb2.InfoResponse(model=info.model, version=info.version, parameters=info.parameters,
                                       device=info.device, last_key=info.last_key, checkpoint=info.checkpoint)

    async def Save(self, request: common_pb2.SaveRequest, context: grpc.aio.ServicerContext) -> common_pb2.SaveResponse:
        saved: SavedCheckpoint | None = None
        try:
            saved = await self.service.save(request.tag)
        except REFUSED as err:
            await context.abort(refusal(err).grpc_code, str(err))
        assert saved is not None
        return common_pb2.SaveResponse(path=saved.path, version=saved.version)


async def create_service(config: CooperConfig) -> GrpcService:
    """Load VerifyRM (latest checkpoint first), start the batcher and the HTTP API; the CLI starts gRPC."""
    cfg = config.reward
    service = await RewardService.create(cfg)
    http: HttpServer | None = None
    if cfg.http.enabled:
        try:
            http = await start_http(create_app(cfg, service), cfg.http.host, cfg.http.port)
        except BaseException:
            await service.stop()
            raise
        log.info("reward serving HTTP on %s:%d", cfg.http.host, http.port)

    def add_servicers(server: grpc.aio.Server) -> list[str]:
        reward_pb2_grpc.add_RewardServicer_to_server(RewardServicer(service), server)
        return [SERVICE_NAME]

    async def on_stop() -> None:
        # gRPC has drained by now; HTTP drains next, then unsaved updates are checkpointed.
        if http is not None:
            await http.stop()
        await service.stop()

    grpc_service = GrpcService("reward", cfg.server, add_servicers, on_stop, config.security)
    if http is not None:
        grpc_service.ready_info["http_port"] = http.port
    grpc_service.ready_info["version"] = service.version
    grpc_service.ready_info["role"] = cfg.role
    service.on_readiness = grpc_service.set_serving
    # Without its model the service is useless: stop and exit non-zero, so that the supervisor restarts it from the
    # latest checkpoint (the gRPC health probe alone would keep answering SERVING).
    service.runner.on_exit = lambda: grpc_service.fail("the reward model process exited")
    service.batcher.on_loop_died = grpc_service.fail  # the same: a service that cannot score must be restarted
    if isinstance(service.runner, ProcessRunner):
        grpc_service.ready_info["model_pid"] = service.runner.process.pid
    return grpc_service
