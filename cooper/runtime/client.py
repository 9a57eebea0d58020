"""The client side shared by all services: one channel, a deadline per call, retries on UNAVAILABLE only.

Only UNAVAILABLE is retried: the server is starting, restarting or moved (or died under the call), and every
Cooper call is safe to repeat (Train and Update carry idempotency keys, the rest change nothing); any other
status is the server's answer and is raised at once. Retries go on for a time budget
(`unavailable_timeout_s`, minutes by default), not a count, so that a service that crashed and is being
restarted from its checkpoint, which can take minutes for a GPU model, is waited for instead of failing the run.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cooper.config import SecurityConfig, ServerConfig
from cooper.runtime.security import secure_channel
from cooper.runtime.server import grpc_options


class ServiceUnavailable(ConnectionError):
    """A service could not be reached within its retry budget; the message says which, where and for how long."""


class ServiceClient:
    """Base of the per-service clients: owns the channel and the retry policy."""

    service_name = ""

    def __init__(self, address: str, config: ServerConfig | None = None, security: SecurityConfig | None = None):
        """`security`: TLS and the token (config `security`); None connects in plaintext without a token."""
        self.address = address
        self.config = config or ServerConfig()
        self.security = security or SecurityConfig()
        # round_robin: a DNS name with several replicas behind it (a headless Service) gets calls spread over all.
        # The channel's own reconnection backoff grows to 120 s by default; capped here so that a restarted
        # service is reconnected within retry_backoff_max_s.
        reconnect_ms = int(self.config.retry_backoff_max_s * 1000)
        options = [*grpc_options(self.config.max_message_mb), ("grpc.lb_policy_name", "round_robin"),
                   ("grpc.initial_reconnect_backoff_ms", min(1000, reconnect_ms)),
                   ("grpc.max_reconnect_backoff_ms", reconnect_ms)]
        self.channel = secure_channel(address, self.security, options)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._closed = False

    def call(self, method: Any, request: Any, deadline_s: float | None = None) -> Any:
        """Call a stub method with the configured deadline; while it fails with UNAVAILABLE, call again with
        exponential backoff until `unavailable_timeout_s` has passed, then raise ServiceUnavailable."""
        delay, budget = self.config.retry_backoff_s, self.config.unavailable_timeout_s
        timeout = deadline_s or self.config.deadline_s
        give_up = time.monotonic() + budget
        tries = 0
        while True:
            tries += 1
            try:
                return method(request, timeout=timeout)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                left = give_up - time.monotonic()
                if left <= 0 or self._closed:
                    raise ServiceUnavailable(
                        f"the {self.short_name} service at {self.address} stayed unavailable for "
                        f"{budget:g} s ({tries} tries; server.unavailable_timeout_s): {err.details()}"
                        f"{self._tls_hint(err.details() or '')}"
                    ) from err
                time.sleep(min(delay, left))
                delay = min(delay * 2, self.config.retry_backoff_max_s)

    def _tls_hint(self, details: str) -> str:
        """What to check when the connection failed in the TLS handshake (the details name only OpenSSL's error)."""
        if "ssl" not in details.lower() and "handshake" not in details.lower():
            return ""
        if not self.security.tls:
            return "; the server speaks TLS: set security.tls_ca (and tls_cert/tls_key if it wants a client certificate)"
        return ("; TLS failed: does security.tls_ca sign the server's certificate, does that name the host you "
                "connect to (or security.tls_server_name), and does the server want a client certificate "
                "(security.tls_cert/tls_key)?")

    @property
    def short_name(self) -> str:
        """"reward" for cooper.reward.v1.Reward: the name users know the service by."""
        parts = self.service_name.split(".")
        return parts[1] if len(parts) >= 3 else (self.service_name or "unnamed")

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
        raise ServiceUnavailable(f"the {self.short_name} service at {self.address} not healthy after {timeout_s:.0f} s")

    def close(self) -> None:
        """Close the channel; a call waiting for the service to come back gives up at its next try."""
        self._closed = True
        self.channel.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
