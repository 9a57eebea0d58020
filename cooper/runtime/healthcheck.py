"""`python -m cooper.runtime.healthcheck HOST:PORT`: exit 0 when the gRPC health service there says SERVING.

For container health checks (Docker HEALTHCHECK, compose `healthcheck`), where no grpc_health_probe binary is
installed. Kubernetes uses its native `grpc:` probes instead. With `--ready-file PATH` instead of an address it
checks 127.0.0.1 at the port that `cooper serve --ready-file PATH` recorded, so one image-level HEALTHCHECK works
for whichever service the container runs. Exit codes: 0 SERVING, 1 anything else (one line on stderr says what).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout_s: float = 3.0) -> tuple[bool, str]:
    """(serving, what was seen) for the health of `service` ("" = the whole server) at `address`."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as err:
            return False, f"{address}: {err.code().name} {err.details() or ''}".rstrip()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def address_from_ready_file(path: str) -> str:
    """127.0.0.1:<grpc_port> from the JSON that `cooper serve --ready-file` writes once the service serves."""
    data = json.loads(Path(path).read_text())
    return f"127.0.0.1:{int(data['grpc_port'])}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cooper.runtime.healthcheck", description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("address", nargs="?", help="HOST:PORT of a gRPC server")
    target.add_argument("--ready-file", help="check the port recorded in this `cooper serve --ready-file` file")
    parser.add_argument("--service", default="", help="health of this service name (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)")
    args = parser.parse_args(argv)
    address = args.address
    if args.ready_file:
        try:
            address = address_from_ready_file(args.ready_file)
        except (OSError, ValueError, KeyError) as err:
            # Not written yet: the service is still loading its model (or was started without --ready-file).
            print(f"unhealthy: no usable ready file {args.ready_file} ({err}); is `cooper serve` running with "
                  f"--ready-file {args.ready_file}?", file=sys.stderr)
            return 1
    serving, seen = check(address, args.service, args.timeout)
    if not serving:
        print(f"unhealthy: {seen}", file=sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
