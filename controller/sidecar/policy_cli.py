"""Print the sidecar's current policy: per workload class and load bucket, the
distribution over arms and why. --json prints the Policy message.

The sidecar's address: --address, else $SPECCTL_SERVER_LISTEN, else
unix:///tmp/specctl.sock; over TLS, --tls-ca-file (and, for mutual TLS,
--tls-cert-file and --tls-key-file).
"""

from __future__ import annotations

import argparse

from specctl.sidecar.client_cli import add_common_arguments, fail, open_channel, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the Policy message as JSON")


def run(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf import json_format

    from specctl.api import pb, pb_grpc

    sidecar = open_channel("policy", args)
    if sidecar is None:
        return 2
    with sidecar:
        try:
            policy = pb_grpc.SpecControllerStub(sidecar).GetPolicy(
                pb.GetPolicyRequest(), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            return fail("policy", exc)
    if args.json:
        print(json_format.MessageToJson(policy, preserving_proto_field_name=True))
        return 0
    print(
        f"policy {policy.policy_name} version {policy.version}; fallback {policy.fallback_arm}; "
        f"load buckets <= {list(policy.load_bucket_bounds)}; default class {policy.default_class}"
    )
    rows = [["CLASS", "BUCKET", "ARMS", "WHY"]]
    for e in policy.entries:
        arms = " ".join(
            f"{a}={p:.3f}"
            for a, p in sorted(zip(e.arms, e.probabilities, strict=True), key=lambda ap: -ap[1])
        )
        rows.append([e.workload_class, str(e.load_bucket), arms, e.explanation])
    print(table(rows))
    return 0
