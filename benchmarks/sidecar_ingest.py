"""Sidecar cost per report: validation (decode_step_report) and PolicyBook.ingest.

A report of R request rows (default 256) over a few steps, classes and arms,
ingested repeatedly into a PolicyBook with each policy named. Prints p50, p99
and max per report, in microseconds, of wall time and of the thread's CPU time
(on a shared machine the wall-time tail is mostly other processes' time). The
requirement for the static policy is a p99 well under a millisecond.

    .venv/bin/python benchmarks/sidecar_ingest.py [--rows 256] [--reports 3000]
        [--policies static specctl]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from specctl.api import pb
from specctl.policy.registry import POLICIES, make_policy
from specctl.protocol.reports import decode_step_report, encode_step_report
from specctl.sidecar.book import PolicyBook
from specctl.steps import StepRecord

OFFERED = {"ngram": 4}
ARMS = ["off", "ngram/k=1", "ngram/k=2", "ngram/k=4"]
CLASSES = ["chat", "code", "summarize", "default"]
STEPS_PER_REPORT = 8


def make_report(sequence: int, rows: int, rng: np.random.Generator) -> pb.StepReport:
    per_step = max(1, rows // STEPS_PER_REPORT)
    # Load changes slowly next to the report interval: one bucket per report.
    bucket = int(rng.integers(0, 4))
    steps = []
    for i in range(STEPS_PER_REPORT):
        arms = [ARMS[j] for j in rng.integers(0, len(ARMS), per_step)]
        drafted = [0 if a == "off" else int(a[-1]) for a in arms]
        steps.append(
            StepRecord(
                step_index=sequence * STEPS_PER_REPORT + i,
                step_time_s=float(rng.uniform(0.01, 0.05)),
                batch_size=per_step,
                num_scheduled_tokens=per_step * 3,
                policy_version=1,
                load_bucket=bucket,
                step_end_unix_s=time.time(),
                classes=[CLASSES[j] for j in rng.integers(0, len(CLASSES), per_step)],
                arms=arms,
                propensity=[0.25] * per_step,
                drafted=drafted,
                accepted=[int(rng.integers(0, d + 1)) for d in drafted],
            )
        )
    return encode_step_report(sequence, steps)


def percentiles(samples: list[float]) -> str:
    us = np.array(samples) * 1e6
    return (
        f"p50 {np.percentile(us, 50):8.1f} us   p99 {np.percentile(us, 99):8.1f} us   "
        f"max {us.max():8.1f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256, help="request rows per report")
    parser.add_argument("--reports", type=int, default=3000, help="reports per policy")
    parser.add_argument("--policies", nargs="+", default=["static", "specctl"])
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    reports = [make_report(i + 1, args.rows, rng) for i in range(200)]
    print(f"{args.rows} request rows per report, {args.reports} reports per policy")
    for name in args.policies:
        if name not in POLICIES:
            print(f"{name:>10}: not registered, skipped")
            continue
        params = {"arm": "ngram/k=4"} if name == "static" else {}
        book = PolicyBook(make_policy(name, params), policy_name=name)
        book.offer(OFFERED)
        decode, ingest, ingest_cpu = [], [], []
        for n in range(args.reports):
            report = reports[n % len(reports)]
            t0 = time.perf_counter()
            batch = decode_step_report(
                report, engine_id="bench", offered=OFFERED, num_load_buckets=4
            )
            t1 = time.perf_counter()
            c1 = time.thread_time()
            book.ingest(batch)
            book.refresh_estimates()  # what a learning round of the server adds
            c2 = time.thread_time()
            t2 = time.perf_counter()
            decode.append(t1 - t0)
            ingest.append(t2 - t1)
            ingest_cpu.append(c2 - c1)
        print(f"{name:>10}: decode      wall {percentiles(decode)}")
        print(f"{name:>10}: ingest      wall {percentiles(ingest)}")
        print(f"{name:>10}: ingest  thread CPU {percentiles(ingest_cpu)}")
        print(f"{name:>10}: {book.version} policy versions over {args.reports} reports")


if __name__ == "__main__":
    main()
