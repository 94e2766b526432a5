"""Step reports on the wire: packed column-wise by the engine, decoded and checked here.

:func:`encode_step_report` packs an engine's :class:`~specctl.steps.StepRecord` list with
interned class and arm names. :func:`decode_step_report` turns a report into
a :class:`~specctl.steps.StepBatch`, or raises :class:`ReportError` naming the
field, the row and the value; the caller counts it by ``reason`` and carries
on. The rules on the columns' values are two tables, :data:`STEP_CHECKS` and
:data:`ROW_CHECKS`, checked in order; the first rule broken is the one
reported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specctl.api import pb
from specctl.arms import Arm, ArmError, parse_arm
from specctl.steps import StepBatch, StepRecord, validate_class_name

MAX_STEP_TIME_S = 3600.0
# uint64 on the wire, int64 in a StepBatch: larger values would wrap to negative numbers.
INT64_MAX = 2**63 - 1

# One value per step, step_index first; then one value per request row.
STEP_COLUMNS = (
    "step_index",
    "step_time_s",
    "batch_size",
    "num_scheduled_tokens",
    "policy_version",
    "load_bucket",
    "num_requests",
    "step_end_unix_s",
)
ROW_COLUMNS = ("class_index", "arm_index", "propensity", "drafted", "accepted")
# The numpy type each column is read as: int64 unless named here.
_READ_AS: dict[str, type] = {
    "step_index": np.uint64,
    "policy_version": np.uint64,
    "step_time_s": np.float64,
    "step_end_unix_s": np.float64,
    "propensity": np.float64,
}


class ReportError(ValueError):
    """A report that breaks the protocol's rules. ``reason`` is a short metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Columns:
    """A report's columns as numpy arrays, and what the rules compare them with."""

    values: dict[str, np.ndarray]
    num_load_buckets: int
    classes: tuple[str, ...] = ()
    arms: tuple[Arm, ...] = ()

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]


@dataclass(frozen=True)
class ColumnCheck:
    """A rule on one column's values.

    ``bad`` marks the rows that break it; the first of them is reported as
    ``<column>[<row>]=<value> <rule>``, under the metric label ``reason``.
    """

    column: str
    reason: str
    bad: Callable[[Columns], np.ndarray]
    rule: str | Callable[[Columns, int], str]

    def check(self, cols: Columns) -> None:
        """Raise :class:`ReportError` for the first row that breaks the rule."""
        broken = self.bad(cols)
        if not broken.any():
            return
        i = int(np.flatnonzero(broken)[0])
        value = cols[self.column][i]
        shown = repr(float(value)) if value.dtype.kind == "f" else str(int(value))
        rule = self.rule if isinstance(self.rule, str) else self.rule(cols, i)
        raise ReportError(self.reason, f"{self.column}[{i}]={shown} {rule}")


def _outside(low: float, high: float) -> Callable[[np.ndarray], np.ndarray]:
    """Marks values that are not finite or not in (low, high]."""
    return lambda v: ~np.isfinite(v) | (v <= low) | (v > high)


_step_time_bad = _outside(0.0, MAX_STEP_TIME_S)
_propensity_bad = _outside(0.0, 1.0)

STEP_CHECKS: tuple[ColumnCheck, ...] = (
    ColumnCheck(
        "step_time_s",
        "step_time",
        lambda c: _step_time_bad(c["step_time_s"]),
        f"must be finite and in (0, {MAX_STEP_TIME_S:g}]",
    ),
    ColumnCheck(
        "step_end_unix_s",
        "step_end",
        lambda c: ~np.isfinite(c["step_end_unix_s"]) | (c["step_end_unix_s"] < 0.0),
        "must be a finite non-negative time",
    ),
    ColumnCheck(
        "num_requests",
        "num_requests",
        lambda c: c["num_requests"] > c["batch_size"],
        lambda c, i: f"exceeds batch_size[{i}]={c['batch_size'][i]}",
    ),
    ColumnCheck(
        "load_bucket",
        "load_bucket",
        lambda c: c["load_bucket"] >= c.num_load_buckets,
        lambda c, _: f"must be below {c.num_load_buckets}, the number of buckets in the policy",
    ),
    ColumnCheck(
        "step_index", "step_index", lambda c: c["step_index"] > INT64_MAX, "must be below 2**63"
    ),
    ColumnCheck(
        "policy_version",
        "policy_version",
        lambda c: c["policy_version"] > INT64_MAX,
        "must be below 2**63",
    ),
)

ROW_CHECKS: tuple[ColumnCheck, ...] = (
    ColumnCheck(
        "class_index",
        "class_index",
        lambda c: c["class_index"] >= len(c.classes),
        lambda c, _: f"is outside class_table (size {len(c.classes)})",
    ),
    ColumnCheck(
        "arm_index",
        "arm_index",
        lambda c: c["arm_index"] >= len(c.arms),
        lambda c, _: f"is outside arm_table (size {len(c.arms)})",
    ),
    ColumnCheck(
        "propensity", "propensity", lambda c: _propensity_bad(c["propensity"]), "must be in (0, 1]"
    ),
    ColumnCheck(
        "drafted",
        "drafted",
        lambda c: c["drafted"] > c["arm_k"],
        lambda c, i: f"exceeds the K of its arm {c.arms[int(c['arm_index'][i])].name!r}",
    ),
    ColumnCheck(
        "accepted",
        "accepted",
        lambda c: c["accepted"] > c["drafted"],
        lambda c, i: f"exceeds drafted[{i}]={c['drafted'][i]}",
    ),
)


def _read(
    report: pb.StepReport, names: Sequence[str], length: int, per: str
) -> dict[str, np.ndarray]:
    """The named columns as arrays, each checked to hold ``length`` values."""
    out: dict[str, np.ndarray] = {}
    for name in names:
        values = getattr(report, name)
        if len(values) != length:
            raise ReportError("column_length", f"{name} has {len(values)} values, {per}")
        out[name] = np.asarray(values, dtype=_READ_AS.get(name, np.int64))
    return out


def _class_table(names: Sequence[str]) -> tuple[str, ...]:
    for j, name in enumerate(names):
        problem = validate_class_name(name)
        if problem is not None:
            raise ReportError("class_name", f"class_table[{j}]: {problem}")
    return tuple(names)


def _arm_table(names: Sequence[str], offered: Mapping[str, int]) -> tuple[Arm, ...]:
    arms: list[Arm] = []
    for j, name in enumerate(names):
        try:
            arm = parse_arm(name)
        except ArmError as exc:
            raise ReportError("unknown_arm", f"arm_table[{j}]={name!r}: {exc}") from None
        if not arm.is_off:
            max_k = offered.get(arm.drafter)
            if max_k is None:
                raise ReportError(
                    "unknown_arm",
                    f"arm_table[{j}]={name!r}: drafter {arm.drafter!r} was not offered "
                    f"in the hello (offered: {sorted(offered) or 'none'})",
                )
            if arm.k > max_k:
                raise ReportError(
                    "k_above_max",
                    f"arm_table[{j}]={name!r}: k={arm.k} exceeds the drafter's max_k={max_k}",
                )
        arms.append(arm)
    return tuple(arms)


def decode_step_report(
    report: pb.StepReport,
    *,
    engine_id: str,
    offered: Mapping[str, int],
    num_load_buckets: int,
    batch_drafter: str = "",
) -> StepBatch:
    """Validate ``report`` against the engine's offered drafters (name -> max K).

    ``num_load_buckets`` is the number of buckets in the policy the engine was
    given; load_bucket must be below it. ``batch_drafter`` is the drafter the
    engine's hello named as running for the whole batch: the report's
    ``draft_k`` column, when present, is its K per step.
    """
    s = len(report.step_index)
    if s == 0:
        raise ReportError("empty", "step_index is empty: a report carries at least one step")
    cols = Columns(
        _read(report, STEP_COLUMNS, s, f"step_index has {s}: one per step"), num_load_buckets
    )
    for check in STEP_CHECKS:
        check.check(cols)

    r = int(cols["num_requests"].sum())
    rows = _read(report, ROW_COLUMNS, r, f"sum(num_requests) is {r}: one per request row")
    cols.classes = _class_table(report.class_table)
    cols.arms = _arm_table(report.arm_table, offered)
    cols.values.update(rows)
    # Each row's K; an index outside the arm table is reported by its rule, before
    # any rule reads this.
    arm_k_table = np.fromiter((a.k for a in cols.arms), dtype=np.int64, count=len(cols.arms))
    in_table = np.minimum(rows["arm_index"], max(len(cols.arms) - 1, 0))
    cols.values["arm_k"] = arm_k_table[in_table] if cols.arms else np.zeros(r, dtype=np.int64)
    for check in ROW_CHECKS:
        check.check(cols)
    draft_k = _draft_k(report, s, offered.get(batch_drafter, 0)) if batch_drafter else None

    return StepBatch(
        engine_id=engine_id,
        sequence=int(report.sequence),
        step_index=cols["step_index"].astype(np.int64),
        step_time_s=cols["step_time_s"],
        batch_size=cols["batch_size"],
        num_scheduled_tokens=cols["num_scheduled_tokens"],
        policy_version=cols["policy_version"].astype(np.int64),
        load_bucket=cols["load_bucket"],
        num_requests=cols["num_requests"],
        step_end_unix_s=cols["step_end_unix_s"],
        classes=cols.classes,
        arms=cols.arms,
        request_step=np.repeat(np.arange(s, dtype=np.int64), cols["num_requests"]),
        class_index=cols["class_index"],
        arm_index=cols["arm_index"],
        propensity=cols["propensity"],
        drafted=cols["drafted"],
        accepted=cols["accepted"],
        arm_k=cols["arm_k"],
        batch_drafter=batch_drafter if draft_k is not None else "",
        draft_k=draft_k,
    )


def _draft_k(report: pb.StepReport, num_steps: int, max_k: int) -> np.ndarray | None:
    """The batch drafter's K per step: None when the column is empty (not reported)."""
    n = len(report.draft_k)
    if n == 0:
        return None
    if n != num_steps:
        raise ReportError(
            "column_length", f"draft_k has {n} values, step_index has {num_steps}: one per step"
        )
    values = np.asarray(report.draft_k, dtype=np.int64)
    above = np.flatnonzero(values > max_k)
    if above.size:
        i = int(above[0])
        raise ReportError(
            "k_above_max",
            f"draft_k[{i}]={int(values[i])} exceeds the batch drafter's max_k={max_k}",
        )
    return values


def encode_step_report(sequence: int, steps: Sequence[StepRecord]) -> pb.StepReport:
    """Pack steps column-wise with interned class and arm names."""
    class_ids: dict[str, int] = {}
    arm_ids: dict[str, int] = {}
    class_index: list[int] = []
    arm_index: list[int] = []
    propensity: list[float] = []
    drafted: list[int] = []
    accepted: list[int] = []
    for st in steps:
        for c in st.classes:
            class_index.append(class_ids.setdefault(c, len(class_ids)))
        for a in st.arms:
            arm_index.append(arm_ids.setdefault(a, len(arm_ids)))
        propensity.extend(st.propensity)
        drafted.extend(st.drafted)
        accepted.extend(st.accepted)
    return pb.StepReport(
        sequence=sequence,
        step_index=[st.step_index for st in steps],
        step_time_s=[st.step_time_s for st in steps],
        batch_size=[st.batch_size for st in steps],
        num_scheduled_tokens=[st.num_scheduled_tokens for st in steps],
        policy_version=[st.policy_version for st in steps],
        load_bucket=[st.load_bucket for st in steps],
        num_requests=[len(st.classes) for st in steps],
        step_end_unix_s=[st.step_end_unix_s for st in steps],
        class_table=list(class_ids),
        arm_table=list(arm_ids),
        class_index=class_index,
        arm_index=arm_index,
        propensity=propensity,
        drafted=drafted,
        accepted=accepted,
        # only when every step has one: a partial column would not line up with the steps
        draft_k=[st.draft_k for st in steps] if all(st.draft_k >= 0 for st in steps) else [],
    )
