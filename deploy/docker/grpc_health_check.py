#!/usr/bin/env python3
"""Exit 0 when a gRPC server answers grpc.health.v1 Check with SERVING.

Kubernetes' own gRPC probes need a TCP port; the sidecar layout serves specctl
on a unix socket only, so its pod probes through this script instead:

    specctl-health unix:///var/run/specctl/specctl.sock --service specctl.v1.SpecController
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("address", help="unix:///path.sock or host:port")
    parser.add_argument("--service", default="", help="service name; empty: the whole server")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds")
    args = parser.parse_args(argv)
    with grpc.insecure_channel(args.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"{args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"{args.address} {args.service or '(server)'}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
