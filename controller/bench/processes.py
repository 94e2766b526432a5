"""The processes a real-engine run drives: vLLM's OpenAI-compatible server and the sidecar.

One vLLM server runs for the whole benchmark (starting one costs tens of
seconds); the sidecar is restarted at the same unix socket whenever the policy
changes, and the engine's client reconnects by itself. Each process runs in a
session of its own, so stopping it stops its children (vLLM's engine core and
workers) and nothing else.

Engine CPU time is read from ``/proc``: the CPU seconds of the server's
descendants (vLLM's engine core and its model workers), the API server's own
process (HTTP, tokenizing) excluded. On a CPU engine that is the engine's
cost, and unlike wall time it barely moves when other processes load the
machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEDULER_CLS = "specctl.engine.scheduler.SpecctlScheduler"
# vLLM 0.32's CPU build verifies drafts against uninitialized sampling parameters whenever a
# batch holds a sampled request; this worker extension patches that (a no-op elsewhere).
CPU_SPEC_DECODE_FIXES = "specctl.demo.vllm_cpu_fixes.CpuSpecDecodeFixes"
SERVED_MODEL_NAME = "bench"
ADMIN_TOKEN = "specctl-bench"  # the sidecar listens on a private unix socket only
# The engine runs at this niceness: the load generator and the sidecar, which in production
# run beside an engine rather than under it, then get the CPU the moment they need it (on a
# small machine vLLM's CPU engine keeps every core busy, and a starved sidecar counts late).
# What the engine does not leave idle it still gets, and its CPU time is measured per process.
ENGINE_NICENESS = 5


class ProcessError(RuntimeError):
    """A process the benchmark started died or did not come up; the message names its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def scrape(url: str, check_alive: Callable[[], None], attempts: int = 3) -> str:
    """GET ``url`` (a ``/metrics`` page) with a generous timeout and a few retries.

    On a loaded two-core machine a process busy learning or restoring state can leave its
    metrics thread without the GIL for seconds; a slow scrape is data, not a failure. A
    process that died raises :class:`ProcessError` from ``check_alive`` instead.
    """
    for attempt in range(attempts):
        try:
            return http_get(url, timeout_s=20.0)
        except OSError:
            check_alive()
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


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


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ProcessError(f"exited with code {proc.returncode}; see {log}:\n{_tail(log)}")
        try:
            http_get(url, 2.0)
            return
        except OSError:
            time.sleep(0.3)
    raise ProcessError(f"{url} not ready after {timeout_s:.0f} s; see {log}")


def _importable(qualified: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(qualified.rsplit(".", 1)[0]) is not None


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


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


# ---------------------------------------------------------------------------------------
# metrics


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def metric_sum(samples: Sequence[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


# ---------------------------------------------------------------------------------------
# engine CPU time


def _stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds) of a process, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ProcessTree:
    """CPU seconds of a process's descendants, the process itself excluded.

    :meth:`refresh` walks ``/proc`` to find the descendants (and which of them are
    vLLM's model workers, by process title); :meth:`cpu_seconds` then reads only their
    ``stat`` files, so a reading is quick and does not touch other processes (reading
    another process's command line can wait on its memory map lock).
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.pids: dict[int, bool] = {}  # descendant -> is a model worker

    def refresh(self) -> None:
        parent: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    parent[int(entry)] = _stat(int(entry))[0]
                except (OSError, IndexError, ValueError):
                    continue
        found: dict[int, bool] = {}
        for pid in parent:
            p = parent.get(pid, 1)
            while p > 1 and p != self.root:
                p = parent.get(p, 1)
            if p == self.root:
                if pid in self.pids:
                    found[pid] = self.pids[pid]
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        # vLLM's process title for its model worker
                        found[pid] = f.read(64).startswith(b"VLLM::Worker")
                except OSError:
                    continue
        self.pids = found

    def cpu_seconds(self) -> tuple[float, float]:
        """(all descendants, the model workers alone). vLLM's CPU engine core busy-waits
        for its worker's result, so the first counts that waiting as well; the workers'
        time is the forward passes, drafting and sampling."""
        total = in_worker = 0.0
        for pid, is_worker in list(self.pids.items()):
            try:
                seconds = _stat(pid)[1]
            except (OSError, IndexError, ValueError):
                continue  # gone: its time is no longer counted by anyone
            total += seconds
            if is_worker:
                in_worker += seconds
        return total, in_worker


def engine_cpu_seconds(root: int) -> tuple[float, float]:
    """CPU seconds so far of ``root``'s descendants, ``root`` itself excluded: (all of them,
    vLLM's model workers alone)."""
    tree = ProcessTree(root)
    tree.refresh()
    return tree.cpu_seconds()


# ---------------------------------------------------------------------------------------
# vLLM


class VllmServer:
    """vLLM's OpenAI-compatible server with specctl's scheduler, in its own session."""

    def __init__(
        self,
        *,
        model: str,
        speculative: Mapping[str, Any],
        sidecar_address: str,
        log_path: Path,
        dtype: str = "float32",
        max_model_len: int = 512,
        max_num_seqs: int = 32,
        step_clock: str = "process_cpu",
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        seed: int = 0,
        port: int = 0,
    ) -> None:
        self.model = model
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.cmd = [
            "nice", "-n", str(ENGINE_NICENESS),
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--served-model-name", SERVED_MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--scheduler-cls", SCHEDULER_CLS,
            "--speculative-config", json.dumps(dict(speculative)),
            "--dtype", dtype, "--enforce-eager",
            "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
            "--seed", str(seed),
            *extra_args,
        ]  # fmt: skip
        if "--worker-extension-cls" not in extra_args and _importable(CPU_SPEC_DECODE_FIXES):
            self.cmd += ["--worker-extension-cls", CPU_SPEC_DECODE_FIXES]
        self.env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "SPECCTL_ADDRESS": sidecar_address,
            "SPECCTL_STEP_CLOCK": step_clock,
            "SPECCTL_REPORT_INTERVAL_S": "0.2",
            "SPECCTL_RECONNECT_MIN_S": "0.1",
            "SPECCTL_RECONNECT_MAX_S": "1.0",
            "SPECCTL_SEED": str(seed),
            **dict(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.tree: ProcessTree | None = None
        self.start_s = 0.0

    def start(self, timeout_s: float = 600.0) -> float:
        """Start and wait for /health; returns the seconds it took."""
        t0 = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        try:
            _wait_http(f"{self.base_url}/health", self.proc, timeout_s, self.log_path)
        except ProcessError as exc:
            raise ProcessError(f"vLLM server {exc}") from None
        self.start_s = time.monotonic() - t0
        self.tree = ProcessTree(self.proc.pid)
        self.tree.refresh()
        return self.start_s

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise ProcessError(
                f"the vLLM server exited (code {code}); see {self.log_path}:\n"
                f"{_tail(self.log_path)}"
            )

    def metrics(self) -> list[Sample]:
        return parse_metrics(scrape(f"{self.base_url}/metrics", self.check_alive))

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds of the engine core and the model workers (see :class:`ProcessTree`;
        :meth:`wait_idle` refreshes which processes those are)."""
        assert self.tree is not None
        return self.tree.cpu_seconds()

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until no request is running or waiting (aborted clients' requests drained)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            m = self.metrics()
            if (
                metric_sum(m, "vllm:num_requests_running")
                + metric_sum(m, "vllm:num_requests_waiting")
                == 0
            ):
                if self.tree is not None:
                    self.tree.refresh()
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        stop_process(self.proc, grace_s=20.0)
        self.proc = None


# ---------------------------------------------------------------------------------------
# the sidecar


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
            state_dir.mkdir(parents=True, exist_ok=True)
            lines += [
                "[state]",
                f"dir = {toml_value(str(state_dir))}",
                "snapshot_interval_s = 5.0",
                "log_flush_interval_s = 0.5",
            ]
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
            _wait_http(
                f"http://127.0.0.1:{self.metrics_port}/metrics", self.proc, 60, self.log_path
            )
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
            raise ProcessError(f"the sidecar exited; see {self.log_path}:\n{_tail(self.log_path)}")

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
