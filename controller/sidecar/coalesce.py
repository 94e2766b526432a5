"""Merge validated step batches into one, so the policy learns from many reports at once.

Under load, reports arrive faster than the policy can recompute its decisions
after each of them. The server hands the book every report that arrived while
the previous round was learned; the book merges them with :func:`merge_batches`
and updates the policy and republishes once per round. The policy sees the
same steps and rows either way: only how often it recomputes changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specctl.arms import Arm
from specctl.steps import StepBatch

MERGED_ENGINE_ID = "<merged>"


def merge_batches(batches: Sequence[StepBatch]) -> StepBatch:
    """One batch holding every step and row of ``batches``, in order, with merged tables."""
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
    )
