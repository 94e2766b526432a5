"""The testbed's regime: step time, acceptance and goodput by batch size, K and workload class.

One vLLM engine (CPU build) serves the testbed target with its derived 1-layer
draft (``draft_model`` method, K up to the largest ``--ks``) and specctl's
scheduler; a sidecar (``specctl serve --policy specctl --admin``) pins every
class to one K at a time through its admin override, so the one engine runs
every K. For each workload class and batch size it runs a batch of requests
(same prompts for every K, ``ignore_eos``) per K, ``--repeats`` times
interleaved, and prints per (class, batch, K) the median of: engine steps, time
per step (wall and engine CPU), output tokens per second (wall and per engine
CPU second), the speedup against K=0 and, with ``--baseline``, against an
engine without speculation, and the per-position acceptance (accepted at
position i / drafts).

K=0 (``off``) on a ``draft_model`` engine is not free: vLLM still runs the
draft's forward pass over each step's new tokens, to keep the draft's KV cache
in step with the target. ``--baseline`` first starts an engine without
speculation to measure that reference too (one engine at a time).

Engine CPU seconds are the CPU time of this process's descendants (vLLM's
engine core, the sidecar excluded): on a CPU engine that is its work, and it
moves far less than wall time when other processes share the machine.

    .venv/bin/python benchmarks/testbed_regime.py [--baseline] [--batches 1,2,4,8,16,32]
        [--ks 0,1,2,4] [--classes greedy,warm,hot] [--max-tokens 64] [--repeats 2]
        [--models DIR] [--hidden 1024 --layers 8 --scale 0.05] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.bench.sidecar_process import SidecarProcess

SCHEDULER_CLS = "specctl.engine.scheduler.SpecctlScheduler"
DRAFTER = "draft_model"
# Fixes vLLM 0.32's CPU rejection sampler for sampled requests (see the module).
CPU_FIX = "specctl.demo.vllm_cpu_fixes.CpuSpecDecodeFixes"
# class -> (temperature, top_p)
CLASSES: dict[str, tuple[float, float]] = {
    "greedy": (0.0, 1.0),
    "warm": (0.6, 1.0),
    "top-p": (1.0, 0.5),
    "hot": (1.0, 1.0),
}
WORDS = ["The quick brown fox", "Speculative decoding", "def add(a, b):", "SELECT name",
         "Goodput is", "Once upon a time", '{"workload_class":', "0123456789 abc"]  # fmt: skip


def pin(sidecar: SidecarProcess, classes: list[str], arm: str) -> None:
    """Pin ``classes`` to ``arm`` ("" clears the pins)."""
    for c in classes:
        sidecar.override(c, arm)
    time.sleep(1.0)  # pushed, and applied by the engine from its next step


def offered_arms(sidecar: SidecarProcess) -> list[str]:
    """The arms of the sidecar's current policy (what the engine offered it)."""
    return sorted({a for e in sidecar.policy_now().entries for a in e.arms})


def engine_cpu_s(exclude: int) -> tuple[float, float]:
    """CPU seconds used so far by this process's descendants except ``exclude`` (the
    sidecar): (all of them, vLLM's model worker alone).

    The first is vLLM's engine core and its worker; on the CPU build the engine core
    busy-waits (``sched_yield``) for the worker's result, so that part counts waiting
    too, as much as the machine's other load lets it spin. The worker's CPU time is the
    forward passes, drafting and sampling: the engine's work, which other load on the
    machine barely moves (it takes turns on the core; it does not make the work bigger).
    """
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    worker: set[int] = set()
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read(64)
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            parent[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
            if cmdline.startswith(b"VLLM::Worker"):  # vLLM's process title for its worker
                worker.add(int(entry))
    me, total, in_worker = os.getpid(), 0.0, 0.0
    for pid, seconds in cpu.items():
        p = pid
        while p > 1 and p not in (me, exclude):
            p = parent.get(p, 1)
        if p == me and pid != me:
            total += seconds
            if pid in worker:
                in_worker += seconds
    return total, in_worker


@dataclass
class Counters:
    steps: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)

    def __sub__(self, other: Counters) -> Counters:
        n = max(len(self.per_pos), len(other.per_pos))
        mine = self.per_pos + [0] * (n - len(self.per_pos))
        theirs = other.per_pos + [0] * (n - len(other.per_pos))
        return Counters(
            self.steps - other.steps,
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            [a - b for a, b in zip(mine, theirs, strict=True)],
        )


def counters(llm: Any) -> Counters:
    """vLLM's own counters since the engine started (summed over label sets)."""
    c = Counters()
    for m in llm.get_metrics():
        if m.name == "vllm:iteration_tokens_total":
            c.steps += int(m.count)
        elif m.name == "vllm:spec_decode_num_drafts":
            c.drafts += int(m.value)
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            c.draft_tokens += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            c.accepted += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = list(m.values)
            if len(c.per_pos) < len(values):
                c.per_pos += [0] * (len(values) - len(c.per_pos))
            c.per_pos = [a + b for a, b in zip(c.per_pos, values + [0] * 64, strict=False)]
    return c


def requests(
    workload_class: str, n: int, max_tokens: int, offset: int
) -> tuple[list[str], list[Any]]:
    from vllm import SamplingParams

    temperature, top_p = CLASSES[workload_class]
    prompts = [f"{WORDS[(i + offset) % len(WORDS)]} {i + offset}" for i in range(n)]
    params = [
        SamplingParams(
            temperature=temperature, top_p=top_p, seed=None if temperature == 0 else offset + i,
            max_tokens=max_tokens, ignore_eos=True, extra_args={"workload_class": workload_class},
        )
        for i in range(n)
    ]  # fmt: skip
    return prompts, params


@dataclass
class Run:
    tokens: int
    wall_s: float
    engine_cpu_s: float
    worker_cpu_s: float
    counters: Counters
    token_ids: list[list[int]]


def run(llm: Any, workload_class: str, n: int, max_tokens: int, offset: int, exclude: int) -> Run:
    prompts, params = requests(workload_class, n, max_tokens, offset)
    c0, (cpu0, worker0), t0 = counters(llm), engine_cpu_s(exclude), time.monotonic()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.monotonic() - t0
    cpu1, worker1 = engine_cpu_s(exclude)
    ids = [list(o.outputs[0].token_ids) for o in outs]
    return Run(sum(map(len, ids)), wall, cpu1 - cpu0, worker1 - worker0, counters(llm) - c0, ids)


def start_engine(
    target: Path, draft: Path | None, max_k: int, max_seqs: int, cpu_fix: bool
) -> tuple[Any, float]:
    from vllm import LLM

    spec = (
        None
        if draft is None
        else {"method": DRAFTER, "model": str(draft), "num_speculative_tokens": max_k}
    )
    t0 = time.monotonic()
    llm = LLM(
        model=str(target), dtype="float32", enforce_eager=True, max_model_len=512,
        max_num_seqs=max_seqs, seed=0, speculative_config=spec, scheduler_cls=SCHEDULER_CLS,
        disable_log_stats=False, worker_extension_cls=CPU_FIX if cpu_fix else "",
    )  # fmt: skip
    return llm, time.monotonic() - t0


def arm_of(k: int) -> str:
    return "off" if k == 0 else f"{DRAFTER}/k={k}"


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Medians over repeats of the per-run rates; acceptance from the summed counters."""
    med = statistics.median
    drafts = sum(r.counters.drafts for r in runs)
    per_pos = [sum(vals) for vals in zip(*(r.counters.per_pos for r in runs), strict=False)]
    return {
        "tokens": med(r.tokens for r in runs),
        "steps": med(r.counters.steps for r in runs),
        "ms_per_step_wall": med(1e3 * r.wall_s / max(r.counters.steps, 1) for r in runs),
        "ms_per_step_worker": med(1e3 * r.worker_cpu_s / max(r.counters.steps, 1) for r in runs),
        "tok_s_wall": med(r.tokens / r.wall_s for r in runs),
        "tok_s_worker": med(r.tokens / max(r.worker_cpu_s, 1e-9) for r in runs),
        "tok_s_engine_cpu": med(r.tokens / max(r.engine_cpu_s, 1e-9) for r in runs),
        "tokens_per_step": med(r.tokens / max(r.counters.steps, 1) for r in runs),
        "acceptance_per_pos": [a / drafts for a in per_pos] if drafts else [],
        "drafts": drafts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8,16,32")
    parser.add_argument("--ks", default="0,1,2,4")
    parser.add_argument("--classes", default="greedy,warm,hot")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--baseline", action="store_true", help="also an engine without spec")
    parser.add_argument("--models", help="model cache directory (default: a temporary one)")
    parser.add_argument("--hidden", type=int, help="target hidden size (default: the testbed's)")
    parser.add_argument("--layers", type=int, help="target layers (default: the testbed's)")
    parser.add_argument("--scale", type=float, help="residual scale of layers 1..")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--no-cpu-fix",
        action="store_true",
        help="run vLLM's CPU rejection sampler as shipped (sampled requests then verify "
        "drafts against uninitialized temperatures: controller/demo/vllm_cpu_fixes.py)",
    )
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    ks = sorted({int(k) for k in args.ks.split(",")})
    classes = args.classes.split(",")
    unknown = set(classes) - set(CLASSES)
    if unknown or max(ks) < 1:
        parser.error(f"classes must be among {sorted(CLASSES)}; --ks needs a K >= 1")

    from specctl.demo.testbed_model import TestbedConfig, build_testbed_models

    defaults = TestbedConfig()
    config = TestbedConfig(
        hidden_size=args.hidden or defaults.hidden_size,
        num_layers=args.layers or defaults.num_layers,
        residual_scale=defaults.residual_scale if args.scale is None else args.scale,
    )
    workdir = Path(tempfile.mkdtemp(prefix="specctl-tb-"))
    t0 = time.monotonic()
    target, draft = build_testbed_models(Path(args.models) if args.models else workdir, config)
    print(f"models {config} ready in {time.monotonic() - t0:.1f} s", flush=True)
    sidecar = SidecarProcess(workdir, workdir, load_bucket_bounds=None)
    sidecar.start("specctl")
    os.environ.update(
        SPECCTL_ADDRESS=sidecar.address, SPECCTL_SEED="0", SPECCTL_REPORT_INTERVAL_S="0.1",
        VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
    )  # fmt: skip
    pid = sidecar.proc.pid
    results: dict[str, Any] = {"config": config.to_json(), "max_tokens": args.max_tokens}
    rows: dict[tuple[str, int, str], dict[str, Any]] = {}
    try:
        if args.baseline:
            llm, start_s = start_engine(target, None, 0, max(batches), not args.no_cpu_fix)
            results["baseline_start_s"] = start_s
            print(f"engine without speculation started in {start_s:.1f} s", flush=True)
            try:
                for c in classes:
                    for b in batches:
                        runs = [
                            run(llm, c, b, args.max_tokens, 1000 * r, pid)
                            for r in range(args.repeats)
                        ]
                        rows[(c, b, "none")] = summarize(runs)
                        print(c, b, "none", _short(rows[(c, b, "none")]), flush=True)
            finally:
                llm.llm_engine.engine_core.shutdown()
                del llm
        llm, start_s = start_engine(target, draft, max(ks), max(batches), not args.no_cpu_fix)
        results["start_s"] = start_s
        print(f"engine with {DRAFTER} K<={max(ks)} started in {start_s:.1f} s", flush=True)
        mismatches = 0
        try:
            for c in classes:
                for b in batches:
                    per_k: dict[int, list[Run]] = {k: [] for k in ks}
                    for r in range(args.repeats):
                        for k in ks:
                            pin(sidecar, classes, arm_of(k))
                            per_k[k].append(run(llm, c, b, args.max_tokens, 1000 * r, pid))
                        if CLASSES[c][0] == 0.0:  # greedy: speculation never changes text
                            ref = per_k[ks[0]][-1].token_ids
                            mismatches += sum(per_k[k][-1].token_ids != ref for k in ks[1:])
                    for k in ks:
                        rows[(c, b, arm_of(k))] = summarize(per_k[k])
                        print(c, b, arm_of(k), _short(rows[(c, b, arm_of(k))]), flush=True)
            pin(sidecar, classes, "")  # back to the learning policy: every arm in its entries
            results["arms"] = offered_arms(sidecar)
        finally:
            llm.llm_engine.engine_core.shutdown()
        results["greedy_mismatches"] = mismatches
    finally:
        sidecar.stop()

    print_tables(rows, classes, batches, ks, args.baseline)
    print(f"\nengine start: {results['start_s']:.1f} s with {DRAFTER}", end="")
    if "baseline_start_s" in results:
        print(f", {results['baseline_start_s']:.1f} s without speculation", end="")
    print(f"; greedy outputs differing from K={ks[0]}: {results['greedy_mismatches']}")
    print("arms the engine offered the sidecar:", ", ".join(results["arms"]))
    if args.json:
        results["rows"] = [
            {"class": c, "batch": b, "arm": a, **v} for (c, b, a), v in sorted(rows.items())
        ]
        Path(args.json).write_text(json.dumps(results, indent=1))


def _short(row: dict[str, Any]) -> str:
    acc = " ".join(f"{a:.2f}" for a in row["acceptance_per_pos"])
    return (
        f"steps {row['steps']:.0f} ms/step {row['ms_per_step_wall']:.1f} "
        f"(worker {row['ms_per_step_worker']:.1f}) tok/s {row['tok_s_wall']:.1f} "
        f"(worker {row['tok_s_worker']:.1f}, engine {row['tok_s_engine_cpu']:.1f}) acc [{acc}]"
    )


def print_tables(
    rows: dict[tuple[str, int, str], dict[str, Any]],
    classes: list[str],
    batches: list[int],
    ks: list[int],
    baseline: bool,
) -> None:
    arms = (["none"] if baseline else []) + [arm_of(k) for k in ks]
    print("\nstep time, ms per engine step (wall / worker CPU), first class:")
    print(f"{'batch':>5} " + " ".join(f"{a:>20}" for a in arms))
    for b in batches:
        cells = [rows.get((classes[0], b, a)) for a in arms]
        print(
            f"{b:>5} "
            + " ".join(
                f"{x['ms_per_step_wall']:>9.1f} / {x['ms_per_step_worker']:>8.1f}"
                if x
                else " " * 20
                for x in cells
            )
        )
    ref = "none" if baseline else arm_of(ks[0])
    for metric, label in (
        ("tok_s_worker", "per worker CPU second"),
        ("tok_s_wall", "per wall second"),
        ("tok_s_engine_cpu", "per engine CPU second (engine core and worker)"),
    ):
        print(f"\noutput tokens {label}; in brackets the speedup over {ref}:")
        print(f"{'class':>7} {'batch':>5} " + " ".join(f"{a:>20}" for a in arms))
        for c in classes:
            for b in batches:
                base = rows.get((c, b, ref))
                cells = []
                for a in arms:
                    x = rows.get((c, b, a))
                    if x is None or base is None:
                        cells.append(" " * 20)
                    else:
                        cells.append(f"{x[metric]:>11.1f} ({x[metric] / base[metric]:.2f}x)")
                print(f"{c:>7} {b:>5} " + " ".join(cells))
    print(f"\nacceptance per draft position at {arm_of(max(ks))} (accepted at i / drafts):")
    for c in classes:
        for b in batches:
            x = rows.get((c, b, arm_of(max(ks))))
            if x and x["acceptance_per_pos"]:
                acc = " ".join(f"{a:.2f}" for a in x["acceptance_per_pos"][: max(ks)])
                per_request = x["tokens_per_step"] / b
                print(f"{c:>7} {b:>5}  {acc}  (tokens per request per step {per_request:.2f})")


if __name__ == "__main__":
    main()
