"""``specctl demo``: specctl against static arms on a real vLLM engine, with a live view.

The demo is a short preset of the real-engine benchmark (``specctl bench
--engine vllm --workload demo``): it builds the testbed (a target whose decode
is memory-bound at small batch and compute-bound at large batch, and a draft
model derived from it; no download), starts ``specctl serve`` and vLLM's
OpenAI-compatible server with specctl's scheduler, and sends four workload
classes (greedy, temperature 0.15, temperature 1.0, and a greedy class with a
repetition penalty below 1 that copies its context, where n-gram drafts win)
at low and then high concurrency. In each phase it sweeps a few static arms (every class pinned
through the sidecar's override, on the same engine) and runs specctl, and
prints while specctl learns each class's most likely arm, its probability and
how steady the decision is. At the end it prints side by side no speculation,
the best static arm of the sweep and specctl (committed tokens per second,
per phase), the oracle (the best static arm per class and phase in
hindsight) and the arm specctl chose per class, and writes the benchmark's
JSON, ``demo.png`` (arm choices and decision stability over time) and
``bench.png``. Ctrl-C stops everything it started.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEMO_WORKLOAD = "demo"
# The clock the side-by-side view reads. A CPU engine's core busy-waits for its worker by
# fits and starts, so its CPU time is not proportional to the work a step does (steps that
# draft burn fewer CPU seconds per wall second than steps that do not); the wall clock is
# what a user waits on.
CLOCK = "wall"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="results (demo-out)")
    parser.add_argument(
        "--models",
        type=Path,
        default=Path.home() / ".cache" / "specctl" / "models",
        help="where the testbed is built and cached (~/.cache/specctl/models)",
    )
    parser.add_argument(
        "--workload",
        default=DEMO_WORKLOAD,
        help="the workload to run with the demo's view (default: the packaged 'demo')",
    )
    parser.add_argument(
        "--warmup-s", type=float, help="seconds specctl learns per phase before it is measured"
    )
    parser.add_argument("--port", type=int, default=0, help="vLLM HTTP port (0: a free one)")


def live_line(meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], elapsed: float) -> str:
    """One line per evidence sample: per class (at the current load) its most likely arm,
    that arm's probability, how long it has been the mode and how often the mode flipped."""
    stage = "measuring" if meta.get("measured") else "learning"
    parts = []
    for r in rows:
        if not r["current"]:
            continue
        dwell = "" if r["mode_dwell_s"] is None else f" dwell {r['mode_dwell_s']:.0f}s"
        flips = "" if r["mode_flips_total"] is None else f" flips {r['mode_flips_total']}"
        parts.append(f"{r['class']} {r['top_arm']} {r['top_p']:.2f}{dwell}{flips}")
    return f"[{elapsed:7.1f}s] {meta['policy']} {meta['phase']} {stage}: " + " | ".join(parts)


def chosen_arms(out: Mapping[str, Any], policy: str = "specctl") -> dict[str, dict[str, Any]]:
    """Per class and phase: the policy's most likely arm at the current load at the end of
    its last segment in that phase, its probability, and the share of rounds run off."""
    result: dict[str, dict[str, Any]] = {}
    entry = out["policies"].get(policy)
    if entry is None:
        return result
    for c in (c["name"] for c in out["workload"]["classes"]):
        result[c] = {}
        for p in (p["name"] for p in out["workload"]["phases"]):
            rows = [
                r
                for r in out["timeline"]
                if r["policy"] == policy and r["class"] == c and r["phase"] == p and r["current"]
            ]
            last = rows[-1] if rows else None
            result[c][p] = {
                "arm": last["top_arm"] if last else None,
                "p": last["top_p"] if last else None,
                "off_share": entry["off_share_by_phase"][p].get(c),
                "mode_flips": last["mode_flips_total"] if last else None,
            }
    return result


def format_side_by_side(out: Mapping[str, Any]) -> str:
    """No speculation, the best static arm, specctl and the oracle per phase and overall;
    then specctl's chosen arm per class and phase."""
    phases = [p["name"] for p in out["workload"]["phases"]]
    clients = {p["name"]: sum(p["clients"].values()) for p in out["workload"]["phases"]}
    pol = out["policies"]
    oracle = out["oracle"][CLOCK]
    best = oracle["best_static_arm"]
    off = pol.get("static:off")

    def off_goodput(phase: str | None) -> float | None:
        if off is None:
            return None
        e = off[CLOCK] if phase is None else off[CLOCK]["phases"][phase]
        return e["goodput"]["median"]

    def cell(value: float | None, phase: str | None) -> str:
        if value is None:
            return "-"
        ref = off_goodput(phase)
        return f"{value:.1f} ({value / ref:.2f}x)" if ref else f"{value:.1f}"

    head = "".join(f"{f'{p} ({clients[p]} clients)':>24}" for p in phases)
    lines = [
        "committed tokens per second (in brackets: vs no speculation)",
        f"{'':<28}{head}{'overall':>20}{'tok/CPU s':>12}",
    ]
    rows = [("no speculation", "static:off"), (f"best static {best}", f"static:{best}")]
    for label, name in [*rows, ("specctl", "specctl")]:
        if name not in pol:
            continue
        e = pol[name][CLOCK]
        cells = "".join(f"{cell(e['phases'][p]['goodput']['median'], p):>24}" for p in phases)
        cpu = pol[name]["cpu"]["goodput"]["median"] or 0.0
        lines.append(f"{label:<28}{cells}{cell(e['goodput']['median'], None):>20}{cpu:>12.1f}")
    cells = "".join(f"{cell(sum_oracle(out, p), p):>24}" for p in phases)
    total = cell(oracle["goodput"]["median"], None)
    lines.append(f"{'oracle (best arm per class)':<28}{cells}{total:>20}")
    if "specctl" not in pol:
        return "\n".join(lines)
    h = out["headline"][CLOCK]
    lines += [
        "",
        f"specctl / oracle {_f(h['vs_oracle']['median'])}, / best static "
        f"{_f(h['vs_best_static']['median'])}, / no speculation "
        f"{_f(h['vs_no_spec']['median'])} (per second)",
        "",
        "per class and phase: the oracle's arm; specctl's most likely arm at the end of the",
        "phase, its probability, and the share of the class's request-rounds it ran off",
    ]
    for c, per_phase in chosen_arms(out).items():
        parts = []
        for p in phases:
            x = per_phase[p]
            prob = "" if x["p"] is None else f" {x['p']:.2f}"
            share = "" if x["off_share"] is None else f", off {x['off_share']:.0%}"
            parts.append(
                f"{p}: oracle {oracle['arms'][p][c]}, specctl {x['arm'] or '-'}{prob}{share}"
            )
        lines.append(f"  {c:<8} " + "; ".join(parts))
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def sum_oracle(out: Mapping[str, Any], phase: str) -> float | None:
    """The oracle's goodput in a phase: the sum over classes of its arm's class goodput."""
    arms = out["oracle"][CLOCK]["arms"][phase]
    total = 0.0
    for c, arm in arms.items():
        if not arm:
            return None
        v = out["policies"][f"static:{arm}"][CLOCK]["phases"][phase]["classes"][c]["goodput"]
        if v["median"] is None:
            return None
        total += v["median"]
    return total


def run(args: argparse.Namespace) -> int:
    from specctl.bench.cli import write_outputs
    from specctl.bench.engine_bench import BenchOptions, EngineBench
    from specctl.bench.processes import ProcessError
    from specctl.bench.report import benchmark_json
    from specctl.bench.workload_file import load_workload
    from specctl.bench.workload_values import WorkloadError

    try:
        workload = load_workload(args.workload)
    except WorkloadError as exc:
        print(f"specctl demo: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {line}", flush=True)

    def on_sample(meta: Mapping[str, Any], rows: list[dict[str, Any]]) -> None:
        print(live_line(meta, rows, time.monotonic() - started), flush=True)

    options = BenchOptions(
        out=args.out,
        models_dir=args.models,
        warmup_s=args.warmup_s,
        port=args.port,
        progress=progress,
        on_sample=on_sample,
    )
    try:
        raw = EngineBench(workload, options).run()
    except KeyboardInterrupt:
        print("\ninterrupted: stopped vLLM and the sidecar", flush=True)
        return 130
    except (ProcessError, FileNotFoundError, ValueError) as exc:
        print(f"specctl demo: {exc}", file=sys.stderr)
        return 1
    out = benchmark_json(workload, raw, seed=0)
    paths = write_outputs(out, args.out, timeline_name="demo.png")
    text = format_side_by_side(out)
    (args.out / "demo.txt").write_text(text + "\n")
    print()
    print(text)
    print()
    print(f"took {raw['elapsed_s'] / 60:.1f} min; wrote " + ", ".join(str(p) for p in paths))
    failed = sum(c["failed"] for s in out["segments"] for c in s["classes"].values())
    if failed:
        print(f"specctl demo: {failed} requests failed (see {args.out / 'bench.json'})")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specctl demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
