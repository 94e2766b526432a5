"""What `specctl policy`, `specctl evidence` and `specctl override` share: reaching the sidecar.

The sidecar's address comes from --address, else SPECCTL_SERVER_LISTEN, else
unix:///tmp/specctl.sock (the sidecar's default).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

DEFAULT_ADDRESS = "unix:///tmp/specctl.sock"


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=os.environ.get("SPECCTL_SERVER_LISTEN", DEFAULT_ADDRESS),
        help="the sidecar: unix:///path or host:port (default: $SPECCTL_SERVER_LISTEN or "
        f"{DEFAULT_ADDRESS})",
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")


def target(address: str) -> str:
    # A server listening on all interfaces is reached on loopback.
    for wildcard in ("0.0.0.0:", "[::]:"):
        if address.startswith(wildcard):
            return "127.0.0.1:" + address[len(wildcard) :]
    return address


def fail(command: str, exc: Any) -> int:
    code = exc.code().name if hasattr(exc, "code") else "ERROR"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    print(f"specctl {command}: {code}: {details}", file=sys.stderr)
    return 1


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)
