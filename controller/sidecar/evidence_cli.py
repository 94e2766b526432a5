"""Print the evidence behind the sidecar's policy: per class, load bucket and arm,
the probability, the estimated goodput with its interval, and P(best); then per
class and load bucket how settled the decision is: the mode (the arm clearly
most likely), how long it has held, and the flips and movement (total
variation) of the published distribution over the recent window.

The sidecar's address: --address, else $SPECCTL_SERVER_LISTEN, else
unix:///tmp/specctl.sock; over TLS, --tls-ca-file (and, for mutual TLS,
--tls-cert-file and --tls-key-file).
"""

from __future__ import annotations

import argparse

from specctl.sidecar.client_cli import add_common_arguments, fail, open_channel, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--class", dest="workload_class", default="", help="one workload class")
    parser.add_argument("--json", action="store_true", help="print the response as JSON")


def run(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf import json_format

    from specctl.api import pb, pb_grpc

    sidecar = open_channel("evidence", args)
    if sidecar is None:
        return 2
    with sidecar:
        try:
            ev = pb_grpc.SpecControllerStub(sidecar).GetEvidence(
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
    header = ["CLASS", "BUCKET", "MODE", "DWELL", "WINDOW", "FLIPS", "FLIPS/MIN", "CHANGES", "TV"]
    stable = [[*header, "TV/S"]]
    for c in ev.classes:
        if not c.HasField("stability"):
            continue  # a sidecar that does not track stability
        s = c.stability
        stable.append(
            [
                c.workload_class,
                str(c.load_bucket),
                s.mode_arm,
                duration(s.mode_dwell_s),
                duration(s.window_s),
                str(s.mode_flips_recent),
                f"{s.mode_flips_per_minute:.2f}",
                str(s.changes_recent),
                f"{s.change_tv_recent:.3f}",
                f"{s.change_tv_per_second:.4f}",
            ]
        )
    if len(stable) > 1:
        print()
        print("decision stability (FLIPS, CHANGES and TV over the last WINDOW)")
        print(table(stable))
    return 0


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h10m``, ``3d04h``: short enough for a table column."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
