"""Trace-driven simulation: a world that replays what a real engine recorded.

The table-driven :class:`~specctl.sim.engine.World` draws every round
from the model the policies assume (independent acceptance per position,
identical requests in a class, a smooth step cost with small Gaussian-like
noise). :class:`TraceWorld` takes all three from a trace
(:mod:`specctl.trace.format`) instead:

- **Requests** replay their recorded rounds. A round recorded at position
  ``p`` (tokens committed so far) with ``d`` drafted and ``a`` accepted says
  that a draft started at ``p`` matches for ``a`` tokens. A simulated round at
  K' drafting from ``p`` accepts ``min(a, K')``; drafting from ``p + o``
  inside that round (after a shorter K' committed fewer tokens) accepts
  ``min(a - o, K')``. So per-request heterogeneity and acceptance that moves
  along a request are the recorded ones. Where the recording says nothing
  (a round accepted all ``K`` it was allowed, so what lay beyond is unknown,
  and K' asks for more; or a position no recorded round covers) the rest of
  the round is drawn from the class's conditional acceptance per position,
  estimated from the whole trace (Kaplan-Meier over rounds, those cut short
  by K counting as censored). A recorded round whose drafter proposed fewer
  than its K (an n-gram drafter without a match) proposes at most as many at
  any K'. A request ends at its recorded length; requests arrive in the
  order the trace first saw them (so the class mix is the trace's), and the
  trace starts over when they run out.
- **Step time** is a model fitted to the trace's decode steps
  (:func:`fit_step_time`): per batch-size bin, ``alpha + beta * tokens``
  (scheduled tokens: one per request plus its drafts), interpolated between
  bins, times a residual (measured over fitted) resampled in blocks of
  consecutive steps from the trace's own residuals, so heavy tails and short
  bursts of slow steps stay as recorded.
- **Load** follows the trace's decode batch size (median per 50 steps), or a
  scenario's own load phases (:class:`~specctl.sim.scenario.LoadChange`).

What is approximate: a draft started inside a recorded round is taken to
agree with the recorded draft's tail (exact for a deterministic drafter that
reads only the prefix, close for EAGLE-style drafters, which then condition
on target states rather than their own); beyond what was recorded acceptance
is drawn per class; a request whose trace began or ended mid-generation is
replayed from where it was seen; prefill is not simulated (its steps are left
out of the fit); the step-time residual does not depend on the batch's
composition; and the oracle knows each class's average acceptance, not each
request's.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from specctl.arms import arms_for
from specctl.sim.scenario import Event, EventQueue, LoadChange, Scenario
from specctl.sim.table import REFERENCE_BATCH, TargetModel

if TYPE_CHECKING:
    from specctl.trace.format import Trace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

MIN_FIT_STEPS = 50  # decode-only steps needed to leave steps with prefill out of the fit
MIN_BIN_STEPS = 30  # steps per batch-size bin of the step-time fit, at least
MAX_BINS = 12
RESIDUAL_BLOCK_STEPS = 16  # consecutive residuals resampled together
LOAD_WINDOW_STEPS = 50  # the trace's batch size is followed as its median per window
CLOCKS = ("step", "wall")
_UNBOUNDED = np.iinfo(np.int64).max // 4


class TraceReplayError(ValueError):
    """A trace that cannot drive a simulation; the message says why."""


# --------------------------------------------------------------------------- step time


@dataclass(frozen=True, eq=False)
class StepTimeModel:
    """``alpha(B) + beta(B) * tokens`` seconds, at bins of batch size B, times a residual.

    ``alpha`` and ``beta`` are interpolated linearly between the bins' mean
    batch sizes and held constant beyond them. ``residuals`` are measured over
    fitted step times of the steps fitted, in the trace's order.
    """

    batch: FloatArray
    alpha: FloatArray
    beta: FloatArray
    residuals: FloatArray
    clock: str
    steps_fitted: int
    bins_with_own_slope: int
    notes: tuple[str, ...] = ()
    floor_s: float = 1e-6

    def coefficients(self, batch_size: float) -> tuple[float, float]:
        b = float(batch_size)
        return (
            float(np.interp(b, self.batch, self.alpha)),
            float(np.interp(b, self.batch, self.beta)),
        )

    def predict(self, batch_size: float, tokens: float | FloatArray) -> float | FloatArray:
        alpha, beta = self.coefficients(batch_size)
        return np.maximum(alpha + beta * np.asarray(tokens, dtype=np.float64), self.floor_s)

    def base_step_time_s(self, batch_size: float) -> float:
        """A step of ``batch_size`` requests, none drafting."""
        return float(self.predict(batch_size, batch_size))


def _robust_line(x: FloatArray, y: FloatArray) -> tuple[float, float]:
    """(intercept, slope) by least squares, refitted without points beyond 4 MADs."""
    keep = np.ones(len(x), dtype=bool)
    slope, intercept = 0.0, float(np.median(y))
    for _ in range(4):
        slope, intercept = (float(v) for v in np.polyfit(x[keep], y[keep], 1))
        r = y - (intercept + slope * x)
        centre = float(np.median(r[keep]))
        mad = float(np.median(np.abs(r[keep] - centre))) * 1.4826
        if mad <= 0.0:
            break
        new = np.abs(r - centre) <= 4.0 * mad
        if new.sum() < 3 or np.ptp(x[new]) == 0 or (new == keep).all():
            break
        keep = new
    return intercept, slope


def _batch_bins(b: FloatArray) -> list[BoolArray]:
    """Masks of consecutive batch sizes, at most MAX_BINS, each of MIN_BIN_STEPS steps or more."""
    least = max(MIN_BIN_STEPS, len(b) // MAX_BINS)
    values, counts = np.unique(b, return_counts=True)
    groups: list[list[float]] = []
    current: list[float] = []
    n = 0
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        current.append(v)
        n += c
        if n >= least:
            groups.append(current)
            current, n = [], 0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return [np.isin(b, g) for g in groups]


def fit_step_time(trace: Trace, *, clock: str = "step") -> StepTimeModel:
    """Fit the step-time model to a trace's decode steps (see :class:`StepTimeModel`).

    ``clock`` ``step`` fits ``step_time_s`` (the engine's own clock, what the
    policies learned from), ``wall`` fits ``wall_time_s``. Within each
    batch-size bin whose token counts vary, the slope per token is its own;
    other bins take the variance-weighted mean of those slopes; with no
    variation anywhere, one line across batch sizes (tokens grow with the
    batch), and failing that, time proportional to tokens.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock={clock!r} must be one of {', '.join(CLOCKS)}")
    t_all = trace.step_time_s if clock == "step" else trace.wall_time_s
    batch = trace.decode_requests
    has = (batch > 0) & (t_all > 0)
    pure = has & (batch == trace.batch_size)
    notes: list[str] = []
    if int(pure.sum()) >= MIN_FIT_STEPS:
        use = pure
    else:
        use = has
        notes.append(
            "fewer than 50 decode-only steps: steps with prefill are fitted too, "
            "their prompt tokens counted as tokens"
        )
    if int(use.sum()) < 10:
        raise TraceReplayError(
            f"{trace.name}: {int(use.sum())} steps with decoding requests and a positive "
            f"{clock} time; a step-time model needs at least 10"
        )
    b = batch[use].astype(np.float64)
    x = trace.scheduled_tokens[use].astype(np.float64)
    y = t_all[use].astype(np.float64)
    bins = _batch_bins(b)
    fits: list[tuple[float, float] | None] = []
    weights: list[float] = []
    for m in bins:
        xm = x[m]
        if np.ptp(xm) >= 2 and float(np.std(xm)) >= 0.5 and int(m.sum()) >= 3:
            fits.append(_robust_line(xm, y[m]))
            weights.append(float(((xm - xm.mean()) ** 2).sum()))
        else:
            fits.append(None)
    own = [f for f in fits if f is not None]
    if own:
        pooled = float(np.average([f[1] for f in own], weights=weights))
    elif np.ptp(x) >= 2:
        pooled = _robust_line(x, y)[1]
        notes.append(
            "no batch size has steps with different token counts: the cost per token is "
            "fitted across batch sizes"
        )
    else:
        pooled = float(np.median(y / x))
        notes.append("every step had the same token count: step time taken as proportional")
    knots, alpha, beta = [], [], []
    for m, fit in zip(bins, fits, strict=True):
        xm, ym = x[m], y[m]
        if fit is None:
            slope = max(pooled, 0.0)
            intercept = float(np.median(ym - slope * xm))
        else:
            intercept, slope = fit
            slope = max(slope, 0.0)
        if intercept < 0.0:  # through the origin instead
            intercept = 0.0
            slope = float((xm * ym).sum() / (xm * xm).sum())
        knots.append(float(b[m].mean()))
        alpha.append(intercept)
        beta.append(slope)
    order = np.argsort(knots)
    model = StepTimeModel(
        batch=np.asarray(knots)[order],
        alpha=np.asarray(alpha)[order],
        beta=np.asarray(beta)[order],
        residuals=np.zeros(0),
        clock=clock,
        steps_fitted=int(use.sum()),
        bins_with_own_slope=len(own),
        notes=tuple(notes),
        floor_s=float(y.min()) * 0.05,
    )
    fitted = np.array([model.predict(bi, xi) for bi, xi in zip(b, x, strict=True)])
    return dataclasses.replace(model, residuals=y / fitted)


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, eq=False)
class ReplayRequests:
    """A trace's requests as flat round arrays, sorted by (request, position).

    ``key = request * stride + position`` is increasing, so the round that
    covers a position is one ``searchsorted`` away. ``hazard[c, i]`` is class
    c's probability of accepting draft position i+1 given the first i were.
    """

    classes: tuple[str, ...]
    drafter: str
    max_k: int
    # per request
    req_class: IntArray
    req_start: IntArray  # position of its first recorded round
    req_length: IntArray  # tokens committed at its end (as recorded)
    arrival: IntArray  # request indices in the order the trace first saw them
    # per round
    key: IntArray
    position: IntArray
    drafted: IntArray
    accepted: IntArray
    limited: BoolArray  # the drafter proposed fewer than the round's K
    censored: BoolArray  # accepted everything up to K: what lay beyond is unknown
    stride: int
    hazard: FloatArray  # [class, position]
    expected_drafted: FloatArray  # [class, K] for K = 0..max_k
    row_share: FloatArray  # [class] share of request-rounds
    extrapolated_from: IntArray  # [class] first position with no evidence (max_k+1: none)

    @property
    def num_requests(self) -> int:
        return int(self.req_class.shape[0])

    @property
    def num_rounds(self) -> int:
        return int(self.key.shape[0])


def replay_requests(trace: Trace) -> ReplayRequests:
    """Sort a trace's rounds per request and estimate each class's acceptance per position."""
    if trace.num_rows == 0:
        raise TraceReplayError(f"{trace.name}: no request rounds to replay")
    max_k = trace.max_k
    if max_k < 1 or not trace.drafter:
        raise TraceReplayError(
            f"{trace.name}: recorded without a drafter (max_k={max_k}): nothing to replay"
        )
    order = np.lexsort((trace.position, trace.request))
    req = trace.request[order]
    pos = trace.position[order]
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = (req[1:] != req[:-1]) | (pos[1:] != pos[:-1])
    order = order[keep]
    req, pos = req[keep], pos[keep]
    drafted = trace.drafted[order]
    accepted = trace.accepted[order]
    k = trace.k[order]
    cls = trace.class_index[order]
    first_step = trace.row_step[order]
    _, first, dense = np.unique(req, return_index=True, return_inverse=True)
    dense = dense.astype(np.int64)
    last = np.append(first[1:], len(req)) - 1
    req_class = cls[first]
    req_start = pos[first]
    req_length = pos[last] + accepted[last] + 1
    arrival = np.argsort(first_step[first], kind="stable").astype(np.int64)
    limited = (k >= 0) & (drafted < k)
    censored = (accepted == drafted) & ~limited
    stride = int(req_length.max()) + 1
    key = dense * stride + pos

    n_classes = len(trace.classes)
    hazard = np.zeros((n_classes, max_k))
    extrapolated_from = np.full(n_classes, max_k + 1, dtype=np.int64)
    expected_drafted = np.zeros((n_classes, max_k + 1))
    row_share = np.bincount(cls, minlength=n_classes) / len(cls)
    stopped_at = np.where(censored, -1, accepted + 1)  # first position that failed
    for c in range(n_classes):
        m = cls == c
        a_c, stop_c = accepted[m], stopped_at[m]
        last_known = 0.0
        for i in range(1, max_k + 1):
            successes = int((a_c >= i).sum())
            failures = int((stop_c == i).sum())
            if successes + failures > 0:
                last_known = successes / (successes + failures)
            elif extrapolated_from[c] > max_k:
                extrapolated_from[c] = i
            hazard[c, i - 1] = last_known
        lim_c, d_c = limited[m], drafted[m]
        for kk in range(max_k + 1):
            expected_drafted[c, kk] = float(np.where(lim_c, np.minimum(kk, d_c), kk).mean())
    return ReplayRequests(
        classes=trace.classes,
        drafter=trace.drafter,
        max_k=max_k,
        req_class=req_class.astype(np.int64),
        req_start=req_start.astype(np.int64),
        req_length=req_length.astype(np.int64),
        arrival=arrival,
        key=key.astype(np.int64),
        position=pos.astype(np.int64),
        drafted=drafted.astype(np.int64),
        accepted=accepted.astype(np.int64),
        limited=limited,
        censored=censored,
        stride=stride,
        hazard=hazard,
        expected_drafted=expected_drafted,
        row_share=row_share,
        extrapolated_from=extrapolated_from,
    )


# --------------------------------------------------------------------------- the model


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


# --------------------------------------------------------------------------- the scenario


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


# --------------------------------------------------------------------------- the world


class TraceWorld:
    """The world of a :class:`TraceScenario`: replayed requests, fitted step times."""

    def __init__(self, scenario: TraceScenario, rng: np.random.Generator) -> None:
        assert scenario.replay is not None
        self.scenario = scenario
        self.model: TraceModel = scenario.model  # type: ignore[assignment]
        self.replay = scenario.replay
        self.rng = rng
        # step-time residuals from a stream of their own: every policy sees the same ones
        self._noise_rng = np.random.default_rng(int(rng.integers(2**63)))
        self.step = 0
        self.batch_size = scenario.batch
        self.mix = scenario.mix_vector()
        self._events = EventQueue(scenario.events)
        self._cursor = 0
        self._paused: collections.deque[tuple[int, int]] = collections.deque()
        self.slot_req, self.slot_pos = self._admit(self.batch_size)
        self.slot_class = self.replay.req_class[self.slot_req]
        self._residual_at = 0
        self._residual_left = 0
        self.rounds_total = 0
        self.rounds_drawn = 0  # rounds that needed acceptance the trace did not record
        self.requests_started = len(self.slot_req)
        self._refresh_truth()

    # ----------------------------------------------------------- truth

    def _refresh_truth(self) -> None:
        model = self.model
        self.expected_tokens = model.expected_tokens()
        self.cost = model.cost(self.batch_size)
        self.base_step_time_s = model.base_step_time_s(self.batch_size)
        self.goodput = self.expected_tokens / (self.cost * self.base_step_time_s / self.batch_size)

    def best_arm(self, class_id: int) -> int:
        """The arm with the highest expected goodput for a class's average request, now."""
        return int(np.argmax(self.goodput[class_id]))

    # ----------------------------------------------------------- requests

    def _admit(self, n: int) -> tuple[IntArray, IntArray]:
        """The next ``n`` requests: paused ones first, then arrivals in the trace's order."""
        reqs: list[int] = []
        positions: list[int] = []
        replay = self.replay
        while len(reqs) < n:
            if self._paused:
                r, p = self._paused.popleft()
            else:
                r = int(replay.arrival[self._cursor])
                self._cursor = (self._cursor + 1) % len(replay.arrival)
                p = int(replay.req_start[r])
            reqs.append(r)
            positions.append(p)
        return np.asarray(reqs, dtype=np.int64), np.asarray(positions, dtype=np.int64)

    def apply_events(self) -> list[object]:
        """Apply the load changes due at the current step; return them."""
        fired: list[object] = list(self._events.pop_due(self.step))
        for e in fired:
            if not isinstance(e, LoadChange) or e.batch == len(self.slot_req):
                continue
            n = len(self.slot_req)
            if e.batch > n:
                reqs, positions = self._admit(e.batch - n)
                self.requests_started += len(reqs)
                self.slot_req = np.concatenate([self.slot_req, reqs])
                self.slot_pos = np.concatenate([self.slot_pos, positions])
            else:  # the requests over the new batch wait, and resume first
                waiting = zip(
                    self.slot_req[e.batch :].tolist(),
                    self.slot_pos[e.batch :].tolist(),
                    strict=True,
                )
                self._paused.extendleft(reversed(list(waiting)))
                self.slot_req = self.slot_req[: e.batch]
                self.slot_pos = self.slot_pos[: e.batch]
            self.slot_class = self.replay.req_class[self.slot_req]
            self.batch_size = e.batch
        if fired:
            self._refresh_truth()
        return fired

    def replay_round(
        self, req: IntArray, pos: IntArray, k: IntArray, cls: IntArray
    ) -> tuple[IntArray, IntArray, BoolArray]:
        """(drafted, accepted, drawn) of one round of requests ``req`` at positions ``pos``
        with K = ``k``; ``drawn`` marks rounds whose acceptance the trace did not record."""
        r = self.replay
        j = np.searchsorted(r.key, req * r.stride + pos, side="right") - 1
        offset = pos - r.position[j]
        recorded = r.accepted[j]
        inside = offset <= recorded
        run = np.where(inside, recorded - offset, 0)
        censored = np.where(inside, r.censored[j], True)
        limited = inside & r.limited[j]
        available = np.where(limited, r.drafted[j] - offset, _UNBOUNDED)
        drafted = np.minimum(k, available)
        accepted = np.minimum(run, drafted)
        drawn = censored & (drafted > run)
        if drawn.any():
            idx = np.flatnonzero(drawn)
            width = int(drafted[idx].max())
            depth = np.arange(width)[None, :]
            ok = self.rng.random((len(idx), width)) < r.hazard[cls[idx], :width]
            ok |= depth < run[idx, None]
            ok &= depth < drafted[idx, None]
            accepted[idx] = np.cumprod(ok, axis=1).sum(axis=1)
        return drafted.astype(np.int64), accepted.astype(np.int64), drawn

    def _residual(self) -> float:
        residuals = self.model.step_model.residuals
        if self._residual_left == 0:
            self._residual_at = int(self._noise_rng.integers(len(residuals)))
            self._residual_left = RESIDUAL_BLOCK_STEPS
        value = float(residuals[self._residual_at])
        self._residual_at = (self._residual_at + 1) % len(residuals)
        self._residual_left -= 1
        return value

    def run_round(self, request_arm: IntArray) -> tuple[IntArray, IntArray, FloatArray, float]:
        """One step with these arms per request: (drafted, accepted, charged seconds, step time)."""
        req, pos, cls = self.slot_req, self.slot_pos, self.slot_class
        k = self.model.arm_k[request_arm]
        drafted, accepted, drawn = self.replay_round(req, pos, k, cls)
        remaining = self.replay.req_length[req] - pos
        accepted = np.minimum(accepted, remaining - 1)
        batch = len(req)
        step_model = self.model.step_model
        alpha, beta = step_model.coefficients(batch)
        tokens = float(batch + drafted.sum())
        step_time = float(step_model.predict(batch, tokens)) * self._residual()
        weight = alpha / batch + beta * (1.0 + drafted)
        total = float(weight.sum())
        charged: FloatArray = (
            step_time * weight / total if total > 0 else np.full(batch, step_time / batch)
        ).astype(np.float64)
        self.rounds_total += batch
        self.rounds_drawn += int(drawn.sum())
        # requests advance; finished ones are replaced by the next arrivals
        self.slot_pos = pos + accepted + 1
        done = np.flatnonzero(self.slot_pos >= self.replay.req_length[req])
        if len(done):
            reqs, positions = self._admit(len(done))
            self.requests_started += len(done)
            self.slot_req = req.copy()
            self.slot_req[done] = reqs
            self.slot_pos[done] = positions
            self.slot_class = self.replay.req_class[self.slot_req]
        self.step += 1
        return drafted, accepted, charged, step_time
