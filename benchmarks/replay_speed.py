"""Replay speed: logged request-steps per second on one core, for each estimator.

Builds a synthetic decision log of ``--rows`` request rows (default 10 million:
32 requests per step, 4 workload classes, 3 load buckets, ``off``,
``ngram/k=1..5`` and ``eagle3/k=1..3`` drawn per (step, class) by a randomised
logging policy), writes it as one decision-log Parquet file, reads it back
(with every row checked), prepares it, and times each estimator's full
evaluation of one static candidate: point estimate and ``--bootstrap``
replicates with intervals overall and per class. Every thread pool is pinned
to one thread and the process to one CPU first. Prints wall time and rows per
second for each stage.

    .venv/bin/python benchmarks/replay_speed.py [--rows 10000000] [--bootstrap 200]
        [--estimators ipw snipw dr model replay] [--candidate ngram/k=2]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from specctl.arms import OFF, Arm  # noqa: E402
from specctl.decisionlog import SCHEMA, read_decision_log  # noqa: E402
from specctl.decisionlog.files import file_name, write_table  # noqa: E402
from specctl.replay.bootstrap import Bootstrap  # noqa: E402
from specctl.replay.candidates import parse_policy_spec  # noqa: E402
from specctl.replay.data import prepare  # noqa: E402
from specctl.replay.estimators import ESTIMATORS  # noqa: E402
from specctl.replay.rejection import RejectionReplay  # noqa: E402
from specctl.replay.weights import candidate_action_dist, importance_weights  # noqa: E402

ROWS_PER_STEP = 32
CLASSES = ("chat", "code", "math", "summarize")
ARMS = (OFF, *(Arm("ngram", k) for k in range(1, 6)), *(Arm("eagle3", k) for k in range(1, 4)))
BUCKETS = 3


def _dict(codes: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(values))


def synthetic_log(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    steps = rows // ROWS_PER_STEP
    n = steps * ROWS_PER_STEP
    step = np.repeat(np.arange(steps), ROWS_PER_STEP)
    cls = np.sort(rng.integers(0, len(CLASSES), (steps, ROWS_PER_STEP)), axis=1).ravel()
    bucket_of_step = rng.integers(0, BUCKETS, steps)
    bucket = bucket_of_step[step]
    # one draw per (step, class), from a randomised distribution per (class, bucket)
    start = np.flatnonzero(np.r_[True, (step[1:] != step[:-1]) | (cls[1:] != cls[:-1])])
    logging = rng.dirichlet(np.full(len(ARMS), 2.0), (len(CLASSES), BUCKETS))
    logging = 0.8 * logging + 0.2 / len(ARMS)  # every arm keeps some support
    probs = logging[cls[start], bucket[start]]
    u = rng.random(start.size)
    unit_arm = np.minimum((probs.cumsum(axis=1) < u[:, None]).sum(axis=1), len(ARMS) - 1)
    counts = np.diff(np.r_[start, n])
    arm = np.repeat(unit_arm, counts)
    propensity = np.repeat(probs[np.arange(start.size), unit_arm], counts)
    k = np.array([a.k for a in ARMS])[arm]
    drafted = np.where(rng.random(n) < 0.8, k, 0)
    accept = np.array([0.5, 0.7, 0.8, 0.6])[cls]
    accepted = np.minimum(rng.geometric(1.0 - accept) - 1, drafted)
    eagle = np.array([a.drafter == "eagle3" for a in ARMS])[arm]
    cost = 0.0004 + np.where(eagle, 0.0012, 0.0003) * drafted
    step_time = (0.004 + np.bincount(step, weights=cost, minlength=steps)) * np.exp(
        rng.normal(0.0, 0.03, steps)
    )
    t_end = 1.79e9 + 0.03 * np.arange(1, steps + 1)
    columns = [
        pa.array(t_end[step]),
        _dict(np.zeros(n, dtype=np.int32), ["engine-0"]),
        pa.array(step),
        _dict(cls, list(CLASSES)),
        pa.array(bucket, pa.int32()),
        _dict(arm, [a.name for a in ARMS]),
        pa.array(propensity),
        pa.array(drafted, pa.int32()),
        pa.array(accepted, pa.int32()),
        pa.array(step_time[step]),
        pa.array(np.full(n, ROWS_PER_STEP), pa.int32()),
        pa.array(np.full(n, ROWS_PER_STEP), pa.int32()),
        pa.array(np.full(n, 3 * ROWS_PER_STEP), pa.int32()),
        pa.array(np.ones(n, dtype=np.int64)),
        pa.array(step // 64),
        _dict(np.zeros(n, dtype=np.int32), [""]),  # no batch drafter reported
        pa.array(np.full(n, -1), pa.int32()),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS))
    parser.add_argument("--candidate", default="ngram/k=2")
    args = parser.parse_args()

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)

    def report(stage: str, seconds: float, rows: int, cpu: float | None = None) -> None:
        cpu_text = "" if cpu is None else f"  (cpu {cpu:6.2f} s: {rows / cpu / 1e6:6.2f} M/s)"
        print(
            f"{stage:<28} {seconds:8.2f} s  {rows / seconds / 1e6:8.2f} M request-steps/s{cpu_text}"
        )

    t = time.perf_counter()
    table = synthetic_log(args.rows)
    print(f"generated {table.num_rows} request-steps in {time.perf_counter() - t:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / file_name(1, 1)
        t = time.perf_counter()
        write_table(table, path)
        report("write (zstd Parquet)", time.perf_counter() - t, table.num_rows)
        print(f"  file size {path.stat().st_size / 1e6:.1f} MB")
        del table
        t = time.perf_counter()
        c = time.process_time()
        log = read_decision_log([path])
        report(
            "read + check every row", time.perf_counter() - t, log.num_rows, time.process_time() - c
        )
    rows = log.num_rows
    t = time.perf_counter()
    c = time.process_time()
    data = prepare(log.table)
    report("prepare (units, cost model)", time.perf_counter() - t, rows, time.process_time() - c)
    print(f"  {data.num_steps} steps, {data.num_units} step-contexts")
    candidate = parse_policy_spec(args.candidate)
    policy = candidate.make()
    policy.set_arms(data.arms)
    weights = importance_weights(data, candidate_action_dist(data, policy))
    t = time.perf_counter()
    c = time.process_time()
    bootstrap = Bootstrap(data, args.bootstrap, random_state=0)
    boot_s = time.perf_counter() - t
    report(f"bootstrap plan ({args.bootstrap} refits)", boot_s, rows, time.process_time() - c)
    print(f"{args.bootstrap} bootstrap replicates per estimator, intervals overall and per class")
    for name in args.estimators:
        t = time.perf_counter()
        c = time.process_time()
        estimator = ESTIMATORS[name]()
        if estimator.uses_rejection_sampling:
            est = estimator.estimate_interval(
                data,
                RejectionReplay().weights(data, candidate.make, random_state=0),
                n_bootstrap_samples=args.bootstrap,
                random_state=0,
            )
        else:
            est = estimator.estimate_interval(data, weights, bootstrap=bootstrap)
        seconds = time.perf_counter() - t
        cpu = time.process_time() - c
        e = est["all"]
        report(f"{name}", seconds, rows, cpu)
        print(
            f"  goodput {e.goodput:.1f} [{e.goodput_low:.1f}, {e.goodput_high:.1f}] tok/s, "
            f"ess {e.effective_sample_size:.0f}; with the shared bootstrap plan: "
            f"{rows / (seconds + boot_s) / 1e6:.2f} M request-steps/s"
        )


if __name__ == "__main__":
    main()
