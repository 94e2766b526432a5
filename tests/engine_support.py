"""Helpers for the engine tests: the sidecar as a real process, and vLLM's engine settings."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import grpc

from specctl.api import pb, pb_grpc
from specctl.steps import load_bucket_of

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SidecarProcess:
    """``specctl serve`` in its own process, so a test can SIGKILL and restart it."""

    def __init__(self, workdir: Path, policy: str = "specctl", config: str = "") -> None:
        self.workdir = workdir
        self.address = f"unix://{workdir}/specctl.sock"
        self.token = "test-admin-token"
        (workdir / "admin.token").write_text(self.token)
        self.policy = policy
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"sidecar-{self.starts}.log"

    def start(self, policy: str | None = None, config: str | None = None) -> None:
        self.policy = policy or self.policy
        self.config = self.config if config is None else config
        self.starts += 1
        self.metrics_port = free_port()
        cmd = [
            sys.executable, "-m", "specctl.cli", "serve",
            "--listen", self.address,
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            "--policy", self.policy,
            "--admin", "--admin-token-file", str(self.workdir / "admin.token"),
            "--log-format", "json",
        ]  # fmt: skip
        if self.config:
            path = self.workdir / f"sidecar-{self.starts}.toml"
            path.write_text(self.config)
            cmd += ["--config", str(path)]
        self.proc = subprocess.Popen(cmd, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited: {self.log_path.read_text()[-2000:]}")
            try:
                self.metrics()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("sidecar did not start within 60 s")

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def metric(self, name: str) -> float:
        """The sum of a metric's samples (0 when absent)."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def stub(
        self,
    ) -> tuple[grpc.Channel, pb_grpc.SpecControllerStub, pb_grpc.SpecControllerAdminStub]:
        channel = grpc.insecure_channel(self.address)
        return (
            channel,
            pb_grpc.SpecControllerStub(channel),
            pb_grpc.SpecControllerAdminStub(channel),
        )

    def policy_now(self) -> pb.Policy:
        channel, stub, _ = self.stub()
        with channel:
            return stub.GetPolicy(pb.GetPolicyRequest(), timeout=5)

    def evidence(self) -> pb.GetEvidenceResponse:
        channel, stub, _ = self.stub()
        with channel:
            return stub.GetEvidence(pb.GetEvidenceRequest(), timeout=5)

    def reset_class(self, workload_class: str) -> None:
        """Make the policy forget what it learned about a class (admin)."""
        channel, _, admin = self.stub()
        with channel:
            admin.ResetClass(
                pb.ResetClassRequest(workload_class=workload_class),
                metadata=(("authorization", f"Bearer {self.token}"),),
                timeout=5,
            )

    def override(self, workload_class: str, arm: str) -> None:
        channel, _, admin = self.stub()
        with channel:
            admin.SetOverride(
                pb.SetOverrideRequest(workload_class=workload_class, arm=arm),
                metadata=(("authorization", f"Bearer {self.token}"),),
                timeout=5,
            )


def mode_arm(policy: pb.Policy, workload_class: str) -> tuple[str, float]:
    """The most probable arm for a class (over its load buckets, by probability)."""
    best = ("", -1.0)
    for entry in policy.entries:
        if entry.workload_class != workload_class:
            continue
        for arm, p in zip(entry.arms, entry.probabilities, strict=True):
            if p > best[1]:
                best = (arm, p)
    return best


def distribution(sidecar: SidecarProcess, workload_class: str, batch_size: int) -> dict[str, float]:
    """The class's distribution over arms in the load bucket of ``batch_size``."""
    bucket = load_bucket_of(batch_size, sidecar.policy_now().load_bucket_bounds)
    for ce in sidecar.evidence().classes:
        if ce.workload_class == workload_class and ce.load_bucket == bucket:
            return {a.arm: a.probability for a in ce.arms}
    return {}


def arm_rounds(sidecar: SidecarProcess, workload_class: str) -> dict[str, float]:
    """Request-rounds the engine ran per arm for a class, from the sidecar's /metrics."""
    prefix = "specctl_arm_rounds_total{"
    out: dict[str, float] = {}
    for line in sidecar.metrics().splitlines():
        if not line.startswith(prefix):
            continue
        labels, value = line[len(prefix) :].rsplit("} ", 1)
        fields = dict(part.split("=", 1) for part in labels.split(","))
        if fields.get("workload_class", "").strip('"') == workload_class:
            arm = fields["arm"].strip('"')
            out[arm] = out.get(arm, 0.0) + float(value)
    return out


@contextmanager
def running_sidecar(policy: str = "specctl") -> Iterator[SidecarProcess]:
    """A sidecar process in a short directory of its own (unix socket paths are short)."""
    workdir = Path(tempfile.mkdtemp(prefix="specctl-e-"))
    sidecar = SidecarProcess(workdir, policy=policy)
    sidecar.start()
    try:
        yield sidecar
    finally:
        sidecar.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def engine_environment(sidecar: SidecarProcess, settings: Mapping[str, str]) -> Iterator[None]:
    """vLLM's settings, the engine's sidecar and ``settings`` in the environment, for as long
    as the engine started inside runs (its processes read them at start-up)."""
    env = {
        **VLLM_ENV,
        "SPECCTL_ADDRESS": sidecar.address,
        "SPECCTL_REPORT_INTERVAL_S": "0.1",
        "SPECCTL_SEED": "0",
        **settings,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
