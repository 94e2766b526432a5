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
  (:func:`~.trace_step_time.fit_step_time`): per batch-size bin, ``alpha + beta * tokens``
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

The pieces: the requests to replay (:mod:`specctl.sim.trace_replay`), the
step-time fit (:mod:`specctl.sim.trace_step_time`), the scenario and its
target model (:mod:`specctl.sim.trace_scenario`); this module is the world
that runs them.
"""

from __future__ import annotations

import collections

import numpy as np
import numpy.typing as npt

from specctl.sim.scenario import EventQueue, LoadChange
from specctl.sim.trace_scenario import TraceModel, TraceScenario

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

RESIDUAL_BLOCK_STEPS = 16  # consecutive residuals resampled together
_UNBOUNDED = np.iinfo(np.int64).max // 4


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
