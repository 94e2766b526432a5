"""TLS and mutual TLS for the sidecar's TCP listener, with certificates reloaded on change.

The certificate, key and (for mTLS) client CA are read from files. gRPC asks
:meth:`CertificateFiles.fetch` before every new handshake; it returns a new
configuration only when a file's modification time or size changed and all of
them read back, so a rotated certificate (cert-manager, a mounted Secret) is
served to the next connection without a restart, and a half-written rotation
keeps the previous certificate instead of breaking handshakes.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from specctl.logs import get_logger

log = get_logger(__name__)


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


class CertificateFiles:
    """The server's certificate files and the configuration gRPC serves from them."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str = "") -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self.reloads = 0
        self._stamps = self._current_stamps()
        self.initial = self._configuration()

    @property
    def paths(self) -> list[str]:
        return [p for p in (self.cert_file, self.key_file, self.client_ca_file) if p]

    def _current_stamps(self) -> list[tuple[int, int]]:
        return [_stamp(p) for p in self.paths]

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        cert = Path(self.cert_file).read_bytes()
        key = Path(self.key_file).read_bytes()
        for name, data in (("server.tls_cert_file", cert), ("server.tls_key_file", key)):
            if b"-----BEGIN" not in data:
                raise ValueError(f"{name}: not a PEM file")
        ca = Path(self.client_ca_file).read_bytes() if self.client_ca_file else None
        if ca is not None and b"-----BEGIN CERTIFICATE" not in ca:
            raise ValueError("server.tls_client_ca_file: not a PEM certificate")
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """A new configuration if the files changed (called by gRPC before each handshake)."""
        try:
            stamps = self._current_stamps()
            if stamps == self._stamps:
                return None
            config = self._configuration()
        except (OSError, ValueError) as exc:
            log.error("tls_reload_failed", error=str(exc), files=self.paths)
            return None
        self._stamps = stamps
        self.reloads += 1
        log.info("tls_certificates_reloaded", files=self.paths, reloads=self.reloads)
        return config

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials for ``add_secure_port``; mTLS when a client CA is configured."""
        return grpc.dynamic_ssl_server_credentials(
            self.initial,
            self.fetch,
            require_client_authentication=bool(self.client_ca_file),
        )


def peer_common_names(context: grpc.aio.ServicerContext) -> list[str]:
    """The verified client certificate's common names (empty without mTLS)."""
    auth = context.auth_context() or {}
    return [v.decode(errors="replace") for v in auth.get("x509_common_name", [])]


def parse_names(text: str) -> tuple[str, ...]:
    """``"ops, admin"`` -> ``("ops", "admin")``."""
    return tuple(n.strip() for n in text.split(",") if n.strip())
