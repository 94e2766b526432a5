"""Steps: what an engine did, as it records it and as the controller learns from it.

A :class:`StepRecord` is one scheduler step as the engine (or the simulator)
records it. A :class:`StepBatch` is S steps and R request rows as numpy
columns, already validated (:mod:`specctl.protocol.reports` decodes them from
the wire), so the policy, the decision log and the metrics never defend
themselves against bad input again. :func:`merge_batches` joins several
batches so the policy learns from them in one update; :func:`load_bucket_of`
maps a batch size to its load bucket.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from specctl.arms import Arm

MAX_CLASS_NAME_LEN = 64
CLASS_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-/]{0,63}$")

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


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
    # The drafter the engine runs for the whole batch ("" when the engine did not say), and
    # per step the K it proposed in that step (-1: not reported). The step's drafts are
    # verified in the next step, under that step's arms; the time they took is this step's.
    batch_drafter: str = ""
    draft_k: IntArray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.step_index.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.class_index.shape[0])


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
    # the K the batch drafter proposed in this step (-1: not reported)
    draft_k: int = -1


def load_bucket_of(batch_size: int, bounds: Sequence[int]) -> int:
    """Bucket b holds batch sizes <= bounds[b]; larger ones fall in len(bounds)."""
    for b, bound in enumerate(bounds):
        if batch_size <= bound:
            return b
    return len(bounds)


MERGED_ENGINE_ID = "<merged>"


def merge_batches(batches: Sequence[StepBatch]) -> StepBatch:
    """One batch holding every step and row of ``batches``, in order, with merged tables.

    Under load, reports arrive faster than the policy can recompute its
    decisions after each of them; learning from their merge recomputes once.
    The policy sees the same steps and rows either way.
    """
    if len(batches) == 1:
        return batches[0]
    classes: dict[str, int] = {}
    arms: dict[Arm, int] = {}
    class_index, arm_index, request_step = [], [], []
    offset = 0
    for b in batches:
        cmap = np.array([classes.setdefault(c, len(classes)) for c in b.classes], dtype=np.int64)
        amap = np.array([arms.setdefault(a, len(arms)) for a in b.arms], dtype=np.int64)
        if b.num_rows:
            class_index.append(cmap[b.class_index])
            arm_index.append(amap[b.arm_index])
            request_step.append(b.request_step + offset)
        offset += b.num_steps

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(b, name) for b in batches])

    def rows(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    return StepBatch(
        engine_id=MERGED_ENGINE_ID,
        sequence=0,
        step_index=cat("step_index"),
        step_time_s=cat("step_time_s"),
        batch_size=cat("batch_size"),
        num_scheduled_tokens=cat("num_scheduled_tokens"),
        policy_version=cat("policy_version"),
        load_bucket=cat("load_bucket"),
        num_requests=cat("num_requests"),
        step_end_unix_s=cat("step_end_unix_s"),
        classes=tuple(classes),
        arms=tuple(arms),
        request_step=rows(request_step),
        class_index=rows(class_index),
        arm_index=rows(arm_index),
        propensity=cat("propensity"),
        drafted=cat("drafted"),
        accepted=cat("accepted"),
        arm_k=cat("arm_k"),
        **_merged_draft_k(batches),
    )


def _merged_draft_k(batches: Sequence[StepBatch]) -> dict[str, Any]:
    """The batch drafter most steps report a K for, and their K (-1 on the others' steps)."""
    counts: dict[str, int] = {}
    for b in batches:
        if b.batch_drafter and b.draft_k is not None:
            counts[b.batch_drafter] = counts.get(b.batch_drafter, 0) + b.num_steps
    if not counts:
        return {}
    drafter = max(counts, key=lambda d: counts[d])
    parts = [
        b.draft_k
        if b.batch_drafter == drafter and b.draft_k is not None
        else np.full(b.num_steps, -1, dtype=np.int64)
        for b in batches
    ]
    return {"batch_drafter": drafter, "draft_k": np.concatenate(parts)}
