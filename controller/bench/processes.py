"""The processes a real-engine run starts: each in a session of its own, waited for, stopped.

A real-engine run starts vLLM's OpenAI-compatible server
(:mod:`.vllm_server`) and the sidecar (:mod:`.sidecar_process`). Each runs in a
session of its own, so stopping it stops its children (vLLM's engine core and
workers) and nothing else; it is ready when it answers over HTTP, and a process
that dies or does not come up raises :class:`ProcessError` naming its log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


class ProcessError(RuntimeError):
    """A process the benchmark started died or did not come up; the message names its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def stop_process(proc: subprocess.Popen[bytes] | None, grace_s: float = 15.0) -> None:
    """SIGTERM the process's session, then SIGKILL it after ``grace_s``."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    """Until ``url`` answers; :class:`ProcessError` if ``proc`` exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ProcessError(f"exited with code {proc.returncode}; see {log}:\n{log_tail(log)}")
        try:
            http_get(url, 2.0)
            return
        except OSError:
            time.sleep(0.3)
    raise ProcessError(f"{url} not ready after {timeout_s:.0f} s; see {log}")


def log_tail(path: Path, chars: int = 2000) -> str:
    """The last ``chars`` characters of a log, for an error message ("" if unreadable)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
