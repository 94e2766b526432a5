"""Where the sidecar listens: the gRPC server's options and bind, and the /metrics server.

``server.listen`` is a unix socket (created with ``server.socket_mode``,
replacing one a crashed sidecar left behind), a TCP address with TLS (mutual
when ``server.tls_client_ca_file`` is set), or a plain TCP address.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import start_http_server

from specctl.sidecar.config import (
    SOCKET_MODES,
    ConfigError,
    ServerConfig,
    is_unix_address,
    unix_socket_path,
)
from specctl.sidecar.metrics import SidecarMetrics
from specctl.sidecar.tls import CertificateFiles

# gRPC refuses by itself only messages this many times server.max_message_bytes.
TRANSPORT_LIMIT_FACTOR = 4


def server_options(sc: ServerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", sc.max_message_bytes),
        # gRPC itself refuses only what is far beyond the limit (ending the stream with
        # RESOURCE_EXHAUSTED before specctl sees it); a report over the limit but under
        # this cap is rejected by the admission with a message and counted.
        ("grpc.max_receive_message_length", TRANSPORT_LIMIT_FACTOR * sc.max_message_bytes),
        # Engines hold one stream for days, mostly idle between bursts: let them
        # ping, and ping them to notice dead peers, without ever cutting the stream.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.so_reuseport", 0),
        # Keep each stream's receive window at its default (64 KiB) instead of growing it
        # with bandwidth probes: an engine faster than the sidecar is held back by flow
        # control, and what waits for the sidecar stays bounded in memory.
        ("grpc.http2.bdp_probe", 0),
    ]


def new_server(
    sc: ServerConfig, interceptors: Sequence[grpc.aio.ServerInterceptor]
) -> grpc.aio.Server:
    return grpc.aio.server(options=server_options(sc), interceptors=list(interceptors))


@dataclass
class Bound:
    """Where a server listens: ``address`` is what clients dial; ``tls`` the files it serves."""

    address: str
    tls: CertificateFiles | None


def bind(server: grpc.aio.Server, sc: ServerConfig) -> Bound:
    """Add ``server.listen`` to ``server`` (before it starts)."""
    if is_unix_address(sc.listen):
        path = unix_socket_path(sc.listen)
        remove_stale_socket(path)
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        server.add_insecure_port(sc.listen)
        return Bound(f"unix://{path}", None)
    host = sc.listen.rsplit(":", 1)[0]
    if sc.tls_cert_file:
        tls = CertificateFiles(sc.tls_cert_file, sc.tls_key_file, sc.tls_client_ca_file)
        port = server.add_secure_port(sc.listen, tls.server_credentials())
        return Bound(f"{host}:{port}", tls)
    port = server.add_insecure_port(sc.listen)
    return Bound(f"{host}:{port}", None)


async def start(server: grpc.aio.Server, sc: ServerConfig) -> None:
    """Start ``server``; a unix socket is created with ``server.socket_mode``, never wider."""
    if not is_unix_address(sc.listen):
        await server.start()
        return
    mode = SOCKET_MODES[sc.socket_mode]
    old_umask = os.umask(0o777 & ~mode)
    try:
        await server.start()
    finally:
        os.umask(old_umask)
    os.chmod(unix_socket_path(sc.listen), mode)


def remove_stale_socket(path: str) -> None:
    """A socket file left by a crashed sidecar would block the bind; anything else is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"server.listen: {path!r} exists and is not a socket")
    os.unlink(path)


def remove_socket(sc: ServerConfig) -> None:
    """Remove the unix socket a stopped server listened on, if any."""
    if is_unix_address(sc.listen):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(unix_socket_path(sc.listen))


def serve_metrics(metrics: SidecarMetrics, sc: ServerConfig) -> tuple[Any, str]:
    """Serve /metrics on ``server.metrics_listen`` (its own thread): the server and its URL."""
    host, _, port_text = sc.metrics_listen.rpartition(":")
    httpd, _thread = start_http_server(
        int(port_text), addr=host.strip("[]"), registry=metrics.exposition()
    )
    bound = httpd.server_address
    return httpd, f"http://{sc.metrics_listen.rsplit(':', 1)[0]}:{bound[1]}/metrics"
