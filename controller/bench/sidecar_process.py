"""The sidecar of a real-engine run: ``specctl serve`` at one unix socket, restarted per policy.

The sidecar is restarted at the same unix socket whenever the policy changes,
and the engine's client reconnects by itself. The benchmark drives it over
gRPC: it pins a class to a static arm through the admin override and reads the
served policy and the evidence.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specctl.bench.processes import ProcessError, free_port, log_tail, stop_process, wait_http
from specctl.bench.scraped_metrics import Sample, metric_sum, parse_metrics, scrape

ADMIN_TOKEN = "specctl-bench"  # the sidecar listens on a private unix socket only


def toml_value(value: Any) -> str:
    """A TOML literal for a policy parameter (strings, numbers, booleans, lists, tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return (
            "{"
            + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items())
            + "}"
        )
    raise TypeError(f"cannot write {value!r} as TOML")


class SidecarProcess:
    """``specctl serve`` at one unix socket, restarted with another policy when asked.

    Each start may name a state directory: a learning policy's sidecar then
    snapshots what it learned and keeps its decision log there, and its next
    start restores it, so the policy carries its learning from one of its
    segments to the next.
    """

    def __init__(self, workdir: Path, log_dir: Path, load_bucket_bounds: Sequence[int] | None):
        import grpc

        from specctl.api import pb, pb_grpc

        self.workdir = workdir
        self.log_dir = log_dir
        self.address = f"unix://{workdir}/specctl.sock"
        self.token_file = workdir / "admin.token"
        self.token_file.write_text(ADMIN_TOKEN)
        self.token_file.chmod(0o600)
        self.load_bucket_bounds = list(load_bucket_bounds) if load_bucket_bounds else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0
        self.starts = 0
        self.policy = ""
        self._pb, self._pb_grpc, self._grpc = pb, pb_grpc, grpc
        self._channel: Any = None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"sidecar-{self.starts}.log"

    def start(
        self,
        policy: str,
        params: Mapping[str, Any] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        """Start ``specctl serve --policy`` with ``params``; with ``state_dir``, restore
        and keep its state there."""
        self.stop()
        self.starts += 1
        self.policy = policy
        self.metrics_port = free_port()
        lines = [
            "[server]",
            f'listen = "{self.address}"',
            f'metrics_listen = "127.0.0.1:{self.metrics_port}"',
            "grace_period_s = 1.0",
            "[policy]",
            f"name = {toml_value(policy)}",
            f"params = {toml_value(dict(params or {}))}",
        ]
        if self.load_bucket_bounds:
            lines.append(f"load_bucket_bounds = {toml_value(self.load_bucket_bounds)}")
        lines += ["[admin]", "enabled = true", f"token_file = {toml_value(str(self.token_file))}"]
        lines += ["[log]", 'format = "json"']
        if state_dir is not None:
            # snapshots and decision-log flushes at the production defaults: the sidecar's
            # CPU each segment records is then what a deployment pays (a stop writes the
            # last snapshot and flushes the log, so nothing the next segment restores is lost)
            state_dir.mkdir(parents=True, exist_ok=True)
            lines += ["[state]", f"dir = {toml_value(str(state_dir))}"]
        config = self.workdir / f"sidecar-{self.starts}.toml"
        config.write_text("\n".join(lines) + "\n")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specctl.cli", "serve", "--config", str(config)],
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_http(f"http://127.0.0.1:{self.metrics_port}/metrics", self.proc, 60, self.log_path)
        except ProcessError as exc:
            raise ProcessError(f"sidecar ({policy}) {exc}") from None
        self._channel = self._grpc.insecure_channel(self.address)

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        stop_process(self.proc, grace_s=10.0)
        self.proc = None

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise ProcessError(
                f"the sidecar exited; see {self.log_path}:\n{log_tail(self.log_path)}"
            )

    def metrics(self) -> list[Sample]:
        return parse_metrics(
            scrape(f"http://127.0.0.1:{self.metrics_port}/metrics", self.check_alive)
        )

    def wait_connected(self, timeout_s: float = 60.0) -> None:
        """Until an engine holds a stream (it reconnects by itself after a restart)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if metric_sum(self.metrics(), "specctl_engines_connected") >= 1:
                return
            time.sleep(0.1)
        raise ProcessError(f"no engine connected to the sidecar within {timeout_s:.0f} s")

    def evidence(self) -> Any:
        stub = self._pb_grpc.SpecControllerStub(self._channel)
        return stub.GetEvidence(self._pb.GetEvidenceRequest(), timeout=10)

    def policy_now(self) -> Any:
        """The ``Policy`` the sidecar serves now, over every arm engines offered it."""
        stub = self._pb_grpc.SpecControllerStub(self._channel)
        return stub.GetPolicy(self._pb.GetPolicyRequest(), timeout=10)

    def override(self, workload_class: str, arm: str) -> None:
        """Pin ``workload_class`` to ``arm`` ("" clears the pin)."""
        admin = self._pb_grpc.SpecControllerAdminStub(self._channel)
        admin.SetOverride(
            self._pb.SetOverrideRequest(workload_class=workload_class, arm=arm),
            metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),),
            timeout=10,
        )
