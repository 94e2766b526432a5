"""End-to-end output tokens per second on the CPU engine: no speculation, static K, specctl.

One vLLM engine (CPU build, the tiny random Llama, n-gram drafter with K up to 4,
specctl's scheduler) and one sidecar (``specctl serve --policy specctl``). The
workload mixes two classes: greedy requests (the random model loops, n-gram
drafts are often accepted) and temperature-1.0 requests (drafts almost never
are). After a learning phase, the same batches run in rounds, each round
measuring, side by side, every class pinned ``off``, every class pinned to
``ngram/k=4``, and specctl's own policy (no pins). It prints output tokens per
second of wall time and per CPU second of the engine's processes (the engine's
time on a CPU engine; unlike wall time, unaffected by other load on the machine).

    .venv/bin/python benchmarks/e2e_throughput.py [--rounds 3] [--requests 32] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from specctl.bench.sidecar_process import SidecarProcess

CLASSES = ("greedy", "hot")
WORDS = ["The quick brown fox", "Speculative decoding", "def add(a, b):", "SELECT name",
         "Goodput is", "Once upon a time", '{"workload_class":', "0123456789 abc"]  # fmt: skip


def pin(sidecar: SidecarProcess, arm: str) -> None:
    """Pin every class to ``arm`` ("" clears the pins)."""
    for c in CLASSES:
        sidecar.override(c, arm)
    time.sleep(1.0)  # pushed, and applied by the engine from its next step


def chosen(sidecar: SidecarProcess) -> dict[str, str]:
    """Most probable arm per class, in its busiest load bucket."""
    out: dict[str, tuple[str, float]] = {}
    for ce in sidecar.evidence().classes:
        if ce.workload_class in CLASSES and ce.rounds > out.get(ce.workload_class, ("", -1))[1]:
            top = max(ce.arms, key=lambda a: a.probability)
            out[ce.workload_class] = (f"{top.arm} (p={top.probability:.2f})", ce.rounds)
    return {c: v[0] for c, v in out.items()}


def batch(n: int, max_tokens: int, offset: int) -> tuple[list[str], list[Any]]:
    from vllm import SamplingParams

    prompts, params = [], []
    for i in range(n):
        cls = CLASSES[i % 2]
        prompts.append(f"{WORDS[(i + offset) % len(WORDS)]} {i + offset}")
        params.append(
            SamplingParams(
                temperature=1.0 if cls == "hot" else 0.0, seed=offset + i if cls == "hot" else None,
                max_tokens=max_tokens, ignore_eos=True, extra_args={"workload_class": cls},
            )
        )  # fmt: skip
    return prompts, params


def engine_cpu_s(exclude: int) -> float:
    """CPU seconds used by this process's descendants (vLLM's engine core and worker) except
    ``exclude`` (the sidecar): the engine's time on a CPU engine, unaffected by other load."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    me, total = os.getpid(), 0.0
    for pid, seconds in cpu.items():
        p = pid
        while p > 1 and p not in (me, exclude):
            p = parent.get(p, 1)
        if p == me and pid != me:
            total += seconds
    return total


def run(
    llm: Any, n: int, max_tokens: int, offset: int, sidecar_pid: int
) -> tuple[int, float, float]:
    """(output tokens, wall seconds, engine CPU seconds) of one batch."""
    prompts, params = batch(n, max_tokens, offset)
    cpu0, t0 = engine_cpu_s(sidecar_pid), time.monotonic()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall, cpu = time.monotonic() - t0, engine_cpu_s(sidecar_pid) - cpu0
    return sum(len(o.outputs[0].token_ids) for o in outs), wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--learn-batches", type=int, default=10)
    args = parser.parse_args()

    from specctl.testing.tiny_engine import tiny_ngram_llm
    from specctl.testing.tiny_model import build_tiny_model

    workdir = Path(tempfile.mkdtemp(prefix="specctl-b-"))
    model = str(build_tiny_model(workdir / "tiny"))
    sidecar = SidecarProcess(workdir, workdir, load_bucket_bounds=None)
    sidecar.start("specctl")
    os.environ.update(
        SPECCTL_ADDRESS=sidecar.address, SPECCTL_SEED="0", VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
    )  # fmt: skip
    llm = tiny_ngram_llm(model, max_num_seqs=args.requests)
    try:
        pid = sidecar.proc.pid
        for i in range(args.learn_batches):  # specctl learns (also from the pinned phases later)
            run(llm, args.requests, args.max_tokens, 10_000 + i * args.requests, pid)
        print("after learning, specctl chooses:", chosen(sidecar), flush=True)
        configs = [("no speculation", "off"), ("static ngram/k=4", "ngram/k=4"), ("specctl", "")]
        totals = {name: [0, 0.0, 0.0] for name, _ in configs}
        for r in range(args.rounds):
            for name, arm in configs:
                pin(sidecar, arm)
                tokens, wall, cpu = run(llm, args.requests, args.max_tokens, r * args.requests, pid)
                for i, v in enumerate((tokens, wall, cpu)):
                    totals[name][i] += v
                print(
                    f"round {r} {name:<18} {tokens / wall:8.1f} output tok/s "
                    f"{tokens / cpu:8.1f} per engine CPU s",
                    flush=True,
                )
        print("specctl chooses:", chosen(sidecar))
        base_wall = totals["no speculation"][0] / totals["no speculation"][1]
        base_cpu = totals["no speculation"][0] / totals["no speculation"][2]
        print(
            f"\n{'configuration':<18} {'output tok/s':>13} {'vs no spec':>11} "
            f"{'tok/engine CPU s':>17} {'vs no spec':>11}"
        )
        for name, (tokens, wall, cpu) in totals.items():
            print(
                f"{name:<18} {tokens / wall:>13.1f} {tokens / wall / base_wall:>10.2f}x "
                f"{tokens / cpu:>17.1f} {tokens / cpu / base_cpu:>10.2f}x"
            )
    finally:
        llm.llm_engine.engine_core.shutdown()
        sidecar.stop()


if __name__ == "__main__":
    main()
