"""A decision log prepared for estimation: numpy columns grouped into units and steps.

The unit of evaluation is a *step-context*: the rows of one (engine, step,
workload class) that ran one arm. All of them came from a single draw of the
engine's sampler, so they share one importance weight, and estimators weight
each unit once with its rows' rewards summed. Rows of a unit are adjacent in
the log (the writer groups them); a unit is a run of rows with the same
engine, step, time, class, bucket and arm.

Rewards, per request-round (one row):

- ``tokens``: committed tokens, accepted + 1;
- ``seconds``: the row's share of its step's wall time, the step time split in
  proportion to the fitted cost of each row (:mod:`specctl.replay.cost`),
  so the shares of a step add up to its measured time.

Goodput (committed tokens per second of engine time) is a ratio of the two.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from specctl.arms import OFF, Arm
from specctl.decisionlog.rows import LogRows, runs
from specctl.replay.cost import StepCostModel, fit_step_cost, step_features

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class LoggedRounds:
    """Rows, units and steps of a log as arrays; see the module docstring."""

    classes: tuple[str, ...]
    engines: tuple[str, ...]
    drafters: tuple[str, ...]
    # Every arm the log can say something about: ``off``, each logged arm and,
    # for each logged drafter, every shorter K. Index = arm code.
    arms: tuple[Arm, ...]
    num_buckets: int
    # contexts (class, bucket) present in the log, index = context code
    context_class: IntArray
    context_bucket: IntArray
    # steps, length S
    step_time_s: FloatArray
    step_end_unix_s: FloatArray
    step_bucket: IntArray
    step_rows: FloatArray
    step_drafted: FloatArray  # (S, drafters): draft tokens per drafter
    step_spec_rows: FloatArray  # (S, drafters): rows that speculated with each drafter
    step_engine: IntArray
    step_index: IntArray
    step_batch_size: IntArray
    step_scheduled_tokens: IntArray
    # the engine's batch drafter (a code into batch_drafters, "": none reported) and the K
    # it drafted at in the step (-1: not reported), for a candidate that learns step cost
    batch_drafters: tuple[str, ...]
    step_batch_drafter: IntArray
    step_draft_k: IntArray
    # units, length U (a unit's rows are rows[unit_start[u]:unit_start[u] + unit_rows[u]])
    unit_start: IntArray
    unit_step: IntArray
    unit_context: IntArray
    unit_class: IntArray
    unit_arm: IntArray
    unit_drafter: IntArray  # -1 for off
    unit_k: IntArray
    unit_propensity: FloatArray
    unit_rows: FloatArray
    unit_tokens: FloatArray
    unit_seconds: FloatArray
    unit_drafted: FloatArray
    # What each unit would have yielded at a shorter proposal length k (column k,
    # for k <= unit_k; zero elsewhere): tokens sum(min(accepted, k) + 1) and
    # drafts sum(min(drafted, k)). Exact when a shorter proposal is a prefix of
    # the longer one (n-gram, draft models, MTP) and verification is greedy.
    unit_tokens_at_k: FloatArray
    unit_drafted_at_k: FloatArray
    # rows, length R
    row_drafted: IntArray
    row_accepted: IntArray
    row_seconds: FloatArray
    row_unit: IntArray
    cost: StepCostModel

    @property
    def num_rows(self) -> int:
        return int(self.row_drafted.shape[0])

    @property
    def num_units(self) -> int:
        return int(self.unit_step.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.step_time_s.shape[0])

    @property
    def num_contexts(self) -> int:
        return int(self.context_class.shape[0])

    @property
    def max_k(self) -> int:
        return max((a.k for a in self.arms), default=0)

    def arm_code(self, arm: Arm) -> int | None:
        try:
            return self.arms.index(arm)
        except ValueError:
            return None

    def context_name(self, context: int) -> tuple[str, int]:
        return self.classes[int(self.context_class[context])], int(self.context_bucket[context])

    @functools.cached_property
    def step_features(self) -> FloatArray:
        """(steps, 2 + 2 * drafters): what the step cost model multiplies, per step."""
        return step_features(self.step_rows, self.step_spec_rows, self.step_drafted)

    def unit_cost_features(self) -> FloatArray:
        """(units, 2 + 2 * drafters): each unit's part of its step's features (an equal
        share of the intercept)."""
        nd = len(self.drafters)
        drafter = self.unit_drafter
        out = np.zeros((self.num_units, 2 + 2 * nd))
        out[:, 0] = self.unit_rows / self.step_rows[self.unit_step]
        out[:, 1] = self.unit_rows
        spec = np.flatnonzero(drafter >= 0)
        out[spec, 2 + drafter[spec]] = self.unit_rows[spec]
        out[spec, 2 + nd + drafter[spec]] = self.unit_drafted[spec]
        return out

    def attribute_seconds(self, cost: StepCostModel) -> FloatArray:
        """Seconds per unit: each step's time split in proportion to its rows' cost
        under ``cost`` (equally where the model predicts nothing). Equal to summing
        the rows' shares; computed from unit totals, so the bootstrap can redo it
        cheaply.
        """
        theta = cost.coefficients[self.step_bucket]
        predicted = np.einsum("sp,sp->s", self.step_features, theta)
        ok = predicted > 0.0
        scale = np.where(ok, self.step_time_s / np.where(ok, predicted, 1.0), 0.0)
        step = self.unit_step
        unit_cost = np.einsum("up,up->u", self.unit_cost_features(), theta[step])
        equal = self.step_time_s[step] * self.unit_rows / self.step_rows[step]
        return np.where(ok[step], unit_cost * scale[step], equal)

    @functools.cached_property
    def truncation_groups(self) -> TruncationGroups:
        """Speculative units grouped by (context, drafter): what the truncation model sums."""
        return TruncationGroups(self)

    def context_inverse_rows(self, step_weights: FloatArray | None = None) -> FloatArray:
        """Mean of 1/rows-in-step over the rows of each context (a row's share of the intercept)."""
        w = (
            self.unit_rows
            if step_weights is None
            else self.unit_rows * step_weights[self.unit_step]
        )
        inv = w / self.step_rows[self.unit_step]
        num = np.bincount(self.unit_context, weights=inv, minlength=self.num_contexts)
        den = np.bincount(self.unit_context, weights=w, minlength=self.num_contexts)
        return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


class TruncationGroups:
    """Speculative units sorted by (context, drafter), for fast grouped sums in the bootstrap.

    ``matrix`` holds, per unit, the tokens, drafts and rounds it would have
    yielded at each proposal length k (3k columns); ``keys`` and ``starts``
    delimit the runs of one (context, drafter).
    """

    def __init__(self, data: LoggedRounds) -> None:
        nd = max(len(data.drafters), 1)
        spec = data.unit_drafter >= 0
        key = data.unit_context[spec] * nd + data.unit_drafter[spec]
        order = np.argsort(key, kind="stable")
        self.units = np.flatnonzero(spec)[order]
        sorted_key = key[order]
        self.starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
        if not sorted_key.size:
            self.starts = np.zeros(0, dtype=np.int64)
        self.keys = sorted_key[self.starts]
        k = data.unit_tokens_at_k.shape[1]
        u = self.units
        rows_at_k = data.unit_rows[u, None] * (data.unit_k[u, None] >= np.arange(k)[None, :])
        self.matrix = np.hstack([data.unit_tokens_at_k[u], data.unit_drafted_at_k[u], rows_at_k])
        self.num_k = k


def prepare(table: pa.Table) -> LoggedRounds:
    """Group a checked decision-log table (see :func:`read_decision_log`) into units and steps."""
    if table.num_rows == 0:
        raise ValueError("the decision log has no rows to evaluate")
    rows = LogRows.from_table(table)
    engine, cls, arm_code = rows.engine, rows.workload_class, rows.arm
    time_unix, step_index, bucket = rows.time_unix_s, rows.step_index, rows.load_bucket
    drafted, accepted, step_time = rows.drafted, rows.accepted, rows.step_time_s

    logged_arms = [a for a in rows.arms if a is not None]
    drafters = tuple(sorted({a.drafter for a in logged_arms if not a.is_off}))
    max_k = {d: max(a.k for a in logged_arms if a.drafter == d) for d in drafters}
    universe = [OFF] + [Arm(d, k) for d in drafters for k in range(1, max_k[d] + 1)]
    to_universe = np.asarray(
        [-1 if a is None else universe.index(a) for a in rows.arms], dtype=np.int64
    )
    if (to_universe[arm_code] < 0).any():
        raise ValueError("the decision log has rows whose arm is not 'off' or '<drafter>/k=<K>'")
    drafter_of = np.asarray(
        [-1 if a.is_off else drafters.index(a.drafter) for a in universe], dtype=np.int64
    )
    k_of = np.asarray([a.k for a in universe], dtype=np.int64)
    row_arm = to_universe[arm_code]

    step_start = runs(engine, step_index, time_unix)
    unit_start = runs(engine, step_index, time_unix, cls, bucket, row_arm)
    n_rows = table.num_rows
    marks = np.zeros(n_rows, dtype=np.int64)
    marks[step_start] = 1
    step_of_row = np.cumsum(marks) - 1
    unit_step = step_of_row[unit_start]
    unit_rows = np.diff(np.append(unit_start, n_rows)).astype(np.float64)
    step_rows = np.diff(np.append(step_start, n_rows)).astype(np.float64)
    num_buckets = int(bucket.max()) + 1

    row_drafter = drafter_of[row_arm]
    s = step_start.shape[0]
    nd = max(len(drafters), 1)
    step_drafted: FloatArray = np.zeros((s, len(drafters)))
    step_spec_rows: FloatArray = np.zeros((s, len(drafters)))
    if drafters:
        has = row_drafter >= 0
        key = step_of_row[has] * nd + row_drafter[has]
        sums = np.bincount(key, weights=drafted[has].astype(np.float64), minlength=s * nd)
        step_drafted = sums.astype(np.float64).reshape(s, nd)[:, : len(drafters)]
        counts = np.bincount(key, minlength=s * nd).astype(np.float64)
        step_spec_rows = counts.reshape(s, nd)[:, : len(drafters)]
    s_bucket = bucket[step_start]
    s_time = step_time[step_start]
    cost = fit_step_cost(
        s_bucket, s_time, step_features(step_rows, step_spec_rows, step_drafted), num_buckets
    )

    # Split each step's time across its rows in proportion to each row's fitted cost.
    row_bucket = bucket
    row_cost = cost.intercept[row_bucket] / step_rows[step_of_row] + cost.per_row[row_bucket]
    if drafters:
        d = np.maximum(row_drafter, 0)
        spec_cost = cost.per_spec_row[row_bucket, d] + cost.per_draft[row_bucket, d] * drafted
        row_cost = row_cost + np.where(row_drafter >= 0, spec_cost, 0.0)
    predicted = np.add.reduceat(row_cost, step_start)
    ok = predicted > 0.0
    scale = np.where(ok, s_time / np.where(ok, predicted, 1.0), 0.0)
    row_seconds = np.where(
        ok[step_of_row], row_cost * scale[step_of_row], s_time[step_of_row] / step_rows[step_of_row]
    )

    unit_cls = cls[unit_start]
    unit_bucket = bucket[unit_start]
    ctx_key = unit_cls * num_buckets + unit_bucket
    ctx_keys, unit_context = np.unique(ctx_key, return_inverse=True)
    unit_arm = row_arm[unit_start]
    top = max(k_of.max(initial=0), 0)
    tokens_at_k = np.zeros((unit_start.shape[0], top + 1))
    drafted_at_k = np.zeros((unit_start.shape[0], top + 1))
    unit_k = k_of[unit_arm]
    for k in range(1, top + 1):
        live = unit_k >= k
        tokens_at_k[:, k] = np.where(
            live, np.add.reduceat(np.minimum(accepted, k) + 1.0, unit_start), 0.0
        )
        drafted_at_k[:, k] = np.where(
            live, np.add.reduceat(np.minimum(drafted, k).astype(np.float64), unit_start), 0.0
        )
    row_unit = np.repeat(np.arange(unit_start.shape[0]), unit_rows.astype(np.int64))
    return LoggedRounds(
        classes=rows.classes,
        engines=rows.engines,
        drafters=drafters,
        arms=tuple(universe),
        num_buckets=num_buckets,
        context_class=(ctx_keys // num_buckets).astype(np.int64),
        context_bucket=(ctx_keys % num_buckets).astype(np.int64),
        step_time_s=s_time,
        step_end_unix_s=time_unix[step_start],
        step_bucket=s_bucket,
        step_rows=step_rows,
        step_drafted=step_drafted,
        step_spec_rows=step_spec_rows,
        step_engine=engine[step_start],
        step_index=step_index[step_start],
        step_batch_size=rows.batch_size[step_start],
        step_scheduled_tokens=rows.num_scheduled_tokens[step_start],
        batch_drafters=rows.batch_drafters,
        step_batch_drafter=rows.batch_drafter[step_start],
        step_draft_k=rows.draft_k[step_start],
        unit_start=unit_start,
        unit_step=unit_step,
        unit_context=unit_context.astype(np.int64),
        unit_class=unit_cls,
        unit_arm=unit_arm,
        unit_drafter=drafter_of[unit_arm],
        unit_k=unit_k,
        unit_propensity=rows.propensity[unit_start],
        unit_rows=unit_rows,
        unit_tokens=np.add.reduceat((accepted + 1).astype(np.float64), unit_start),
        unit_seconds=np.add.reduceat(row_seconds, unit_start),
        unit_drafted=np.add.reduceat(drafted.astype(np.float64), unit_start),
        unit_tokens_at_k=tokens_at_k,
        unit_drafted_at_k=drafted_at_k,
        row_drafted=drafted,
        row_accepted=accepted,
        row_seconds=row_seconds,
        row_unit=row_unit,
        cost=cost,
    )
