"""`specctl serve` as a real process, and the client commands against a real sidecar."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from specctl.cli import main
from specctl.testing.scripted_engine import ScriptedEngine, hello, report

ROOT = Path(__file__).resolve().parents[2]


def _specctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specctl.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_help_lists_the_commands_and_serve_documents_its_flags() -> None:
    top = _specctl("--help")
    assert top.returncode == 0, top.stderr
    for command in ("serve", "policy", "evidence", "override"):
        assert command in top.stdout
    serve = _specctl("serve", "--help")
    assert serve.returncode == 0, serve.stderr
    for flag in (
        "--config",
        "--listen",
        "--metrics-listen",
        "--policy",
        "--log-format",
        "--log-level",
        "--admin",
        "--no-admin",
        "--admin-token-file",
    ):
        assert flag in serve.stdout


def test_serve_rejects_a_bad_setting_naming_it() -> None:
    result = _specctl("serve", "--listen", "nowhere")
    assert result.returncode == 2
    assert "server.listen='nowhere'" in result.stderr


def test_serve_exits_zero_on_sigterm_with_an_open_stream() -> None:
    with tempfile.TemporaryDirectory(prefix="specctl-") as tmp:
        address = f"unix://{tmp}/sidecar.sock"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specctl.cli",
                "serve",
                "--listen",
                address,
                "--metrics-listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "SPECCTL_SERVER_GRACE_PERIOD_S": "5"},
        )
        engine = None
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(f"{tmp}/sidecar.sock"):
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "sidecar did not start"
                time.sleep(0.05)
            engine = ScriptedEngine(address)
            engine.send(hello())
            assert engine.recv_policy(timeout=30).version >= 1
            engine.send(report(1))

            proc.send_signal(signal.SIGTERM)
            # exits within the grace period (5 s), well before this timeout
            _, stderr = proc.communicate(timeout=30)
            assert proc.returncode == 0, stderr
            error = engine.wait_closed()
            assert error is not None and "shutting down" in (error.details() or "")
            events = [
                json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")
            ]
            assert events[0] == "sidecar_started"
            assert "engine_connected" in events and events[-1] == "sidecar_stopped"
            assert not os.path.exists(f"{tmp}/sidecar.sock")
        finally:
            if engine is not None:
                engine.close()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_policy_and_evidence_commands(sidecar_factory, capsys: pytest.CaptureFixture[str]) -> None:
    sidecar = sidecar_factory(policy_name="static", policy_params={"arm": "off"})
    assert main(["policy", "--address", sidecar.address]) == 0
    out = capsys.readouterr().out
    assert "policy static version 1" in out
    assert "default" in out and "off=1.000" in out

    assert main(["policy", "--address", sidecar.address, "--json"]) == 0
    policy = json.loads(capsys.readouterr().out)
    assert policy["policy_name"] == "static"
    assert len(policy["entries"]) == 4

    assert main(["evidence", "--address", sidecar.address, "--class", "default", "--json"]) == 0
    evidence = json.loads(capsys.readouterr().out)
    assert [c["workload_class"] for c in evidence["classes"]] == ["default"] * 4

    assert main(["evidence", "--address", sidecar.address]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "policy static version 1"
    # the static policy gives no goodput estimates: shown as "-"
    assert lines[2].split()[:8] == ["default", "0", "off", "1.000", "-", "-", "-", "-"]

    assert main(["evidence", "--address", sidecar.address, "--class", "nope"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err
