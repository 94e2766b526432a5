"""The policy's own cost: update from a 256-request step report, then decide.

Prints p50 and p99 microseconds, on one core, of ``update_params`` followed by
``select_action`` for the context the report touched (the decision is
recomputed there; others stay cached), and of each part alone. Reports are
built and validated beforehand: only the policy is timed. Wall time includes
whatever else the machine runs (preemption shows up in p99); thread CPU time
is the policy's own cost.

    .venv/bin/python benchmarks/policy_cost.py [--policy specctl] [--iterations 5000]
        [--params '{"cost_k_columns": 0}']

Goal: p99 under 200 microseconds, so one sidecar keeps up with dozens of
engines.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import numpy as np

from specctl.arms import arms_for
from specctl.policy.registry import make_policy
from specctl.protocol.reports import decode_step_report, encode_step_report
from specctl.steps import StepBatch, StepRecord

CLASSES = ("chat", "code", "rag", "summarize")
DRAFTERS = {"ngram": 8, "eagle3": 5}
BOUNDS = (8, 32, 128)


def make_reports(n: int, rows: int, seed: int) -> list[StepBatch]:
    """``n`` one-step reports of ``rows`` requests of one class at the top load bucket."""
    rng = np.random.default_rng(seed)
    arm_names = [a.name for a in arms_for(DRAFTERS.items())]
    reports = []
    for i in range(n):
        arms = rng.choice(arm_names, size=rows)
        ks = np.array([0 if a == "off" else int(a.split("=")[1]) for a in arms])
        accepted = np.minimum(rng.geometric(0.35, size=rows) - 1, ks)
        record = StepRecord(
            step_index=i,
            step_time_s=0.03 + 0.0001 * float((1 + ks).sum()) + rng.normal(0.0, 0.002),
            batch_size=rows,
            num_scheduled_tokens=int((1 + ks).sum()),
            policy_version=1,
            load_bucket=len(BOUNDS),
            step_end_unix_s=1.7e9 + i,
            classes=[CLASSES[i % len(CLASSES)]] * rows,
            arms=list(arms),
            propensity=[1.0 / len(arm_names)] * rows,
            drafted=[int(k) for k in ks],
            accepted=[int(a) for a in accepted],
        )
        reports.append(
            decode_step_report(
                encode_step_report(i + 1, [record]),
                engine_id="bench",
                offered=DRAFTERS,
                num_load_buckets=len(BOUNDS) + 1,
            )
        )
    return reports


def percentiles(samples_ns: list[int]) -> str:
    us = np.asarray(samples_ns, dtype=np.float64) / 1e3
    p50, p99 = np.percentile(us, [50, 99])
    return f"p50 {p50:7.1f} us   p99 {p99:7.1f} us"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="specctl")
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument(
        "--params", type=json.loads, default={}, help="the policy's parameters, a JSON object"
    )
    args = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    reports = make_reports(args.warmup + args.iterations, args.rows, seed=0)
    policy = make_policy(args.policy, {**args.params, "load_bucket_bounds": list(BOUNDS)})
    policy.set_arms(arms_for(DRAFTERS.items()))
    bucket = len(BOUNDS)
    for batch in reports[: args.warmup]:
        policy.update_params(batch)
        policy.select_action(batch.classes[0], bucket)

    total: list[int] = []
    update: list[int] = []
    decide: list[int] = []
    cpu: list[int] = []
    gc.disable()
    clock = time.perf_counter_ns
    cpu_clock = time.thread_time_ns
    for batch in reports[args.warmup :]:
        workload_class = batch.classes[0]
        c0 = cpu_clock()
        t0 = clock()
        policy.update_params(batch)
        t1 = clock()
        policy.select_action(workload_class, bucket)
        t2 = clock()
        cpu.append(cpu_clock() - c0)
        update.append(t1 - t0)
        decide.append(t2 - t1)
        total.append(t2 - t0)
    gc.enable()
    print(
        f"policy {args.policy}: {args.iterations} reports of {args.rows} requests, "
        f"{len(CLASSES)} classes, {len(arms_for(DRAFTERS.items()))} arms, one core"
        + (f", {json.dumps(args.params)}" if args.params else "")
    )
    print(f"  update + decision  {percentiles(total)}   (wall)")
    print(f"  update + decision  {percentiles(cpu)}   (thread CPU time)")
    print(f"  update_params      {percentiles(update)}")
    print(f"  select_action      {percentiles(decide)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
