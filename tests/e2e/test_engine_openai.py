"""specctl's scheduler behind vLLM's OpenAI-compatible server, classes sent as ``vllm_xargs``.

One ``vllm serve``-equivalent process (``--scheduler-cls``) for the module,
the real sidecar as its own process with a static n-gram policy, so that
every decode step of every class is counted by class in the sidecar's metrics.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_support import VLLM_ENV, SidecarProcess, free_port

from specctl.bench.vllm_server import SCHEDULER_CLS
from specctl.testing.tiny_engine import NGRAM

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def sidecar() -> Iterator[SidecarProcess]:
    sc = SidecarProcess(Path(tempfile.mkdtemp(prefix="specctl-o-")), policy="static")
    sc.start(config='[policy]\nname = "static"\nparams = { arm = "ngram/k=4" }\n')
    yield sc
    sc.stop()
    shutil.rmtree(sc.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def server(sidecar: SidecarProcess, tiny_model: str) -> Iterator[str]:
    port = free_port()
    log_path = sidecar.workdir / "vllm.log"
    env = {**os.environ, **VLLM_ENV, "SPECCTL_ADDRESS": sidecar.address,
           "SPECCTL_REPORT_INTERVAL_S": "0.1"}  # fmt: skip
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", tiny_model, "--served-model-name", "tiny",
            "--host", "127.0.0.1", "--port", str(port),
            "--scheduler-cls", SCHEDULER_CLS,
            "--speculative-config", json.dumps(NGRAM),
            "--enforce-eager", "--dtype", "float32",
            "--max-model-len", "512", "--max-num-seqs", "16",
        ],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited: {log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("vLLM did not start in 600 s") from None
                time.sleep(1.0)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _complete(base: str, prompt: str, xargs: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "prompt": prompt, "max_tokens": 32,
                            "temperature": 0.0, "ignore_eos": True}  # fmt: skip
    if xargs is not None:
        body["vllm_xargs"] = xargs
    request = urllib.request.Request(
        base + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        return dict(json.loads(response.read()))


def _rounds_by_class(sidecar: SidecarProcess) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in sidecar.metrics().splitlines():
        if line.startswith("specctl_request_rounds_total{"):
            labels, value = line.rsplit(" ", 1)
            cls = labels.split('workload_class="', 1)[1].split('"', 1)[0]
            out[cls] = out.get(cls, 0.0) + float(value)
    return out


def test_classes_from_vllm_xargs_reach_the_sidecar(server: str, sidecar: SidecarProcess) -> None:
    chat = _complete(server, "The quick brown fox", {"workload_class": "chat"})
    code = _complete(server, "def add(a, b):", {"workload_class": "code", "other": 3})
    bad = _complete(server, "SELECT name", {"workload_class": "not a class!"})
    none = _complete(server, "Once upon a time", None)
    for reply in (chat, code, bad, none):
        assert reply["usage"]["completion_tokens"] == 32
        assert reply["choices"][0]["finish_reason"] == "length"

    deadline = time.monotonic() + 15
    rounds = _rounds_by_class(sidecar)
    while time.monotonic() < deadline and not {"chat", "code", "default"} <= set(rounds):
        time.sleep(0.2)
        rounds = _rounds_by_class(sidecar)
    assert rounds.get("chat", 0) > 0 and rounds.get("code", 0) > 0
    assert rounds.get("default", 0) > 0  # the invalid class and the request without one
    assert all(" " not in c for c in rounds), rounds


def test_greedy_text_is_the_same_with_speculation_off(server: str, sidecar: SidecarProcess) -> None:
    prompts = ["The quick brown fox 1", "Goodput is 2", '{"workload_class": 3']
    with_k4 = [
        _complete(server, p, {"workload_class": "chat"})["choices"][0]["text"] for p in prompts
    ]
    sidecar.override("chat", "off")
    time.sleep(1.0)
    without = [
        _complete(server, p, {"workload_class": "chat"})["choices"][0]["text"] for p in prompts
    ]
    assert with_k4 == without
