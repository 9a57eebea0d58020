"""The reward service's refusals and what each transport answers: one table, read by gRPC (server.py) and HTTP
(serving/handler.py), so that the two cannot answer the same refusal differently.

A refusal is an exception raised by the service's core (batcher.py, runner.py, replica.py) that says the request
was not served and why; each row gives its gRPC status code, its HTTP status and the `type` of the HTTP error schema
(protocol.ErrorDetail). The message is the exception's own, on both transports. Any other exception is a bug and
reaches the transport's default (gRPC UNKNOWN, HTTP 500 "internal").
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from cooper.runtime.durability import UnjournaledUpdate
from cooper.services.reward.batcher import QueueFull, QueueTimeout, RequestTooLarge
from cooper.services.reward.replica import ReadOnlyReplica, ReplicaStale
from cooper.services.reward.runner import ModelUnavailable


@dataclass(frozen=True)
class Refusal:
    grpc_code: grpc.StatusCode
    http_status: int
    http_type: str
    retry_after_s: int | None = None
    """HTTP Retry-After when the exception carries no `retry_after_s` of its own."""


REFUSALS: dict[type[Exception], Refusal] = {
    # Clients retry UNAVAILABLE; a full queue is RESOURCE_EXHAUSTED, so a gRPC client backs off instead.
    QueueFull: Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, 503, "overloaded"),
    QueueTimeout: Refusal(grpc.StatusCode.UNAVAILABLE, 503, "overloaded", retry_after_s=1),
    RequestTooLarge: Refusal(grpc.StatusCode.INVALID_ARGUMENT, 413, "too_large"),
    ModelUnavailable: Refusal(grpc.StatusCode.UNAVAILABLE, 503, "model_unavailable"),
    # The service is stopping to restart from its journal (a journal write failed); a retry is applied once it is back.
    UnjournaledUpdate: Refusal(grpc.StatusCode.UNAVAILABLE, 503, "model_unavailable"),
    ReplicaStale: Refusal(grpc.StatusCode.UNAVAILABLE, 503, "stale"),
    # Only gRPC has Update and Save; 400 is FAILED_PRECONDITION's HTTP status in Google's API guide.
    ReadOnlyReplica: Refusal(grpc.StatusCode.FAILED_PRECONDITION, 400, "read_only"),
}

REFUSED = tuple(REFUSALS)
"""For `except REFUSED as err:`."""


def refusal(err: Exception) -> Refusal:
    """The row of `err` (one of REFUSED)."""
    return next(row for kind, row in REFUSALS.items() if isinstance(err, kind))


def retry_after_s(err: Exception) -> int | None:
    """The seconds a client should wait before retrying, None when it should not."""
    return getattr(err, "retry_after_s", refusal(err).retry_after_s)
