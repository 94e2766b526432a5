"""What `specctl policy`, `specctl evidence` and `specctl override` share: reaching the sidecar.

The sidecar's address comes from --address, else SPECCTL_SERVER_LISTEN, else
unix:///tmp/specctl.sock (the sidecar's default). A sidecar on TCP with TLS is
reached with --tls-ca-file (the CA that signed its certificate; without it the
system's roots), and, under mutual TLS, a client certificate: --tls-cert-file
and --tls-key-file. Their defaults are SPECCTL_TLS_CA_FILE, SPECCTL_TLS_CERT_FILE
and SPECCTL_TLS_KEY_FILE, the variables the engine reads.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
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
    for name, what in (
        ("ca", "PEM file of the CA that signed the sidecar's certificate (TLS)"),
        ("cert", "PEM file of this client's certificate (mutual TLS)"),
        ("key", "PEM file of this client's private key (mutual TLS)"),
    ):
        variable = f"SPECCTL_TLS_{name.upper()}_FILE"
        parser.add_argument(
            f"--tls-{name}-file",
            default=os.environ.get(variable, ""),
            help=f"{what} (default: ${variable})",
        )


def target(address: str) -> str:
    # A server listening on all interfaces is reached on loopback.
    for wildcard in ("0.0.0.0:", "[::]:"):
        if address.startswith(wildcard):
            return "127.0.0.1:" + address[len(wildcard) :]
    return address


def channel(args: argparse.Namespace) -> Any:
    """A channel to the sidecar: plain, or TLS when a CA or a client certificate is given.

    Raises ValueError naming the flag when the TLS flags do not go together or a
    file cannot be read.
    """
    import grpc

    address = target(args.address)
    if not (args.tls_ca_file or args.tls_cert_file or args.tls_key_file):
        return grpc.insecure_channel(address)
    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        raise ValueError("--tls-cert-file and --tls-key-file go together")

    def read(flag: str, path: str) -> bytes | None:
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"{flag}={path!r}: {exc.strerror or exc}") from None

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("--tls-ca-file", args.tls_ca_file),
        private_key=read("--tls-key-file", args.tls_key_file),
        certificate_chain=read("--tls-cert-file", args.tls_cert_file),
    )
    return grpc.secure_channel(address, credentials)


def open_channel(command: str, args: argparse.Namespace) -> Any | None:
    """:func:`channel`, or None after saying on stderr why the TLS flags are unusable."""
    try:
        return channel(args)
    except ValueError as exc:
        print(f"specctl {command}: {exc}", file=sys.stderr)
        return None


def fail(command: str, exc: Any) -> int:
    code = exc.code().name if hasattr(exc, "code") else "ERROR"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    print(f"specctl {command}: {code}: {details}", file=sys.stderr)
    return 1


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)
