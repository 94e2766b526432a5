"""The step-time model of trace-driven simulation, fitted to a trace's decode steps.

A simulated step must take as long as the recorded engine's steps did at the
same batch size and tokens, heavy tails and bursts of slow steps included:
per batch-size bin ``alpha + beta * tokens``, interpolated between bins, times
a residual the world (:mod:`specctl.sim.trace_world`) resamples from the
trace's own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from specctl.sim.trace_replay import TraceReplayError

if TYPE_CHECKING:
    from specctl.trace.format import Trace

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

MIN_FIT_STEPS = 50  # decode-only steps needed to leave steps with prefill out of the fit
MIN_BIN_STEPS = 30  # steps per batch-size bin of the step-time fit, at least
MAX_BINS = 12
CLOCKS = ("step", "wall")


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
