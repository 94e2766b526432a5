"""The scenario of a recorded trace: its target model, its load and its requests.

A trace runs in the benchmark as any scenario does; its target model
(acceptance per class and step cost, estimated from the trace) is what the
benchmark's references read, and its load follows the trace's batch size
unless the caller gives its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from specctl.arms import arms_for
from specctl.sim.scenario import Event, LoadChange, Scenario
from specctl.sim.table import REFERENCE_BATCH, TargetModel
from specctl.sim.trace_replay import ReplayRequests, replay_requests
from specctl.sim.trace_step_time import StepTimeModel, fit_step_time

if TYPE_CHECKING:
    from specctl.trace.format import Trace

FloatArray = npt.NDArray[np.float64]

LOAD_WINDOW_STEPS = 50  # the trace's batch size is followed as its median per window


@dataclass(frozen=True, eq=False)
class TraceModel(TargetModel):
    """A target whose acceptance and cost are estimated from a trace.

    ``conditional`` is each class's Kaplan-Meier acceptance per position, so
    ``expected_tokens`` is what a round at K commits on average;
    ``cost(B)`` and ``base_step_time_s(B)`` come from the fitted step-time
    model, with each arm's expected drafts (fewer than K where the drafter
    ran short). The benchmark's references (oracle, best static arm, tuned
    peers) read these as they read a sweep table's.
    """

    step_model: StepTimeModel
    expected_drafted: FloatArray  # [class, arm]

    def cost(self, batch_size: float) -> FloatArray:
        b = max(float(batch_size), 1.0)
        alpha, beta = self.step_model.coefficients(b)
        plain = alpha / b + beta
        return (alpha / b + beta * (1.0 + self.expected_drafted)) / plain

    def base_step_time_s(self, batch_size: float) -> float:
        return self.step_model.base_step_time_s(max(float(batch_size), 1.0))


def trace_model(trace: Trace, replay: ReplayRequests, step_model: StepTimeModel) -> TraceModel:
    drafters = {replay.drafter: replay.max_k}
    arms = tuple(arms_for(drafters.items()))
    arm_k = np.array([a.k for a in arms], dtype=np.int64)
    n = len(replay.classes)
    cond = np.zeros((n, len(arms), replay.max_k))
    for ai, kk in enumerate(arm_k.tolist()):
        cond[:, ai, :kk] = replay.hazard[:, :kk]
    base = step_model.base_step_time_s(REFERENCE_BATCH)
    return TraceModel(
        target=", ".join(sorted({m.model for m in trace.meta if m.model})) or trace.name,
        classes=replay.classes,
        drafters=drafters,
        arms=arms,
        arm_k=arm_k,
        conditional=cond,
        cost_ref=np.ones((n, len(arms))),
        baseline_tok_s=REFERENCE_BATCH / base,
        rows=(),
        step_model=step_model,
        expected_drafted=replay.expected_drafted[:, arm_k],
    )


@dataclass(frozen=True)
class TraceScenario(Scenario):
    """A scenario whose world replays a trace; events may only change the load."""

    replay: ReplayRequests | None = None
    trace_name: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.replay is None:
            raise ValueError(f"scenario {self.name}: a trace scenario needs its replay")
        for e in self.events:
            if not isinstance(e, LoadChange):
                raise ValueError(
                    f"scenario {self.name}: event {e}: a trace's acceptance and class mix "
                    "come from the trace; only load changes apply"
                )


def trace_load(trace: Trace, steps: int) -> tuple[int, list[LoadChange]]:
    """The trace's decode batch size over ``steps`` steps, wrapping around: the first
    window's median and a LoadChange wherever a later window's median differs."""
    per_step = trace.decode_requests
    n = len(per_step)
    batches: list[int] = []
    previous = max(int(np.median(per_step[per_step > 0])) if (per_step > 0).any() else 1, 1)
    for start in range(0, steps, LOAD_WINDOW_STEPS):
        idx = np.arange(start, min(start + LOAD_WINDOW_STEPS, steps)) % n
        window = per_step[idx]
        window = window[window > 0]
        if len(window):
            previous = max(round(float(np.median(window))), 1)
        batches.append(previous)
    events = [
        LoadChange(i * LOAD_WINDOW_STEPS, b)
        for i, b in enumerate(batches)
        if i > 0 and b != batches[i - 1]
    ]
    return batches[0], events


def trace_scenario(
    trace: Trace,
    steps: int,
    *,
    batch: int | None = None,
    events: Sequence[Event] | None = None,
    clock: str = "step",
    name: str | None = None,
) -> TraceScenario:
    """The scenario of one trace: its requests, classes and step times.

    Load follows the trace unless ``batch`` (a fixed number of concurrent
    requests) or ``events`` (load phases, e.g. a ramp) are given.
    """
    replay = replay_requests(trace)
    step_model = fit_step_time(trace, clock=clock)
    model = trace_model(trace, replay, step_model)
    if events is None and batch is None:
        start, load = trace_load(trace, steps)
        load_text = "load follows the trace"
    else:
        start = batch if batch is not None else trace_load(trace, steps)[0]
        load = [e for e in (events or ()) if isinstance(e, LoadChange)]
        load_text = f"batch {start}" + (f", {len(load)} load changes" if load else "")
    mix = {c: float(s) for c, s in zip(replay.classes, replay.row_share, strict=True)}
    fit = (
        f"step time fitted on {step_model.steps_fitted} steps ({clock} clock, "
        f"{step_model.bins_with_own_slope}/{len(step_model.batch)} batch bins with their own "
        "token slope)"
    )
    description = (
        f"{model.target}: replay of {replay.num_requests} requests, {replay.num_rounds} rounds "
        f"of {trace.name} ({replay.drafter} up to K={replay.max_k}; "
        f"classes {', '.join(replay.classes)}); {fit}; {load_text}"
    )
    return TraceScenario(
        name=name or f"trace/{trace.name}",
        description=description,
        model=model,
        steps=steps,
        batch=start,
        mix=mix,
        events=tuple(sorted(load, key=lambda e: e.step)),
        replay=replay,
        trace_name=trace.name,
    )


def trace_scenarios(sources: Sequence[str | Path], steps: int) -> list[TraceScenario]:
    """One scenario per source (a trace file, a directory of segments, or a packaged name)."""
    from specctl.trace.format import read_trace

    if not sources:
        raise ValueError(
            "scenario 'trace' needs a trace: --trace PATH (a trace file or directory, or the "
            "name of a packaged trace); see docs/traces.md"
        )
    return [trace_scenario(read_trace(s), steps) for s in sources]
