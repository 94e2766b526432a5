"""Step reports: the columns an engine sends, decoded and validated once.

Everything downstream (the policy, the decision log, metrics, the simulator)
works on a :class:`StepBatch`, numpy columns that were checked field by field
here, so no later stage has to defend itself against bad input again.
A bad report raises :class:`ReportError` naming the field, the row and the
value; the caller counts it by ``reason`` and carries on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from specctl.api import pb
from specctl.arms import Arm, ArmError, parse_arm

MAX_CLASS_NAME_LEN = 64
MAX_STEP_TIME_S = 3600.0
CLASS_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-/]{0,63}$")

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class ReportError(ValueError):
    """A report that breaks the protocol's rules. ``reason`` is a short metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def validate_class_name(name: str) -> str | None:
    """Return None if ``name`` is a valid workload class, else what is wrong with it."""
    if not CLASS_NAME_RE.match(name):
        return (
            f"workload class {name[:80]!r} must be 1-{MAX_CLASS_NAME_LEN} of "
            "[A-Za-z0-9_.:/-], starting alphanumeric"
        )
    return None


@dataclass(frozen=True)
class StepBatch:
    """S steps and R request rows from one engine, as validated numpy columns."""

    engine_id: str
    sequence: int
    # step columns, length S
    step_index: IntArray
    step_time_s: FloatArray
    batch_size: IntArray
    num_scheduled_tokens: IntArray
    policy_version: IntArray
    load_bucket: IntArray
    num_requests: IntArray
    step_end_unix_s: FloatArray
    # interned tables
    classes: tuple[str, ...]
    arms: tuple[Arm, ...]
    # request columns, length R
    request_step: IntArray  # index into the step columns
    class_index: IntArray
    arm_index: IntArray
    propensity: FloatArray
    drafted: IntArray
    accepted: IntArray
    # derived: the arm's K per request row (0 for off)
    arm_k: IntArray = field(repr=False)

    @property
    def num_steps(self) -> int:
        return int(self.step_index.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.class_index.shape[0])


def _col(values: Sequence[float] | Sequence[int], dtype: type) -> np.ndarray:
    return np.asarray(values, dtype=dtype)


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def decode_step_report(
    report: pb.StepReport,
    *,
    engine_id: str,
    offered: Mapping[str, int],
    num_load_buckets: int,
) -> StepBatch:
    """Validate ``report`` against the engine's offered drafters (name -> max K).

    ``num_load_buckets`` is the number of buckets in the policy the engine was
    given; load_bucket must be below it.
    """
    s = len(report.step_index)
    if s == 0:
        raise ReportError("empty", "step_index is empty: a report carries at least one step")
    for name in (
        "step_time_s",
        "batch_size",
        "num_scheduled_tokens",
        "policy_version",
        "load_bucket",
        "num_requests",
        "step_end_unix_s",
    ):
        n = len(getattr(report, name))
        if n != s:
            raise ReportError(
                "column_length", f"{name} has {n} values, step_index has {s}: one per step"
            )
    step_time = _col(report.step_time_s, np.float64)
    bad = ~np.isfinite(step_time) | (step_time <= 0.0) | (step_time > MAX_STEP_TIME_S)
    if bad.any():
        i = _first_bad(bad)
        raise ReportError(
            "step_time",
            f"step_time_s[{i}]={float(step_time[i])!r} must be finite and in "
            f"(0, {MAX_STEP_TIME_S:g}]",
        )
    end = _col(report.step_end_unix_s, np.float64)
    bad = ~np.isfinite(end) | (end < 0.0)
    if bad.any():
        i = _first_bad(bad)
        raise ReportError(
            "step_end", f"step_end_unix_s[{i}]={float(end[i])!r} must be a finite non-negative time"
        )
    batch = _col(report.batch_size, np.int64)
    num_req = _col(report.num_requests, np.int64)
    bad = num_req > batch
    if bad.any():
        i = _first_bad(bad)
        raise ReportError(
            "num_requests",
            f"num_requests[{i}]={num_req[i]} exceeds batch_size[{i}]={batch[i]}",
        )
    bucket = _col(report.load_bucket, np.int64)
    bad = bucket >= num_load_buckets
    if bad.any():
        i = _first_bad(bad)
        raise ReportError(
            "load_bucket",
            f"load_bucket[{i}]={bucket[i]} must be below {num_load_buckets}, "
            "the number of buckets in the policy",
        )

    r = int(num_req.sum())
    for name in ("class_index", "arm_index", "propensity", "drafted", "accepted"):
        n = len(getattr(report, name))
        if n != r:
            raise ReportError(
                "column_length",
                f"{name} has {n} values, sum(num_requests) is {r}: one per request row",
            )

    classes = tuple(report.class_table)
    for j, name in enumerate(classes):
        problem = validate_class_name(name)
        if problem is not None:
            raise ReportError("class_name", f"class_table[{j}]: {problem}")
    arms: list[Arm] = []
    for j, name in enumerate(report.arm_table):
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

    class_index = _col(report.class_index, np.int64)
    bad = class_index >= len(classes)
    if bad.any():
        i = _first_bad(bad)
        raise ReportError(
            "class_index",
            f"class_index[{i}]={class_index[i]} is outside class_table (size {len(classes)})",
        )
    arm_index = _col(report.arm_index, np.int64)
    bad = arm_index >= len(arms)
    if bad.any():
        i = _first_bad(bad)
        raise ReportError(
            "arm_index", f"arm_index[{i}]={arm_index[i]} is outside arm_table (size {len(arms)})"
        )
    propensity = _col(report.propensity, np.float64)
    bad = ~np.isfinite(propensity) | (propensity <= 0.0) | (propensity > 1.0)
    if bad.any():
        i = _first_bad(bad)
        raise ReportError(
            "propensity", f"propensity[{i}]={float(propensity[i])!r} must be in (0, 1]"
        )
    drafted = _col(report.drafted, np.int64)
    accepted = _col(report.accepted, np.int64)
    arm_k_table = np.fromiter((a.k for a in arms), dtype=np.int64, count=len(arms))
    arm_k = arm_k_table[arm_index] if r else np.zeros(0, dtype=np.int64)
    bad = drafted > arm_k
    if bad.any():
        i = _first_bad(bad)
        raise ReportError(
            "drafted",
            f"drafted[{i}]={drafted[i]} exceeds the K of its arm {arms[int(arm_index[i])].name!r}",
        )
    bad = accepted > drafted
    if bad.any():
        i = _first_bad(bad)
        raise ReportError(
            "accepted", f"accepted[{i}]={accepted[i]} exceeds drafted[{i}]={drafted[i]}"
        )

    request_step = np.repeat(np.arange(s, dtype=np.int64), num_req)
    return StepBatch(
        engine_id=engine_id,
        sequence=int(report.sequence),
        step_index=_col(report.step_index, np.int64),
        step_time_s=step_time,
        batch_size=batch,
        num_scheduled_tokens=_col(report.num_scheduled_tokens, np.int64),
        policy_version=_col(report.policy_version, np.int64),
        load_bucket=bucket,
        num_requests=num_req,
        step_end_unix_s=end,
        classes=classes,
        arms=tuple(arms),
        request_step=request_step,
        class_index=class_index,
        arm_index=arm_index,
        propensity=propensity,
        drafted=drafted,
        accepted=accepted,
        arm_k=arm_k,
    )


@dataclass
class StepRecord:
    """One step as an engine (or the simulator) records it before encoding."""

    step_index: int
    step_time_s: float
    batch_size: int
    num_scheduled_tokens: int
    policy_version: int
    load_bucket: int
    step_end_unix_s: float
    # per request row
    classes: list[str] = field(default_factory=list)
    arms: list[str] = field(default_factory=list)
    propensity: list[float] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)


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
    )


def load_bucket_of(batch_size: int, bounds: Sequence[int]) -> int:
    """Bucket b holds batch sizes <= bounds[b]; larger ones fall in len(bounds)."""
    for b, bound in enumerate(bounds):
        if batch_size <= bound:
            return b
    return len(bounds)
