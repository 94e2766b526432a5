"""vLLM's OpenAI-compatible server with specctl's scheduler, the engine of a real-engine run.

One vLLM server runs for the whole benchmark (starting one costs tens of
seconds), at a lower priority than the load generator and the sidecar, with
its engine's CPU time measured per process (:mod:`.engine_cpu`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specctl.bench.engine_cpu import ProcessTree
from specctl.bench.processes import ProcessError, free_port, log_tail, stop_process, wait_http
from specctl.bench.scraped_metrics import Sample, metric_sum, parse_metrics, scrape

SCHEDULER_CLS = "specctl.engine.scheduler.SpecctlScheduler"
# vLLM 0.32's CPU build verifies drafts against uninitialized sampling parameters whenever a
# batch holds a sampled request; this worker extension patches that (a no-op elsewhere).
CPU_SPEC_DECODE_FIXES = "specctl.demo.vllm_cpu_fixes.CpuSpecDecodeFixes"
SERVED_MODEL_NAME = "bench"
# The engine runs at this niceness: the load generator and the sidecar, which in production
# run beside an engine rather than under it, then get the CPU the moment they need it (on a
# small machine vLLM's CPU engine keeps every core busy, and a starved sidecar counts late).
# What the engine does not leave idle it still gets, and its CPU time is measured per process.
ENGINE_NICENESS = 5


def _importable(qualified: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(qualified.rsplit(".", 1)[0]) is not None


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
            wait_http(f"{self.base_url}/health", self.proc, timeout_s, self.log_path)
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
                f"{log_tail(self.log_path)}"
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
