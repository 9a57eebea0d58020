"""`python -m cooper.runtime.healthcheck HOST:PORT`: exit 0 when the gRPC health service there says SERVING.

For container health checks (Docker HEALTHCHECK, compose `healthcheck`), where no grpc_health_probe binary is
installed. Kubernetes uses its native `grpc:` probes instead. With `--ready-file PATH` instead of an address it
checks 127.0.0.1 at the port that `cooper serve --ready-file PATH` recorded, so one image-level HEALTHCHECK works
for whichever service the container runs. Exit codes: 0 SERVING, 1 anything else (one line on stderr says what).

TLS: the check speaks TLS as the service's own clients do, from the same `COOPER_SECURITY__*` environment the
container has (the health service needs no token). With `--ready-file` and a `server.health_port`, it checks that
plaintext health port instead, which needs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cooper.config import SecurityConfig, env_overrides
from cooper.runtime.security import secure_channel


def check(address: str, service: str = "", timeout_s: float = 3.0,
          security: SecurityConfig | None = None) -> tuple[bool, str]:
    """(serving, what was seen) for the health of `service` ("" = the whole server) at `address`, over TLS when
    `security` says so."""
    with secure_channel(address, security or SecurityConfig(), []) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as err:
            return False, f"{address}: {err.code().name} {err.details() or ''}".rstrip()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def address_from_ready_file(path: str) -> tuple[str, bool]:
    """(127.0.0.1:<port>, whether it is the plaintext health port) from the JSON that `cooper serve --ready-file`
    writes once the service serves: the health port when it has one, else the gRPC port."""
    data = json.loads(Path(path).read_text())
    if data.get("health_port"):
        return f"127.0.0.1:{int(data['health_port'])}", True
    return f"127.0.0.1:{int(data['grpc_port'])}", False


def security_from_environment() -> SecurityConfig:
    """The `security` section from COOPER_SECURITY__* variables, the ones the service in this container reads."""
    return SecurityConfig.model_validate(env_overrides(os.environ).get("security", {}))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cooper.runtime.healthcheck", description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("address", nargs="?", help="HOST:PORT of a gRPC server")
    target.add_argument("--ready-file", help="check the port recorded in this `cooper serve --ready-file` file")
    parser.add_argument("--service", default="", help="health of this service name (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)")
    args = parser.parse_args(argv)
    address, plaintext = args.address, False
    if args.ready_file:
        try:
            address, plaintext = address_from_ready_file(args.ready_file)
        except (OSError, ValueError, KeyError) as err:
            # Not written yet: the service is still loading its model (or was started without --ready-file).
            print(f"unhealthy: no usable ready file {args.ready_file} ({err}); is `cooper serve` running with "
                  f"--ready-file {args.ready_file}?", file=sys.stderr)
            return 1
    security = SecurityConfig() if plaintext else security_from_environment()
    serving, seen = check(address, args.service, args.timeout, security)
    if not serving:
        print(f"unhealthy: {seen}", file=sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
