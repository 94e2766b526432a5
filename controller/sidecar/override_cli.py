"""Pin a workload class to an arm ("off" turns speculation off for it), or --clear
the pin. Needs admin.enabled on the sidecar; --token-file when it requires a token.

The sidecar's address: --address, else $SPECCTL_SERVER_LISTEN, else
unix:///tmp/specctl.sock; over TLS, --tls-ca-file (and, for mutual TLS,
--tls-cert-file and --tls-key-file).
"""

from __future__ import annotations

import argparse
import os
import sys

from specctl.sidecar.client_cli import add_common_arguments, fail, open_channel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("workload_class", metavar="CLASS", help="the workload class to pin")
    parser.add_argument(
        "arm", metavar="ARM", nargs="?", help='"off" or "<drafter>/k=<K>", e.g. ngram/k=4'
    )
    parser.add_argument("--clear", action="store_true", help="remove the class's override")
    parser.add_argument(
        "--token-file",
        default=os.environ.get("SPECCTL_ADMIN_TOKEN_FILE", ""),
        help="file with the sidecar's admin bearer token (default: $SPECCTL_ADMIN_TOKEN_FILE)",
    )


def run(args: argparse.Namespace) -> int:
    import grpc

    from specctl.api import pb, pb_grpc

    if args.clear == (args.arm is not None):
        print("specctl override: give either an ARM or --clear", file=sys.stderr)
        return 2
    metadata = []
    if args.token_file:
        with open(args.token_file) as f:
            metadata.append(("authorization", f"Bearer {f.read().strip()}"))
    sidecar = open_channel("override", args)
    if sidecar is None:
        return 2
    with sidecar:
        try:
            response = pb_grpc.SpecControllerAdminStub(sidecar).SetOverride(
                pb.SetOverrideRequest(workload_class=args.workload_class, arm=args.arm or ""),
                timeout=args.timeout,
                metadata=metadata,
            )
        except grpc.RpcError as exc:
            return fail("override", exc)
    what = "cleared" if args.clear else f"pinned to {args.arm}"
    print(f"{args.workload_class}: {what}; policy version {response.policy_version}")
    return 0
