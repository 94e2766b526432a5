"""A redis-server of its own, for tests and benchmarks of a fleet's shared evidence store.

It listens on a free loopback port (or a unix socket, or TLS) in a temporary
directory, keeps nothing on disk, and asks for a password. A test stops it
to see the sidecars serve without it, starts it again on the same port to
see them re-join, or has it sleep (``DEBUG SLEEP``) to see them time out.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis


@dataclass(frozen=True)
class RedisTls:
    """PEM files for a TLS listener (clients need no certificate of their own)."""

    cert_file: Path
    key_file: Path
    ca_file: Path


class RedisServer:
    """One redis-server process, started and stopped by its owner."""

    def __init__(
        self,
        directory: Path,
        *,
        password: str = "specctl-test-password",
        unix_socket: bool = False,
        tls: RedisTls | None = None,
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make system-deps installs it)")
        self.binary = binary
        self.directory = directory
        self.password = password
        self.tls = tls
        self.socket_path = directory / "redis.sock" if unix_socket else None
        self.port = 0 if unix_socket else _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        """The URL a sidecar's ``fleet.url`` names (no credentials in it)."""
        if self.socket_path is not None:
            return f"unix://{self.socket_path}"
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def password_file(self) -> Path:
        """A file holding the password, for ``fleet.password_file``."""
        path = self.directory / "password"
        path.write_text(self.password + "\n")
        return path

    def start(self, timeout: float = 20.0) -> RedisServer:
        """Start (or start again, on the same port) and wait until it answers."""
        args = [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
            "--logfile",
            str(self.directory / "redis.log"),
            "--requirepass",
            self.password,
            # DEBUG SLEEP makes it a slow store for a while
            "--enable-debug-command",
            "local",
        ]
        if self.socket_path is not None:
            args += [
                "--port",
                "0",
                "--unixsocket",
                str(self.socket_path),
                "--unixsocketperm",
                "700",
            ]
        elif self.tls is not None:
            args += [
                *("--port", "0", "--tls-port", str(self.port)),
                *("--tls-cert-file", str(self.tls.cert_file)),
                *("--tls-key-file", str(self.tls.key_file)),
                *("--tls-ca-cert-file", str(self.tls.ca_file)),
                *("--tls-auth-clients", "no"),
            ]
        else:
            args += ["--port", str(self.port)]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.directory
        )
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {log}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not answer in time")
            time.sleep(0.05)
        return self

    def client(self, timeout: float = 5.0) -> redis.Redis:
        """A synchronous client, authenticated, for a test to look and write directly."""
        kwargs: dict[str, object] = {"password": self.password, "socket_timeout": timeout}
        if self.tls is not None:
            kwargs["ssl_ca_certs"] = str(self.tls.ca_file)
        return redis.Redis.from_url(self.url, **kwargs)  # type: ignore[arg-type]

    def answers(self) -> bool:
        try:
            with self.client() as c:
                return bool(c.ping())
        except (redis.RedisError, OSError):
            return False

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGKILL with ``kill``: no goodbye to its clients)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
