"""Print the evidence behind the sidecar's policy: per class, load bucket and arm,
the probability, the estimated goodput with its interval, and P(best).

The sidecar's address: --address, else $SPECCTL_SERVER_LISTEN, else
unix:///tmp/specctl.sock.
"""

from __future__ import annotations

import argparse

from controller.sidecar.client_cli import add_common_arguments, fail, table, target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--class", dest="workload_class", default="", help="one workload class")
    parser.add_argument("--json", action="store_true", help="print the response as JSON")


def run(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf import json_format

    from controller.api import pb, pb_grpc

    with grpc.insecure_channel(target(args.address)) as channel:
        try:
            ev = pb_grpc.SpecControllerStub(channel).GetEvidence(
                pb.GetEvidenceRequest(workload_class=args.workload_class), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            return fail("evidence", exc)
    if args.json:
        print(json_format.MessageToJson(ev, preserving_proto_field_name=True))
        return 0
    print(f"policy {ev.policy_name} version {ev.policy_version}")
    rows = [["CLASS", "BUCKET", "ARM", "P", "GOODPUT", "LOW", "HIGH", "P(BEST)", "WHY"]]
    for c in ev.classes:
        why = c.explanation + (f" [override {c.override_arm}]" if c.override_arm else "")
        for a in c.arms:
            rows.append(
                [
                    c.workload_class,
                    str(c.load_bucket),
                    a.arm,
                    f"{a.probability:.3f}",
                    # "-": the policy gives no estimate for this arm (e.g. static)
                    *(
                        (
                            f"{a.goodput:.1f}",
                            f"{a.goodput_low:.1f}",
                            f"{a.goodput_high:.1f}",
                            f"{a.prob_best:.3f}",
                        )
                        if a.goodput_high > 0.0
                        else ("-", "-", "-", "-")
                    ),
                    why,
                ]
            )
            why = ""
    print(table(rows))
    return 0
