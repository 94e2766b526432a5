"""Run the sidecar: the gRPC controller engines connect to, and its Prometheus /metrics.

Settings come from the TOML file given with --config, then from environment
variables SPECCTL_<SECTION>_<KEY> (e.g. SPECCTL_SERVER_LISTEN), then from these
flags. The file is re-read when it changes (or on SIGHUP): policy parameters and
overrides apply live. SIGTERM or SIGINT stops gracefully: health turns
NOT_SERVING, streams end, calls drain for server.grace_period_s, exit 0.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file (watched)")
    parser.add_argument(
        "--listen",
        metavar="ADDRESS",
        help="gRPC address: unix:///path/to.sock or host:port (server.listen; "
        "default unix:///tmp/specctl.sock)",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="address of the Prometheus /metrics endpoint (server.metrics_listen; "
        "default 127.0.0.1:9400)",
    )
    parser.add_argument(
        "--policy", metavar="NAME", help="policy by name (policy.name; default specctl)"
    )
    parser.add_argument(
        "--log-format",
        choices=["auto", "json", "console"],
        help="log.format; auto is JSON unless stderr is a terminal",
    )
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="log.level"
    )
    parser.add_argument(
        "--admin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="allow the admin calls SetOverride and ResetClass (admin.enabled; default off)",
    )
    parser.add_argument(
        "--admin-token-file",
        metavar="FILE",
        help="file holding the bearer token admin calls must carry (admin.token_file)",
    )


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, as "section.key" -> value."""
    pairs = {
        "server.listen": args.listen,
        "server.metrics_listen": args.metrics_listen,
        "policy.name": args.policy,
        "log.format": args.log_format,
        "log.level": args.log_level,
        "admin.enabled": args.admin,
        "admin.token_file": args.admin_token_file,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def run(args: argparse.Namespace) -> int:
    import asyncio

    from specctl.logs import configure_logging
    from specctl.sidecar.config import ConfigError, load_config
    from specctl.sidecar.server import serve

    overrides = flag_overrides(args)
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"specctl serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log.format, config.log.level)
    try:
        return asyncio.run(serve(config, overrides))
    except (ConfigError, OSError, RuntimeError) as exc:
        print(f"specctl serve: {exc}", file=sys.stderr)
        return 1
