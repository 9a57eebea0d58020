"""The client side shared by all services: one channel, a deadline per call, retries on UNAVAILABLE only.

Only UNAVAILABLE is retried: it means the call never reached a server (starting, restarting, moved), so trying
again is safe; any other status is the server's answer and is raised at once.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cooper.config import ServerConfig
from cooper.runtime.server import grpc_options


class ServiceUnavailable(ConnectionError):
    """A service could not be reached within its retries; the message says which and where."""


class ServiceClient:
    """Base of the per-service clients: owns the channel and the retry policy."""

    service_name = ""

    def __init__(self, address: str, config: ServerConfig | None = None):
        self.address = address
        self.config = config or ServerConfig()
        # round_robin: a DNS name with several replicas behind it (a headless Service) gets calls spread over all.
        options = [*grpc_options(self.config.max_message_mb), ("grpc.lb_policy_name", "round_robin")]
        self.channel = grpc.insecure_channel(address, options=options)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    def call(self, method: Any, request: Any, deadline_s: float | None = None) -> Any:
        """Call a stub method with the configured deadline, retrying with backoff while UNAVAILABLE."""
        delay = self.config.retry_backoff_s
        timeout = deadline_s or self.config.deadline_s
        for attempt in range(self.config.retries + 1):
            try:
                return method(request, timeout=timeout)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                if attempt == self.config.retries:
                    raise ServiceUnavailable(
                        f"{self.service_name or 'service'} at {self.address} is unavailable after "
                        f"{attempt + 1} tries: {err.details()}"
                    ) from err
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def healthy(self, timeout_s: float = 1.0) -> bool:
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(service=self.service_name), timeout=timeout_s)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the health service says SERVING; raise ServiceUnavailable after timeout_s."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.healthy(timeout_s=min(1.0, max(0.05, end - time.monotonic()))):
                return
            time.sleep(0.1)
        raise ServiceUnavailable(f"{self.service_name or 'service'} at {self.address} not healthy after {timeout_s:.0f} s")

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
