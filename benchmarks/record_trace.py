"""Record a trace from a real vLLM engine (CPU build) for the trace-driven simulator.

One engine with specctl's scheduler and no sidecar: every class runs the
fallback arm, the engine's own largest K, which is what a trace needs (a round
at K says how many of K drafts were accepted, and the simulator answers any
K' <= K from it). Classes differ by sampling temperature; batches of each class
run at several concurrencies so the step-time fit sees several batch sizes.
The model is the tiny random Llama (n-gram drafter) by default.

    .venv/bin/python benchmarks/record_trace.py --out controller/sim/data/traces/tiny-cpu-ngram
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

WORDS = ["The quick brown fox", "Speculative decoding", "def add(a, b):", "SELECT name",
         "Goodput is", "Once upon a time", '{"workload_class":', "0123456789 abc"]  # fmt: skip
# class -> sampling temperature
CLASSES = {"greedy": 0.0, "warm": 0.6, "hot": 1.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="directory for the trace (replaced)")
    parser.add_argument("--concurrency", default="4,16,32", help="batch sizes to record")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batches", type=int, default=2, help="batches per class and size")
    args = parser.parse_args()

    from specctl.testing.tiny_engine import tiny_ngram_llm
    from specctl.testing.tiny_model import build_tiny_model

    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="specctl-trace-"))
    model = str(build_tiny_model(work / "tiny-model"))
    os.environ.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        SPECCTL_ADDRESS=f"unix://{work}/no-sidecar.sock",
        SPECCTL_TRACE_DIR=str(out),
        SPECCTL_STEP_CLOCK="process_cpu",
        SPECCTL_SEED="0",
    )
    from vllm import SamplingParams

    llm = tiny_ngram_llm(model, max_num_seqs=32)
    offset = 0
    t0 = time.monotonic()
    for n in (int(x) for x in args.concurrency.split(",")):
        for _ in range(args.batches):
            for cls, temperature in CLASSES.items():
                prompts = [f"{WORDS[(i + offset) % len(WORDS)]} {i + offset}" for i in range(n)]
                params = [
                    SamplingParams(
                        temperature=temperature,
                        seed=offset + i if temperature > 0 else None,
                        max_tokens=args.max_tokens,
                        ignore_eos=True,
                        extra_args={"workload_class": cls},
                    )
                    for i in range(n)
                ]
                llm.generate(prompts, params, use_tqdm=False)
                offset += n
                print(f"[{time.monotonic() - t0:6.1f}s] {cls} x{n}", flush=True)
    llm.llm_engine.engine_core.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    print(f"trace in {out}: {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    main()
