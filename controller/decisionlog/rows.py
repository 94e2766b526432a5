"""Decision-log rows decoded into numpy columns, and step batches built from them.

Every consumer of the log reads rows the same way: the sidecar, when a
restart rebuilds what it learned from the log's tail, and offline replay,
which prepares the log for its estimators and hands a learning candidate the
rounds it accepted as step batches. :class:`LogRows` is that decoding (the
dictionary-encoded names as codes into tables) and :func:`to_step_batch` the
one way rows become a :class:`~specctl.steps.StepBatch` again: the inverse of
:func:`specctl.decisionlog.schema.batches_to_table`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from specctl.arms import Arm, ArmError, parse_arm
from specctl.decisionlog.schema import NO_BATCH_DRAFTER, NO_DRAFT_K
from specctl.steps import StepBatch

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# The smallest step time a batch of part of a step's rows carries (a StepBatch's are positive).
MIN_STEP_TIME_S = 1e-9


def dictionary_codes(column: pa.ChunkedArray) -> tuple[IntArray, list[str]]:
    """Integer codes and their values for a (possibly multi-dictionary) string column."""
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    column = column.unify_dictionaries()
    if column.num_chunks == 0:
        return np.zeros(0, dtype=np.int64), []
    values = column.chunk(0).dictionary.to_pylist()
    codes = np.concatenate(
        [c.indices.to_numpy(zero_copy_only=False).astype(np.int64) for c in column.chunks]
    )
    return codes, values


def runs(*keys: np.ndarray) -> IntArray:
    """Start index of each run of equal consecutive keys."""
    n = keys[0].shape[0]
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change).astype(np.int64)


def _parse(name: str) -> Arm | None:
    try:
        return parse_arm(name)
    except ArmError:
        return None


@dataclass(frozen=True, eq=False)
class LogRows:
    """Decision-log rows as columns (one entry per row); names as codes into the tables.

    Every column of the schema but ``num_requests``, which the rows of a step
    count themselves.
    """

    engines: tuple[str, ...]
    classes: tuple[str, ...]
    arms: tuple[Arm | None, ...]  # None: a logged name that is not an arm
    batch_drafters: tuple[str, ...]  # "": none reported
    engine: IntArray
    workload_class: IntArray
    arm: IntArray
    time_unix_s: FloatArray  # when the row's step ended
    step_index: IntArray
    load_bucket: IntArray
    propensity: FloatArray
    drafted: IntArray
    accepted: IntArray
    step_time_s: FloatArray
    batch_size: IntArray
    num_scheduled_tokens: IntArray
    policy_version: IntArray
    report_sequence: IntArray
    # the batch drafter (a code into batch_drafters) and the K it drafted at in the row's
    # step (-1: not reported)
    batch_drafter: IntArray
    draft_k: IntArray

    @classmethod
    def from_table(cls, table: pa.Table) -> LogRows:
        """Decode a decision-log table (see :data:`specctl.decisionlog.schema.SCHEMA`)."""
        engine, engines = dictionary_codes(table.column("engine_id"))
        workload_class, classes = dictionary_codes(table.column("workload_class"))
        arm, arm_names = dictionary_codes(table.column("arm"))
        batch_drafter, batch_drafters = dictionary_codes(table.column("batch_drafter"))

        def ints(name: str) -> IntArray:
            return table.column(name).to_numpy().astype(np.int64, copy=False)

        def floats(name: str) -> FloatArray:
            return table.column(name).to_numpy().astype(np.float64, copy=False)

        return cls(
            engines=tuple(engines),
            classes=tuple(classes),
            arms=tuple(_parse(a) for a in arm_names),
            batch_drafters=tuple(batch_drafters),
            engine=engine,
            workload_class=workload_class,
            arm=arm,
            time_unix_s=floats("time_unix_s"),
            step_index=ints("step_index"),
            load_bucket=ints("load_bucket"),
            propensity=floats("propensity"),
            drafted=ints("drafted"),
            accepted=ints("accepted"),
            step_time_s=floats("step_time_s"),
            batch_size=ints("batch_size"),
            num_scheduled_tokens=ints("num_scheduled_tokens"),
            policy_version=ints("policy_version"),
            report_sequence=ints("report_sequence"),
            batch_drafter=batch_drafter,
            draft_k=ints("draft_k"),
        )

    @property
    def num_rows(self) -> int:
        return int(self.engine.shape[0])

    def take(self, rows: IntArray) -> LogRows:
        """These rows (indices, in the order given), with the same tables."""
        return replace(self, **{name: getattr(self, name)[rows] for name in _ROW_COLUMNS})

    def compact(self) -> LogRows:
        """The same rows with tables of only the names they use (in code order)."""
        classes, workload_class = np.unique(self.workload_class, return_inverse=True)
        arms, arm = np.unique(self.arm, return_inverse=True)
        return replace(
            self,
            classes=tuple(self.classes[int(c)] for c in classes),
            arms=tuple(self.arms[int(a)] for a in arms),
            workload_class=workload_class.astype(np.int64),
            arm=arm.astype(np.int64),
        )


_ROW_COLUMNS = tuple(
    name
    for name in LogRows.__dataclass_fields__
    if name not in ("engines", "classes", "arms", "batch_drafters")
)


def to_step_batch(rows: LogRows, *, row_seconds: FloatArray | None = None) -> StepBatch:
    """The rows of one engine as one StepBatch, its sequence the first row's report's.

    Steps are runs of rows with the same step index and end time; a step's
    columns come from its first row, and its ``num_requests`` counts its rows
    here. ``row_seconds``: each row's share of its step's time, for a batch
    of part of each step's rows (a learning candidate's accepted rounds in
    replay); a step's time is then its rows' shares summed. The batch drafter
    and its K per step are those the engine reported (:func:`batch_draft_k`),
    so the batch learns as the report it was logged from.
    """
    if rows.num_rows == 0:
        raise ValueError("a step batch needs at least one row")
    engines = np.unique(rows.engine)
    if engines.shape[0] != 1:
        raise ValueError(f"rows of {engines.shape[0]} engines; a step batch is one engine's")
    arms = tuple(a for a in rows.arms if a is not None)
    if len(arms) != len(rows.arms):
        raise ValueError("the arm table holds a name that is not 'off' or '<drafter>/k=<K>'")
    first = runs(rows.step_index, rows.time_unix_s)
    marks = np.zeros(rows.num_rows, dtype=np.int64)
    marks[first] = 1
    request_step = np.cumsum(marks) - 1
    if row_seconds is None:
        step_time_s = rows.step_time_s[first]
    else:
        step_time_s = np.maximum(
            np.bincount(request_step, weights=row_seconds, minlength=first.shape[0]),
            MIN_STEP_TIME_S,
        )
    batch_drafter, draft_k = batch_draft_k(
        rows.batch_drafters, rows.batch_drafter[first], rows.draft_k[first]
    )
    return StepBatch(
        engine_id=rows.engines[int(engines[0])],
        sequence=int(rows.report_sequence[0]),
        step_index=rows.step_index[first],
        step_time_s=step_time_s,
        batch_size=rows.batch_size[first],
        num_scheduled_tokens=rows.num_scheduled_tokens[first],
        policy_version=rows.policy_version[first],
        load_bucket=rows.load_bucket[first],
        num_requests=np.bincount(request_step, minlength=first.shape[0]).astype(np.int64),
        step_end_unix_s=rows.time_unix_s[first],
        classes=rows.classes,
        arms=arms,
        request_step=request_step,
        class_index=rows.workload_class,
        arm_index=rows.arm,
        propensity=rows.propensity,
        drafted=rows.drafted,
        accepted=rows.accepted,
        arm_k=np.asarray([a.k for a in arms], dtype=np.int64)[rows.arm],
        batch_drafter=batch_drafter,
        draft_k=draft_k,
    )


def batch_draft_k(
    names: tuple[str, ...], drafter: IntArray, draft_k: IntArray
) -> tuple[str, IntArray | None]:
    """A step batch's batch drafter and its K per step, from each step's (a code into
    ``names``) and K: the drafter most steps report a K for, and -1 on the steps of
    another (as :func:`specctl.steps.merge_batches`); ``("", None)`` when no step
    reports one, as a report without the column (or a log written before it) decodes."""
    reported = np.array([n != NO_BATCH_DRAFTER for n in names], dtype=bool)
    known = (draft_k >= 0) & reported[drafter] if names else np.zeros(0, dtype=bool)
    if not known.any():
        return NO_BATCH_DRAFTER, None
    chosen = int(np.argmax(np.bincount(drafter[known], minlength=len(names))))
    return names[chosen], np.where(known & (drafter == chosen), draft_k, NO_DRAFT_K).astype(
        np.int64
    )


def report_batches(rows: LogRows) -> Iterator[StepBatch]:
    """The batches the rows came in: one per run of rows of one engine's report, each
    with the classes and arms it uses."""
    starts = runs(rows.engine, rows.report_sequence)
    ends = np.r_[starts[1:], rows.num_rows]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        yield to_step_batch(rows.take(np.arange(s, e)).compact())
