"""Who may call a Cooper service: the shared bearer token and TLS, for servers and clients (config `security`).

The token is checked by a server interceptor on every RPC except the health service and reflection, which probes
and `grpcurl` need without a secret (all they tell is SERVING and the method list). Clients add the token through a
channel interceptor rather than gRPC call credentials, because call credentials refuse plaintext channels and the
token alone (no TLS) is a supported setting on a private network. Left out on purpose: per-service tokens and
token rotation (restart with the new token); a process that holds the token may call every service.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from cooper.config import SecurityConfig

AUTH_HEADER = "authorization"
# Full method names start with "/<package>.<Service>/": these stay callable without the token.
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                 "/grpc.reflection.v1.ServerReflection/")


def _read(path: str, what: str) -> bytes:
    """The bytes of a PEM file; a missing one is named with the config key that points at it."""
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise FileNotFoundError(f"security.{what} = {path}: cannot read it ({err.strerror})") from None


def server_credentials(security: SecurityConfig) -> grpc.ServerCredentials | None:
    """TLS credentials of a server (None: plaintext); with tls_ca, client certificates are required (mTLS)."""
    if security.tls_cert is None or security.tls_key is None:
        return None
    pair = [(_read(security.tls_key, "tls_key"), _read(security.tls_cert, "tls_cert"))]
    ca = _read(security.tls_ca, "tls_ca") if security.tls_ca else None
    return grpc.ssl_server_credentials(pair, root_certificates=ca, require_client_auth=ca is not None)


def channel_credentials(security: SecurityConfig) -> grpc.ChannelCredentials | None:
    """TLS credentials of a client (None: plaintext). The client certificate is sent when a server asks (mTLS)."""
    if not security.tls:
        return None
    ca = _read(security.tls_ca, "tls_ca") if security.tls_ca else None
    key = _read(security.tls_key, "tls_key") if security.tls_key else None
    cert = _read(security.tls_cert, "tls_cert") if security.tls_cert else None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def channel_options(security: SecurityConfig) -> list[tuple[str, Any]]:
    """Channel options for TLS: the name checked in the server's certificate, when it is not the address's host."""
    if security.tls and security.tls_server_name:
        return [("grpc.ssl_target_name_override", security.tls_server_name)]
    return []


def token_metadata(security: SecurityConfig) -> tuple[str, str] | None:
    """The metadata pair every client call carries, or None without a token."""
    if security.token is None:
        return None
    return (AUTH_HEADER, f"Bearer {security.token.get_secret_value()}")


class _CallDetails(grpc.ClientCallDetails):
    """ClientCallDetails is abstract; this is the plain record the interceptor hands on."""

    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):  # type: ignore[no-untyped-def]
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


class TokenClientInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Adds `authorization: Bearer <token>` to every unary call of a (sync) channel."""

    def __init__(self, header: tuple[str, str]):
        self._header = header

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        metadata = [*(details.metadata or []), self._header]
        return continuation(_CallDetails(details.method, details.timeout, metadata, details.credentials,
                                         details.wait_for_ready, details.compression), request)


def secure_channel(address: str, security: SecurityConfig, options: list[tuple[str, Any]]) -> grpc.Channel:
    """A channel to `address` with TLS and the token as configured."""
    options = [*options, *channel_options(security)]
    credentials = channel_credentials(security)
    channel = grpc.insecure_channel(address, options) if credentials is None else \
        grpc.secure_channel(address, credentials, options)
    header = token_metadata(security)
    return channel if header is None else grpc.intercept_channel(channel, TokenClientInterceptor(header))


def bearer_token(metadata: Any) -> str | None:
    """The token of an `authorization: Bearer <token>` entry in invocation metadata, else None."""
    for key, value in metadata or ():
        if key == AUTH_HEADER and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer "):]
    return None


class TokenServerInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every RPC outside OPEN_SERVICES whose bearer token is missing or wrong, with UNAUTHENTICATED."""

    def __init__(self, service: str, token: str):
        self._expected = token.encode()
        self._service = service

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        method = handler_call_details.method
        if method.startswith(OPEN_SERVICES):
            return await continuation(handler_call_details)
        given = bearer_token(handler_call_details.invocation_metadata)
        # compare_digest: the time taken must not tell how much of a guess was right.
        if given is not None and hmac.compare_digest(given.encode(), self._expected):
            return await continuation(handler_call_details)
        reason = "no `authorization: Bearer` metadata" if given is None else "a wrong bearer token"
        return _refusal(f"the {self._service} service requires the shared token and got {reason}: set "
                        f"security.token (COOPER_SECURITY__TOKEN) to the services' token")


def _refusal(message: str) -> grpc.RpcMethodHandler:
    """A handler that answers UNAUTHENTICATED without reading the request (every Cooper method is unary)."""

    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    identity: Callable[[bytes], bytes] = lambda raw: raw  # noqa: E731
    return grpc.unary_unary_rpc_method_handler(refuse, request_deserializer=identity, response_serializer=identity)
