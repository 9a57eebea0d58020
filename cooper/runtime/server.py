"""The gRPC server runtime shared by all services.

One `grpc.aio` server per service with the standard health service, reflection, Prometheus metrics on their own
HTTP port, the max message size from config, and a graceful stop: on SIGTERM or SIGINT the health status turns
NOT_SERVING, new calls are refused, in-flight calls get `grace_s` to finish, then the service's own shutdown hook
runs (worker pools, checkpoints). Services plug in with `add_servicers(server) -> [full service names]`.

With `security` (cooper/runtime/security.py) the port serves TLS and every RPC but health and reflection needs the
shared token; `server.health_port` adds a plaintext port with the health service alone, for probes without TLS.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cooper.config import SecurityConfig, ServerConfig
from cooper.runtime.files import write_atomically
from cooper.runtime.security import TokenServerInterceptor, server_credentials

log = logging.getLogger("cooper.runtime")

RPC_SECONDS = prometheus_client.Histogram(
    "cooper_rpc_seconds", "Time spent in a gRPC method", ["service", "method", "code"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 120, 600),
)
RPC_IN_FLIGHT = prometheus_client.Gauge("cooper_rpc_in_flight", "gRPC calls being served", ["service"])


def grpc_options(max_message_mb: int) -> list[tuple[str, Any]]:
    size = max_message_mb * 1024 * 1024
    return [("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size)]


def connection_age_grace_ms(deadline_s: float) -> int:
    """How long a call may go on after its connection ages out: as long as a client waits on any call."""
    return max(30_000, int(deadline_s * 1000))


class _MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times every unary call by method and status code."""

    def __init__(self, service: str):
        self.service = service

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        inner = handler.unary_unary
        service = self.service

        async def timed(request, context):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            RPC_IN_FLIGHT.labels(service).inc()
            code = "OK"
            try:
                return await inner(request, context)
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except Exception:
                code = str(context.code() or grpc.StatusCode.UNKNOWN).rsplit(".", 1)[-1]
                raise
            finally:
                RPC_IN_FLIGHT.labels(service).dec()
                RPC_SECONDS.labels(service, method, code).observe(time.perf_counter() - start)

        return grpc.unary_unary_rpc_method_handler(
            timed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class GrpcService:
    """A running service: `await start()`, then `await wait_for_signal()` or `await stop()`."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        add_servicers: Callable[[grpc.aio.Server], list[str]],
        on_stop: Callable[[], Awaitable[None]] | None = None,
        security: SecurityConfig | None = None,
    ):
        self.name = name
        self.config = config
        self.security = security or SecurityConfig()
        self._add_servicers = add_servicers
        self._on_stop = on_stop
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self.health_port: int | None = None
        self._service_names: list[str] = []
        self._stopped = asyncio.Event()
        self.port: int = 0
        self.metrics_port: int | None = None
        self.ready_info: dict[str, Any] = {}
        """Extra facts for the ready file, e.g. the reward service's HTTP port."""
        self.failure: str | None = None
        """Why the service stopped itself (see fail()); None while healthy or after a signal."""
        self._stop_requested = asyncio.Event()
        self._serving = True

    async def start(self) -> int:
        # Connections are recycled every minute so that clients re-resolve DNS and spread over new replicas
        # (the verifier's HPA adds pods; a long-lived channel would otherwise stick to the old ones). A call under
        # way when its connection ages out may finish for as long as a client waits on one (deadline_s): with a
        # shorter grace, any call over a minute and a half failed as UNAVAILABLE and was retried from the start,
        # forever for a long one (the initial evaluation of a 135M-parameter policy on a CPU takes minutes).
        options = [*grpc_options(self.config.max_message_mb), ("grpc.max_connection_age_ms", 60_000),
                   ("grpc.max_connection_age_grace_ms", connection_age_grace_ms(self.config.deadline_s))]
        # The metrics interceptor comes first so that refused calls are counted too (code UNAUTHENTICATED).
        interceptors: list[grpc.aio.ServerInterceptor] = [_MetricsInterceptor(self.name)]
        if self.security.token is not None:
            interceptors.append(TokenServerInterceptor(self.name, self.security.token.get_secret_value()))
        server = grpc.aio.server(interceptors=interceptors, options=options)
        self._service_names = self._add_servicers(server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            [*self._service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.port = self._bind(server)
        if self.config.health_port is not None:
            self._health_server = await self._start_health_server()
        if self.config.metrics_port is not None:
            metrics_server, _ = prometheus_client.start_http_server(self.config.metrics_port, addr=self.config.host)
            self.metrics_port = metrics_server.server_port
        await server.start()
        self._server = server
        for service_name in ["", *self._service_names]:
            await self._health.set(service_name, health_pb2.HealthCheckResponse.SERVING)
        log.info("%s serving gRPC on %s:%d (%s, %s%s)", self.name, self.config.host, self.port,
                 "TLS" if self._tls else "plaintext", "token required" if self.security.token else "no token",
                 f", plaintext health on {self.health_port}" if self.health_port else "")
        return self.port

    @property
    def _tls(self) -> bool:
        return self.security.tls_cert is not None

    def _bind(self, server: grpc.aio.Server) -> int:
        """Bind the service port, with TLS when a certificate is configured; the bound port (0 picks a free one)."""
        address = f"{self.config.host}:{self.config.port}"
        credentials = server_credentials(self.security)
        port = server.add_insecure_port(address) if credentials is None else \
            server.add_secure_port(address, credentials)
        if port == 0:
            raise OSError(f"{self.name}: cannot bind gRPC port {address} (in use?)")
        return port

    async def _start_health_server(self) -> grpc.aio.Server:
        """A plaintext server with only the health service (the same servicer, so it reports the same status), for
        probes that cannot speak TLS or send a token. Nothing else is registered on it."""
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = f"{self.config.host}:{self.config.health_port}"
        self.health_port = server.add_insecure_port(address)
        if self.health_port == 0:
            raise OSError(f"{self.name}: cannot bind the health port {address} (server.health_port; in use?)")
        await server.start()
        return server

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new calls, let in-flight ones finish within `grace` seconds, then run the shutdown hook."""
        if self._server is None or self._stopped.is_set():
            return
        self._stopped.set()
        await self._health.enter_graceful_shutdown()
        await self._server.stop(self.config.grace_s if grace is None else grace)
        if self._health_server is not None:
            await self._health_server.stop(0)
        if self._on_stop is not None:
            await self._on_stop()
        log.info("%s stopped", self.name)

    def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING on the health service (readiness) while running; e.g. a stale replica."""
        if self._server is None or self._stopped.is_set() or serving == self._serving:
            return
        self._serving = serving
        log.warning("%s: health is now %s", self.name, "SERVING" if serving else "NOT_SERVING")
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service_name in ["", *self._service_names]:
            asyncio.get_running_loop().create_task(self._health.set(service_name, status))

    def fail(self, reason: str) -> None:
        """The service cannot serve any more (e.g. a process it depends on died): stop as on SIGTERM, and exit
        non-zero, so that a supervisor (Kubernetes, compose's restart policy, the local orchestrator) restarts it."""
        if self.failure is None:
            log.error("%s: %s; stopping", self.name, reason)
            self.failure = reason
        self._stop_requested.set()

    async def wait_for_signal(self) -> None:
        """Serve until SIGTERM or SIGINT (or fail()), then stop gracefully."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop_requested.set)
        await self._stop_requested.wait()
        if self.failure is None:
            log.info("%s: signal received, draining for up to %.1f s", self.name, self.config.grace_s)
        await self.stop()

    def write_ready_file(self, path: str | os.PathLike[str], **extra: Any) -> None:
        """Write the bound ports as JSON (atomically) so a parent process knows where the service listens."""
        data = {"service": self.name, "pid": os.getpid(), "grpc_port": self.port, "metrics_port": self.metrics_port,
                "health_port": self.health_port}
        data.update(self.ready_info)
        data.update(extra)
        write_atomically(path, json.dumps(data))


def run_service(
    create_service: Callable[[Any], Awaitable[GrpcService]], config: Any, ready_file: str | None = None
) -> int:
    """Entry point of `cooper serve NAME`: build the service, serve until SIGTERM/SIGINT, drain; exit 0, or 1 when
    the service stopped itself because it could not serve (GrpcService.fail)."""

    async def main() -> int:
        service = await create_service(config)
        await service.start()
        # Everything built so far (torch, transformers, the tokenizer, the apps) lives as long as the process: out of
        # the collector's reach, a full collection scans only what serving allocates. Before this, each full
        # collection of the reward service stalled every request for 150-330 ms on a 2-vCPU machine, its p99.
        gc.collect()
        gc.freeze()
        if ready_file:
            service.write_ready_file(ready_file, gc_frozen_objects=gc.get_freeze_count())
        await service.wait_for_signal()
        return 0 if service.failure is None else 1

    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    # faster I/O, above all for the reward service's embedded uvicorn; grpc.aio runs on it
    return uvloop.run(main())
