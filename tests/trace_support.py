"""A synthetic engine that records a trace through the engine's own writer.

It is built to break the table simulator's assumptions: every request has
its own acceptance rate (Beta-distributed per class), the rate moves along
the request, the drafter sometimes proposes fewer than K tokens (an n-gram
drafter without a match), and step times have heavy-tailed spikes. Steps are
the recorder's ``RawStep`` objects, with request ids and the per-step vLLM
mappings, pushed through :class:`~specctl.trace.writer.TraceWriter`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specctl.arms import OFF, Arm
from specctl.engine.policy_view import Choice
from specctl.engine.recorder import RawStep, _Plan
from specctl.trace.format import TraceMeta
from specctl.trace.writer import TraceWriter

# step time: alpha(B) + BETA * tokens, times a log-normal residual with spikes
ALPHA_S = 0.004
ALPHA_PER_REQUEST_S = 0.0002
BETA_S = 0.00005
NOISE_SIGMA = 0.03
SPIKE_PROBABILITY = 0.03
CLASSES = {"greedy": (8.0, 2.0), "chat": (2.0, 3.0)}  # Beta(a, b) of a request's base rate
PROMPT_LEN = 48
SECRET_PREFIX = "cmpl-secret-"


def step_time_s(batch: int, tokens: int) -> float:
    return ALPHA_S + ALPHA_PER_REQUEST_S * batch + BETA_S * tokens


@dataclass
class _Request:
    req_id: str
    cls: str
    base: float
    drift: float
    length: int
    position: int = 0  # tokens committed
    prefilled: bool = False
    drafts: int = 0  # drafts proposed in the last step, verified in the next
    rounds: list[tuple[int, int, int]] = field(default_factory=list)  # (position, d, a)

    def rate(self) -> float:
        frac = min(self.position / max(self.length, 1), 1.0)
        return min(max(self.base + self.drift * (frac - 0.5), 0.0), 0.98)


@dataclass
class SyntheticTrace:
    directory: Path
    requests: dict[str, _Request]  # by request id, in order of arrival
    step_times: list[float]
    batch_sizes: list[int]
    residuals: list[float]
    writer: TraceWriter


def _batch_at(step: int, batch: int, swing: int) -> int:
    return max(1, batch + round(swing * math.sin(2 * math.pi * step / 400)))


def synthetic_trace(
    directory: Path,
    *,
    steps: int = 800,
    batch: int = 16,
    swing: int = 0,
    max_k: int = 4,
    k_of_class: dict[str, int] | None = None,
    seed: int = 0,
    mean_length: int = 120,
    **writer_options: int,
) -> SyntheticTrace:
    """Run the synthetic engine for ``steps`` steps and write its trace under ``directory``."""
    rng = np.random.default_rng(seed)
    k_of_class = {c: k_of_class.get(c, max_k) if k_of_class else max_k for c in CLASSES}
    meta = TraceMeta(trace_id="", model="synthetic", drafter="ngram", max_k=max_k)
    writer_options.setdefault("queue_size", steps + 1)
    writer = TraceWriter(directory, meta, **writer_options)
    directory.mkdir(parents=True, exist_ok=True)
    names = list(CLASSES)
    governing = {c: Choice(Arm("ngram", k) if k else OFF, 1.0) for c, k in k_of_class.items()}
    plan = _Plan(0.0, governing, 1, 0, 4)
    running: list[_Request] = []
    requests: dict[str, _Request] = {}
    out = SyntheticTrace(directory, requests, [], [], [], writer)
    clock = 1_790_000_000.0

    def arrive() -> _Request:
        cls = names[int(rng.integers(len(names)))]
        a, b = CLASSES[cls]
        r = _Request(
            req_id=f"{SECRET_PREFIX}{len(requests)}",
            cls=cls,
            base=float(rng.beta(a, b)),
            drift=float(rng.uniform(-0.4, 0.4)),
            length=int(rng.geometric(1.0 / mean_length)) + 4,
        )
        requests[r.req_id] = r
        return r

    for step in range(1, steps + 1):
        target = _batch_at(step, batch, swing)
        while len(running) < target:
            running.append(arrive())
        num_scheduled: dict[str, int] = {}
        spec: dict[str, list[int]] = {}
        sampled: list[list[int]] = []
        finished: list[_Request] = []
        for r in running:
            if not r.prefilled:
                num_scheduled[r.req_id] = PROMPT_LEN
                sampled.append([1])
                r.prefilled = True
                r.position = 1
            else:
                d = r.drafts
                if d:
                    spec[r.req_id] = [0] * d
                num_scheduled[r.req_id] = d + 1
                a = 0
                while a < d and rng.random() < r.rate():
                    a += 1
                a = min(a, r.length - r.position - 1)
                r.rounds.append((r.position, d, a))
                sampled.append([1] * (a + 1))
                r.position += a + 1
            if r.position >= r.length:
                finished.append(r)
            k = k_of_class[r.cls]
            # the drafter proposes for the next step: sometimes short (no n-gram match)
            r.drafts = k if rng.random() > 0.25 else int(rng.integers(0, k + 1))
        tokens = sum(num_scheduled.values())
        residual = float(np.exp(rng.normal(0.0, NOISE_SIGMA)))
        if rng.random() < SPIKE_PROBABILITY:
            residual *= 1.0 + float(rng.pareto(1.5))
        t = step_time_s(len(num_scheduled), tokens) * residual
        clock += t
        out.step_times.append(t)
        out.batch_sizes.append(len(num_scheduled))
        out.residuals.append(residual)
        writer.push(
            RawStep(
                step_index=step,
                step_time_s=t,
                step_end_unix_s=clock,
                num_scheduled_tokens=tokens,
                plan=plan,
                classes=[requests[i].cls for i in num_scheduled],
                num_scheduled=num_scheduled,
                spec_tokens=spec,
                req_id_to_index={req_id: i for i, req_id in enumerate(num_scheduled)},
                sampled_token_ids=sampled,
            )
        )
        running = [r for r in running if r not in finished]
    writer.close()
    return out
