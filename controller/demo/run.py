"""``specctl demo``: a real vLLM engine with specctl's scheduler, the sidecar and a mixed workload.

It builds a tiny random Llama (no download), starts ``specctl serve`` on a
unix socket and vLLM's OpenAI-compatible server with
``--scheduler-cls controller.engine.scheduler.SpecctlScheduler`` and the
n-gram drafter, sends three workload classes through the HTTP API, and shows
per-class acceptance and the chosen arms while it runs. It then measures the
same workload with speculation forced off and pinned to the engine's static
setting (through the sidecar's operator overrides, on the same engine, so the
three numbers are side by side in one run) and writes a report, a JSON file
and a PNG plot. Everything it starts is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATIC_ARM = "ngram/k=4"
SCHEDULER_CLS = "controller.engine.scheduler.SpecctlScheduler"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo-out", help="directory for the report (demo-out)")
    parser.add_argument(
        "--learn-s", type=float, default=60.0, help="seconds of traffic while specctl learns (60)"
    )
    parser.add_argument(
        "--measure-s",
        type=float,
        default=25.0,
        help="seconds per measured phase: no speculation, static, specctl (25)",
    )
    parser.add_argument("--concurrency", type=int, default=12, help="concurrent clients (12)")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per request (48)")
    parser.add_argument("--port", type=int, default=0, help="vLLM HTTP port (0: a free one)")


@dataclass
class Timeline:
    """Per-class acceptance and expected K, sampled from the sidecar while the demo runs."""

    t0: float = field(default_factory=time.monotonic)
    rows: list[dict[str, Any]] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f}s; see {log}")


def _stop(proc: subprocess.Popen[bytes] | None, grace_s: float = 15.0) -> None:
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
        proc.wait(timeout=5)


class Sidecar:
    """A gRPC client for the demo's sidecar: evidence for the live view, overrides for phases."""

    def __init__(self, address: str, token: str) -> None:
        import grpc

        from controller.api import pb, pb_grpc

        self._pb = pb
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.SpecControllerStub(self._channel)
        self._admin = pb_grpc.SpecControllerAdminStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),)

    def evidence(self) -> Any:
        return self._stub.GetEvidence(self._pb.GetEvidenceRequest(), timeout=5)

    def override(self, workload_class: str, arm: str) -> None:
        self._admin.SetOverride(
            self._pb.SetOverrideRequest(workload_class=workload_class, arm=arm),
            metadata=self._metadata,
            timeout=5,
        )

    def close(self) -> None:
        self._channel.close()


def _summarise(evidence: Any) -> dict[str, dict[str, Any]]:
    """Per class (all load buckets pooled by rounds): acceptance at position 1, E[K], top arm."""
    out: dict[str, dict[str, Any]] = {}
    for ce in evidence.classes:
        cur = out.get(ce.workload_class)
        if ce.rounds <= 0 or (cur is not None and cur["rounds"] >= ce.rounds):
            continue
        expected_k = 0.0
        top, top_p = "off", 0.0
        for a in ce.arms:
            k = 0 if a.arm == "off" else int(a.arm.rsplit("=", 1)[1])
            expected_k += a.probability * k
            if a.probability > top_p:
                top, top_p = a.arm, a.probability
        acc1 = None
        for d in ce.drafters:
            if len(d.conditional_acceptance) and len(d.observations) and d.observations[0] > 0:
                acc1 = float(d.conditional_acceptance[0])
        out[ce.workload_class] = {
            "rounds": float(ce.rounds),
            "acceptance_pos1": acc1,
            "expected_k": expected_k,
            "top_arm": top,
            "top_probability": top_p,
            "explanation": ce.explanation or ce.override_arm,
        }
    return out


def _scrape_acceptance(metrics_url: str) -> dict[str, tuple[float, float]]:
    """Per class: (accepted, drafted) tokens so far, from the sidecar's own counters."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    totals: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("specctl_accepted_tokens", "specctl_draft_tokens"):
            continue
        slot = 0 if family.name == "specctl_accepted_tokens" else 1
        for sample in family.samples:
            if sample.name.endswith("_total"):
                c = sample.labels.get("workload_class", "")
                totals.setdefault(c, [0.0, 0.0])[slot] += sample.value
    return {c: (v[0], v[1]) for c, v in totals.items()}


def _print_live(phase: str, summary: dict[str, dict[str, Any]], elapsed: float) -> None:
    lines = [f"[{elapsed:6.1f}s] {phase}"]
    for name in sorted(summary):
        s = summary[name]
        acc = "  n/a" if s.get("acceptance") is None else f"{s['acceptance']:5.2f}"
        lines.append(
            f"    {name:<10} rounds {s['rounds']:8.0f}  acceptance {acc}  "
            f"E[K] {s['expected_k']:4.2f}  top {s['top_arm']} ({s['top_probability']:.2f})"
        )
    print("\n".join(lines), flush=True)


def _plot(timeline: Timeline, phases: list[tuple[str, float, float]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    classes = sorted({r["class"] for r in timeline.rows})
    fig, (ax_k, ax_a) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for c in classes:
        rows = [r for r in timeline.rows if r["class"] == c]
        t = [r["t"] for r in rows]
        ax_k.plot(t, [r["expected_k"] for r in rows], label=c)
        ax_a.plot(t, [r.get("acceptance") for r in rows], label=c)
    for name, start, end in phases:
        for ax in (ax_k, ax_a):
            ax.axvspan(start, end, alpha=0.06)
        ax_k.text(start, ax_k.get_ylim()[1] * 0.95, name, fontsize=8, va="top")
    ax_k.set_ylabel("expected K of the policy")
    ax_a.set_ylabel("draft acceptance rate\n(measured, per 2 s)")
    ax_a.set_xlabel("seconds")
    ax_k.legend(loc="upper right")
    fig.suptitle("specctl demo: arm choices and acceptance per workload class")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run(args: argparse.Namespace) -> int:
    from controller.demo.tiny_model import build_tiny_model
    from controller.demo.workload import DEMO_CLASSES, PhaseResult, run_phase

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="specctl-demo-"))
    token = secrets.token_hex(16)
    (tmp / "admin.token").write_text(token)
    (tmp / "admin.token").chmod(0o600)
    socket_path = tmp / "specctl.sock"
    address = f"unix://{socket_path}"
    port = args.port or _free_port()
    metrics_port = _free_port()
    base_url = f"http://127.0.0.1:{port}"

    print(f"building the tiny model in {out / 'tiny-model'} ...", flush=True)
    model = str(build_tiny_model(out / "tiny-model"))

    sidecar_proc: subprocess.Popen[bytes] | None = None
    vllm_proc: subprocess.Popen[bytes] | None = None
    client: Sidecar | None = None
    interrupted = False
    try:
        sidecar_log = out / "sidecar.log"
        sidecar_proc = subprocess.Popen(
            [
                sys.executable, "-m", "controller.cli", "serve",
                "--listen", address,
                "--metrics-listen", f"127.0.0.1:{metrics_port}",
                "--policy", "specctl",
                "--admin", "--admin-token-file", str(tmp / "admin.token"),
                "--log-format", "json",
            ],
            stdout=sidecar_log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        _wait_http(f"http://127.0.0.1:{metrics_port}/metrics", sidecar_proc, 30, sidecar_log)
        print(f"sidecar up on {address}, metrics on :{metrics_port}", flush=True)

        vllm_log = out / "vllm.log"
        env = dict(os.environ)
        env.update(
            SPECCTL_ADDRESS=address,
            VLLM_CPU_KVCACHE_SPACE="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        spec = {"method": "ngram", "num_speculative_tokens": 4,
                "prompt_lookup_max": 4, "prompt_lookup_min": 1}  # fmt: skip
        vllm_proc = subprocess.Popen(
            [
                sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", model, "--served-model-name", "tiny",
                "--host", "127.0.0.1", "--port", str(port),
                "--scheduler-cls", SCHEDULER_CLS,
                "--speculative-config", json.dumps(spec),
                "--enforce-eager", "--dtype", "float32",
                "--max-model-len", "512", "--max-num-seqs", "32",
            ],
            stdout=vllm_log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )  # fmt: skip
        print("starting vLLM (CPU build) with specctl's scheduler ...", flush=True)
        _wait_http(f"{base_url}/health", vllm_proc, 300, vllm_log)
        print(f"vLLM up on {base_url}", flush=True)

        client = Sidecar(address, token)
        timeline = Timeline()
        phases: list[tuple[str, float, float]] = []
        results: list[PhaseResult] = []
        class_names = [c.name for c in DEMO_CLASSES] + ["default"]
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        last_counts: dict[str, tuple[float, float]] = {}

        def phase(name: str, seconds: float, pin: str | None) -> PhaseResult:
            assert client is not None
            for c in class_names:
                client.override(c, pin or "")

            def tick() -> None:
                assert client is not None
                summary = _summarise(client.evidence())
                counts = _scrape_acceptance(metrics_url)
                for c, s in summary.items():
                    acc, drafted = counts.get(c, (0.0, 0.0))
                    prev_acc, prev_drafted = last_counts.get(c, (0.0, 0.0))
                    d = drafted - prev_drafted
                    s["acceptance"] = (acc - prev_acc) / d if d > 0 else None
                last_counts.update(counts)
                now = time.monotonic() - timeline.t0
                for c, s in summary.items():
                    timeline.rows.append({"t": now, "class": c, "phase": name, **s})
                _print_live(name, summary, now)

            start = time.monotonic() - timeline.t0
            res = asyncio.run(
                run_phase(name, base_url, "tiny", duration_s=seconds,
                          concurrency=args.concurrency, max_tokens=args.max_tokens,
                          seed=len(phases), on_tick=tick)
            )  # fmt: skip
            phases.append((name, start, time.monotonic() - timeline.t0))
            print(
                f"== {name}: {res.output_tokens_per_s:.1f} output tok/s "
                f"({res.requests} requests, {res.failed} failed)",
                flush=True,
            )
            return res

        phase("specctl learning", args.learn_s, None)
        results.append(phase("no speculation", args.measure_s, "off"))
        results.append(phase(f"static {STATIC_ARM}", args.measure_s, STATIC_ARM))
        results.append(phase("specctl", args.measure_s, None))
        final = _summarise(client.evidence())

        report = {
            "phases": [
                {"name": r.name, "output_tokens_per_s": r.output_tokens_per_s,
                 "requests": r.requests, "failed": r.failed, "wall_s": r.wall_s,
                 "tokens_by_class": r.tokens_by_class}
                for r in results
            ],
            "classes": final,
            "timeline": timeline.rows,
        }  # fmt: skip
        (out / "report.json").write_text(json.dumps(report, indent=2))
        plotted = _plot(timeline, phases, out / "demo.png")
        base = results[0].output_tokens_per_s or 1.0
        lines = [
            "",
            "specctl demo report",
            "",
            f"{'phase':<22}{'output tok/s':>14}{'vs no spec':>12}{'failed':>8}",
        ]
        for r in results:
            lines.append(
                f"{r.name:<22}{r.output_tokens_per_s:>14.1f}"
                f"{r.output_tokens_per_s / base:>11.2f}x{r.failed:>8}"
            )
        lines += ["", f"{'class':<12}{'accept@1':>10}{'E[K]':>7}  chosen arm"]
        for c in sorted(final):
            s = final[c]
            acc = "n/a" if s["acceptance_pos1"] is None else f"{s['acceptance_pos1']:.2f}"
            # accept@1: the policy's posterior mean at position 1
            lines.append(
                f"{c:<12}{acc:>10}{s['expected_k']:>7.2f}  {s['top_arm']} "
                f"(p={s['top_probability']:.2f}) {s['explanation']}"
            )
        lines += [
            "",
            "(no speculation and static are the same engine with the class pinned through the "
            "sidecar's override; the n-gram drafter is cheap on this CPU model)",
            f"report: {out / 'report.json'}" + (f", plot: {out / 'demo.png'}" if plotted else ""),
        ]
        text = "\n".join(lines)
        (out / "report.txt").write_text(text + "\n")
        print(text, flush=True)
        return 0 if all(r.failed == 0 for r in results) else 1
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: shutting down", flush=True)
        return 130
    finally:
        if client is not None:
            client.close()
        _stop(vllm_proc)
        _stop(sidecar_proc)
        if not interrupted:
            print("stopped vLLM and the sidecar", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specctl demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
