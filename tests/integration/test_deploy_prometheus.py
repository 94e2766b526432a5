"""specctl's alerts in a real Prometheus, scraping a real sidecar fed by the simulator.

Prometheus (Debian's package) runs on loopback with a temporary configuration
and data directory and loads the rules with short windows (10s for 5m, 90s for
the 6h baseline, 10s for the alert's 10m), written by deploy/prometheus/render.py.
The sidecar runs ``specctl serve`` with vLLM and torch made unimportable, as in
its slim image. The simulator drives it at a fixed step rate; class math500's
draft acceptance drops to 30% of what it was after 45 s, the other classes stay healthy.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from deploy_support import DEPLOY, dashboard_queries

RENDER = DEPLOY / "prometheus" / "render.py"
HEALTH_CHECK = DEPLOY / "docker" / "grpc_health_check.py"

STEP_RATE = 20  # simulated steps per second
HEALTHY_STEPS = 900  # 45 s before the drop
DROP_STEPS = 1200  # 60 s after it
DROPPED = "math500"
HEALTHY = ("gsm8k", "humaneval", "mbpp")
ALERT = "SpecctlAcceptanceDrop"

# `specctl serve` as the sidecar image runs it: no vLLM, no torch.
SERVE = (
    "import sys; sys.modules['vllm'] = None; sys.modules['torch'] = None; "
    "from specctl.cli import main; sys.exit(main())"
)
SIDECAR_CONFIG = """
[policy]
name = "static"
params = { arm = "eagle3/k=3" }
fallback_arm = "eagle3/k=3"

[log]
format = "json"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def http_json(url: str, params: dict[str, str] | None = None) -> Any:
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def wait_until(what: str, check: Any, timeout_s: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what}: process exited with {process.returncode}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what}: not ready after {timeout_s:.0f}s")


def health(address: str, service: str = "") -> int:
    return subprocess.run(
        [sys.executable, str(HEALTH_CHECK), address, f"--service={service}", "--timeout=1"],
        capture_output=True,
        timeout=30,
    ).returncode


@dataclass
class Stack:
    grpc_address: str
    prometheus_url: str
    simulator: subprocess.Popen[bytes]
    # alerts (labels, state, ...) seen while the simulation ran
    seen: list[dict[str, Any]] = field(default_factory=list)
    # class -> (current, baseline) first-token acceptance, sampled during the run
    acceptance: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    simulator_log: str = ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        reply = http_json(self.prometheus_url + "/api/v1/query", {"query": expr})
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        reply = http_json(self.prometheus_url + "/api/v1/alerts")
        assert reply["status"] == "success", reply
        return list(reply["data"]["alerts"])

    def sample_acceptance(self) -> None:
        pairs = self.query(
            "specctl:first_token_acceptance:ratio_rate5m"
            " and on (workload_class) specctl:first_token_acceptance:ratio_rate6h"
        )
        base = {
            r["metric"]["workload_class"]: float(r["value"][1])
            for r in self.query("specctl:first_token_acceptance:ratio_rate6h")
        }
        for r in pairs:
            cls = r["metric"]["workload_class"]
            if cls in base:
                self.acceptance.setdefault(cls, []).append((float(r["value"][1]), base[cls]))

    def explain(self, cls: str) -> str:
        samples = [f"{c:.2f}/{b:.2f}" for c, b in self.acceptance.get(cls, [])]
        return (
            f"{cls} first-token acceptance, current/baseline: {' '.join(samples)}\n"
            f"alerts seen: {sorted({(a['labels']['alertname'], a['state']) for a in self.seen})}"
            f"\nsimulator: {self.simulator_log[-1500:]}"
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is not installed (make system-deps installs Debian's package)"
    work = tmp_path_factory.mktemp("prometheus")
    grpc_port, metrics_port, web_port = free_port(), free_port(), free_port()
    processes: list[subprocess.Popen[bytes]] = []
    logs = []

    def start(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(work / f"{name}.log", "wb")
        logs.append(log)
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        processes.append(process)
        return process

    try:
        (work / "specctl.toml").write_text(SIDECAR_CONFIG)
        grpc_address = f"127.0.0.1:{grpc_port}"
        sidecar = start(
            "sidecar",
            [
                sys.executable,
                "-c",
                SERVE,
                "serve",
                "--config=specctl.toml",
                f"--listen={grpc_address}",
                f"--metrics-listen=127.0.0.1:{metrics_port}",
            ],
        )
        wait_until("sidecar", lambda: health(grpc_address) == 0, 60, sidecar)

        rules = subprocess.run(
            [
                sys.executable,
                str(RENDER),
                "rules",
                "--window=5m=10s",
                "--window=6h=90s",
                "--for=10m=10s",
                "--interval=1s",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        (work / "specctl.rules.yml").write_text(rules)
        (work / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "rule_files:\n  - specctl.rules.yml\n"
            "scrape_configs:\n  - job_name: specctl\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{metrics_port}']\n"
        )
        url = f"http://127.0.0.1:{web_port}"
        server = start(
            "prometheus",
            [
                prometheus,
                "--config.file=prometheus.yml",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{web_port}",
                "--log.level=warn",
            ],
        )
        wait_until(
            "prometheus",
            lambda: urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200,
            60,
            server,
        )

        simulator = start(
            "simulator",
            [
                sys.executable,
                "-m",
                "specctl.cli",
                "simulate",
                f"--address={grpc_address}",
                "--scenario=qwen3-8b",
                f"--steps={HEALTHY_STEPS + DROP_STEPS}",
                f"--rate={STEP_RATE}",
                "--seed=7",
                f"--event={HEALTHY_STEPS}:accept:{DROPPED}=0.3",
            ],
        )
        s = Stack(grpc_address, url, simulator)
        # Follow the alerts and the acceptance Prometheus records until the simulation ends.
        while simulator.poll() is None:
            s.seen.extend(s.alerts())
            s.sample_acceptance()
            time.sleep(1.0)
        s.seen.extend(s.alerts())
        s.simulator_log = (work / "simulator.log").read_text(errors="replace")
        assert simulator.returncode == 0, s.simulator_log[-2000:]
        assert sidecar.poll() is None, (work / "sidecar.log").read_text()[-2000:]
        yield s
    finally:
        for process in reversed(processes):
            stop(process)
        for log in logs:
            log.close()


def _classes(alerts: list[dict[str, Any]], state: str | None = None) -> set[str]:
    return {
        a["labels"].get("workload_class", "")
        for a in alerts
        if a["labels"]["alertname"] == ALERT and (state is None or a["state"] == state)
    }


def test_acceptance_drop_fires_for_the_class_that_dropped(stack: Stack) -> None:
    firing = _classes(stack.seen, "firing")
    assert DROPPED in firing, stack.explain(DROPPED)
    # and not while it was still healthy: the first samples precede the drop
    early = stack.acceptance[DROPPED][:10]
    assert len(early) == 10 and all(c > 0.7 * b for c, b in early), stack.explain(DROPPED)
    alert = next(
        a
        for a in stack.seen
        if a["labels"]["alertname"] == ALERT and a["labels"]["workload_class"] == DROPPED
    )
    assert alert["labels"]["drafter"] == "eagle3"
    assert alert["labels"]["severity"] == "warning"
    assert f"workload class {DROPPED}" in alert["annotations"]["description"]


def test_acceptance_drop_does_not_fire_for_healthy_classes(stack: Stack) -> None:
    # not even pending, although Prometheus judged their acceptance all along
    assert _classes(stack.seen) & set(HEALTHY) == set()
    for cls in HEALTHY:
        samples = stack.acceptance.get(cls, [])
        assert len(samples) >= 20, stack.explain(cls)
        assert all(current > 0.7 * baseline for current, baseline in samples), stack.explain(cls)


def test_prometheus_scraped_the_sidecar(stack: Stack) -> None:
    up = stack.query('up{job="specctl"}')
    assert [float(r["value"][1]) for r in up] == [1.0]
    reports = stack.query("specctl_reports_received_total")
    assert float(reports[0]["value"][1]) > 0
    # nothing else went wrong on the way
    firing = {a["labels"]["alertname"] for a in stack.seen if a["state"] == "firing"}
    # the short copy shortens every 10m `for`, so an idle sidecar alerts after the run
    assert firing - {ALERT} <= {"SpecctlNoEngineConnected"}, firing


def test_every_dashboard_query_runs(stack: Stack) -> None:
    """Each query of the dashboard is valid PromQL against the real server."""
    returned = 0
    for expr in dashboard_queries():
        query = expr.replace("$__rate_interval", "10s")
        for name in ("job", "instance", "workload_class", "load_bucket", "vllm_job", "model_name"):
            query = query.replace(f"${name}", ".*")
        returned += bool(stack.query(query))
    assert returned >= 10


def test_health_check_script(stack: Stack) -> None:
    assert health(stack.grpc_address, "specctl.v1.SpecController") == 0
    assert health(stack.grpc_address, "no.such.Service") == 1
    assert health(f"127.0.0.1:{free_port()}") == 1
