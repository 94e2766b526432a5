"""End-to-end output tokens per second on the CPU engine: no speculation, static K, specctl.

One vLLM engine (CPU build, the tiny random Llama, n-gram drafter with K up to 4,
specctl's scheduler) and one sidecar (``specctl serve --policy specctl``). The
workload mixes two classes: greedy requests (the random model loops, n-gram
drafts are often accepted) and temperature-1.0 requests (drafts almost never
are). After a learning phase, the same batches run in rounds, each round
measuring, side by side, every class pinned ``off``, every class pinned to
``ngram/k=4``, and specctl's own policy (no pins).

    .venv/bin/python benchmarks/e2e_throughput.py [--rounds 3] [--requests 32] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CLASSES = ("greedy", "hot")
SCHEDULER_CLS = "controller.engine.scheduler.SpecctlScheduler"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}  # fmt: skip
WORDS = ["The quick brown fox", "Speculative decoding", "def add(a, b):", "SELECT name",
         "Goodput is", "Once upon a time", '{"workload_class":', "0123456789 abc"]  # fmt: skip


class Sidecar:
    def __init__(self, workdir: Path) -> None:
        import grpc

        from controller.api import pb, pb_grpc

        self.pb = pb
        self.address = f"unix://{workdir}/specctl.sock"
        (workdir / "token").write_text("bench-token")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "controller.cli", "serve", "--listen", self.address,
                "--metrics-listen", "127.0.0.1:0", "--policy", "specctl", "--admin",
                "--admin-token-file", str(workdir / "token"), "--log-format", "json",
            ],
            stdout=(workdir / "sidecar.log").open("wb"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.SpecControllerStub(self.channel)
        self.admin = pb_grpc.SpecControllerAdminStub(self.channel)
        grpc.channel_ready_future(self.channel).result(timeout=60)

    def pin(self, arm: str) -> None:
        for c in CLASSES:
            self.admin.SetOverride(
                self.pb.SetOverrideRequest(workload_class=c, arm=arm),
                metadata=(("authorization", "Bearer bench-token"),),
                timeout=5,
            )
        time.sleep(1.0)  # pushed, and applied by the engine from its next step

    def chosen(self) -> dict[str, str]:
        """Most probable arm per class, in its busiest load bucket."""
        out: dict[str, tuple[str, float]] = {}
        for ce in self.stub.GetEvidence(self.pb.GetEvidenceRequest(), timeout=5).classes:
            if ce.workload_class in CLASSES and ce.rounds > out.get(ce.workload_class, ("", -1))[1]:
                top = max(ce.arms, key=lambda a: a.probability)
                out[ce.workload_class] = (f"{top.arm} (p={top.probability:.2f})", ce.rounds)
        return {c: v[0] for c, v in out.items()}

    def close(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(10)


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


def run(llm: Any, n: int, max_tokens: int, offset: int) -> tuple[int, float]:
    prompts, params = batch(n, max_tokens, offset)
    t0 = time.monotonic()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs), time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--learn-batches", type=int, default=10)
    args = parser.parse_args()

    from controller.demo.tiny_model import build_tiny_model

    workdir = Path(tempfile.mkdtemp(prefix="specctl-b-"))
    model = str(build_tiny_model(workdir / "tiny"))
    sidecar = Sidecar(workdir)
    os.environ.update(
        SPECCTL_ADDRESS=sidecar.address, SPECCTL_SEED="0", VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
    )  # fmt: skip
    from vllm import LLM

    llm = LLM(
        model=model, dtype="float32", enforce_eager=True, max_model_len=512,
        max_num_seqs=args.requests, seed=0, speculative_config=NGRAM, scheduler_cls=SCHEDULER_CLS,
    )  # fmt: skip
    try:
        for i in range(args.learn_batches):  # specctl learns (also from the pinned phases later)
            run(llm, args.requests, args.max_tokens, 10_000 + i * args.requests)
        print("after learning, specctl chooses:", sidecar.chosen(), flush=True)
        configs = [("no speculation", "off"), ("static ngram/k=4", "ngram/k=4"), ("specctl", "")]
        totals = {name: [0, 0.0] for name, _ in configs}
        for r in range(args.rounds):
            for name, pin in configs:
                sidecar.pin(pin)
                tokens, wall = run(llm, args.requests, args.max_tokens, r * args.requests)
                totals[name][0] += tokens
                totals[name][1] += wall
                print(f"round {r} {name:<18} {tokens / wall:8.1f} output tok/s", flush=True)
        print("specctl chooses:", sidecar.chosen())
        base = totals["no speculation"][0] / totals["no speculation"][1]
        print(f"\n{'configuration':<18} {'output tok/s':>13} {'vs no spec':>11}")
        for name, (tokens, wall) in totals.items():
            rate = tokens / wall
            print(f"{name:<18} {rate:>13.1f} {rate / base:>10.2f}x")
    finally:
        llm.llm_engine.engine_core.shutdown()
        sidecar.close()


if __name__ == "__main__":
    main()
