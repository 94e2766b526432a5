"""Added time per scheduler step: specctl's scheduler vs vLLM's stock one.

Both run vLLM 0.32's real scheduler code with N requests in decode and a
synthetic model (no forward pass), so the difference is what the plugin adds
on the engine's critical path: sampling arms, truncating drafts, recording the
step. Two measurements per batch size:

- end to end: the median step time of the stock scheduler and of specctl's,
  with a policy that picks ``ngram/k=4`` (the stock setting) so both do the
  same scheduling work; the difference is the plugin's cost, within noise.
- hooks: the time spent inside specctl's hooks per step (sampling, draft
  truncation, recording), with a policy that gives the two classes different
  arms so that draft truncation is active, its most expensive case.
- n-gram drafts: on a ``draft_model`` engine with every class on
  ``ngram/k=4``, the hooks' time including the n-gram drafts the scheduler
  computes for every request (``--context`` tokens of prompt, growing), and
  that drafting alone.

    .venv/bin/python benchmarks/step_overhead.py [--sizes 8 64 256] [--steps 300]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time


def _ngram_policy_view() -> object:
    """Every class on n-gram drafts, on an engine whose own drafter is a draft model."""
    from specctl.api import pb
    from specctl.engine.policy_view import compile_policy

    entries = [
        pb.ClassPolicy(workload_class=c, load_bucket=b, arms=["ngram/k=4"], probabilities=[1.0])
        for b in range(4)
        for c in ("greedy", "sampled")
    ]
    policy = pb.Policy(
        version=7, fallback_arm="draft_model/k=4", load_bucket_bounds=[8, 64, 256],
        entries=entries,
    )  # fmt: skip
    return compile_policy(policy, {"draft_model": 4, "ngram": 4})


def _policy_view(mixed: bool) -> object:
    from specctl.api import pb
    from specctl.engine.policy_view import compile_policy

    entries = []
    for bucket in range(4):
        entries.append(
            pb.ClassPolicy(
                workload_class="greedy", load_bucket=bucket, arms=["ngram/k=2", "ngram/k=4"],
                probabilities=[0.2, 0.8] if mixed else [0.0, 1.0],
            )
        )  # fmt: skip
        entries.append(
            pb.ClassPolicy(
                workload_class="sampled", load_bucket=bucket, arms=["off", "ngram/k=4"],
                probabilities=[0.9, 0.1] if mixed else [0.0, 1.0],
            )
        )  # fmt: skip
    policy = pb.Policy(
        version=7, fallback_arm="ngram/k=4", load_bucket_bounds=[8, 64, 256], entries=entries
    )
    return compile_policy(policy, {"ngram": 4})


class _Timed:
    """Accumulates the time spent in the recorder's hook methods."""

    def __init__(self, recorder: object, ngram: object = None) -> None:
        self.total = 0.0
        self.drafting = 0.0
        for name in ("forget", "on_schedule", "cut_drafts", "cut_placeholders", "on_output"):
            setattr(recorder, name, self._wrap(getattr(recorder, name)))
        if ngram is not None:
            draft = ngram.draft  # type: ignore[attr-defined]

            def timed_draft(*args, **kwargs):  # type: ignore[no-untyped-def]
                t0 = time.perf_counter()
                try:
                    return draft(*args, **kwargs)
                finally:
                    elapsed = time.perf_counter() - t0
                    self.total += elapsed
                    self.drafting += elapsed

            ngram.draft = timed_draft  # type: ignore[attr-defined]

    def _wrap(self, fn):  # type: ignore[no-untyped-def]
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - t0

        return timed


def measure(
    scheduler_cls: type, model: str, n: int, steps: int, policy: str | None, context: int = 32
) -> tuple[float, float, float]:
    """(median step time, median time in specctl's hooks per step, of which n-gram
    drafting), seconds."""
    from specctl.testing.scheduler_driver import SchedulerDriver

    ngram = policy == "ngram"
    driver = SchedulerDriver(
        scheduler_cls, model, num_requests=n, classes=("greedy", "sampled"), acceptance=0.6,
        method="draft_model" if ngram else "ngram", prompt_len=context if ngram else 32,
    )  # fmt: skip
    timed = None
    if policy is not None:
        client = driver.scheduler.specctl_client
        client.close()  # no sidecar here: pin the policy instead of the fallback
        client.view = _ngram_policy_view() if ngram else _policy_view(policy == "mixed")
        timed = _Timed(driver.scheduler.specctl, driver.scheduler._specctl_ngram)
    for _ in range(20):  # prefill and warm up
        driver.step()
    gc.collect()
    gc.freeze()  # as vLLM's engine core does after start-up
    times = []
    hook_times = []
    drafting_times = []
    for _ in range(steps):
        if timed is not None:
            timed.total = timed.drafting = 0.0
        t0 = time.perf_counter()
        driver.step()
        times.append(time.perf_counter() - t0)
        if timed is not None:
            hook_times.append(timed.total)
            drafting_times.append(timed.drafting)
    gc.unfreeze()
    if policy is not None:
        driver.scheduler.shutdown()
    median = statistics.median
    return (
        median(times),
        median(hook_times) if hook_times else 0.0,
        median(drafting_times) if drafting_times else 0.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--context", type=int, default=1024, help="prompt tokens per request for n-gram drafts"
    )
    args = parser.parse_args()
    os.environ.setdefault("SPECCTL_ADDRESS", "unix:///nonexistent/specctl.sock")
    os.environ.setdefault("SPECCTL_SEED", "0")

    from vllm.v1.core.sched.scheduler import Scheduler

    from specctl.engine.scheduler import SpecctlScheduler
    from specctl.testing.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_tiny_model(os.path.join(tmp, "tiny")))
        print(
            f"{'running':>8} {'stock us/step':>14} {'specctl us/step':>16} {'added us':>9} "
            f"{'hooks us/step (same K)':>23} {'hooks us/step (mixed K)':>24} "
            f"{'hooks us/step (n-gram)':>23} {'of which drafting':>18}"
        )
        for n in args.sizes:
            stock: list[float] = []
            ours: list[float] = []
            hooks_same: list[float] = []
            hooks_mixed: list[float] = []
            hooks_ngram: list[float] = []
            drafting: list[float] = []
            for _ in range(args.repeats):  # interleaved, so drift hits both alike
                stock.append(measure(Scheduler, model, n, args.steps, None)[0])
                step, hook, _ = measure(SpecctlScheduler, model, n, args.steps, "same")
                ours.append(step)
                hooks_same.append(hook)
                hooks_mixed.append(measure(SpecctlScheduler, model, n, args.steps, "mixed")[1])
                _, hook, draft = measure(
                    SpecctlScheduler, model, n, args.steps, "ngram", args.context
                )
                hooks_ngram.append(hook)
                drafting.append(draft)
            s, o = min(stock) * 1e6, min(ours) * 1e6
            hs, hm = min(hooks_same) * 1e6, min(hooks_mixed) * 1e6
            hn, dn = min(hooks_ngram) * 1e6, min(drafting) * 1e6
            print(
                f"{n:>8} {s:>14.1f} {o:>16.1f} {o - s:>9.1f} {hs:>23.1f} {hm:>24.1f} "
                f"{hn:>23.1f} {dn:>18.1f}"
            )


if __name__ == "__main__":
    main()
