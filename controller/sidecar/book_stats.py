"""What the book counts as it learns and publishes, as plain numbers.

:class:`BookStats` is filled by the :class:`~specctl.sidecar.book.PolicyBook`
and knows nothing of Prometheus: the exporter in :mod:`specctl.sidecar.metrics`
reads it at scrape time and turns it into series, in the manner of vLLM's
``SpecDecodingStats`` and ``SpecDecodingProm``. The book runs on one thread and
a scrape on another: the book only adds keys, adds to values and replaces
values whole, so a scrape that copies a dict never sees a torn value.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specctl.steps import StepBatch

Context = tuple[str, int]  # (workload class, load bucket)
ClassDrafter = tuple[str, str]


@dataclass
class BookStats:
    """Totals since the book was created, and the published state that metrics show."""

    policy_version: int = 0
    classes: int = 0
    # end (unix time) of the latest step learned from, across engines
    learned_until_unix_s: float = 0.0
    # request rows whose class was folded into the default class (max_classes reached)
    class_overflow_rows: int = 0
    # (workload class, arm name) -> request-rounds the engines applied the arm to
    arm_rounds: dict[tuple[str, str], int] = field(default_factory=dict)
    # (workload class, drafter) -> speculative request-rounds, draft tokens, accepted tokens
    request_rounds: dict[ClassDrafter, int] = field(default_factory=dict)
    draft_tokens: dict[ClassDrafter, float] = field(default_factory=dict)
    accepted_tokens: dict[ClassDrafter, int] = field(default_factory=dict)
    # (workload class, drafter, position) -> request-rounds that accepted >= position tokens
    accepted_at_least: dict[tuple[str, str, int], int] = field(default_factory=dict)
    # workload class -> speculative request-rounds while the context's most likely arm is off
    probe_rounds: dict[str, int] = field(default_factory=dict)
    # workload class -> times a context's most likely arm went from a drafter to off
    switch_offs: dict[str, int] = field(default_factory=dict)
    # where (policy_update, policy_select, policy_merge, sink, fleet) -> exceptions caught there
    internal_errors: dict[str, int] = field(default_factory=dict)
    # per context: the published distribution (arm name -> probability), whether its most
    # likely arm is off, and the policy's goodput estimates for that arm and for off
    arm_probability: dict[Context, dict[str, float]] = field(default_factory=dict)
    speculation_off: dict[Context, bool] = field(default_factory=dict)
    chosen_arm_goodput: dict[Context, float] = field(default_factory=dict)
    no_spec_goodput: dict[Context, float] = field(default_factory=dict)

    def count_internal_error(self, where: str) -> None:
        self.internal_errors[where] = self.internal_errors.get(where, 0) + 1

    def count_rows(
        self,
        batch: StepBatch,
        rows_bucket: np.ndarray,
        num_load_buckets: int,
        off_contexts: Set[Context],
    ) -> None:
        """Per-class counts of a batch's rows, one bincount per quantity.

        ``rows_bucket`` is each row's load bucket; rows of a speculative arm in
        ``off_contexts`` (contexts whose most likely arm is off) are probes.
        """
        if batch.num_rows == 0:
            return
        classes, arms = batch.classes, batch.arms
        n_arms = len(arms)
        counts = np.bincount(batch.class_index * n_arms + batch.arm_index)
        arm_names = [a.name for a in arms]
        for key in np.flatnonzero(counts).tolist():
            c, a = divmod(key, n_arms)
            _add(self.arm_rounds, (classes[c], arm_names[a]), int(counts[key]))
        drafters = sorted({a.drafter for a in arms if not a.is_off})
        if not drafters:
            return
        max_k = {d: max(a.k for a in arms if a.drafter == d) for d in drafters}
        drafter_of_arm = np.array(
            [-1 if a.is_off else drafters.index(a.drafter) for a in arms], np.int64
        )
        row_drafter = drafter_of_arm[batch.arm_index]
        spec = row_drafter >= 0
        n_dr = len(drafters)
        group = (batch.class_index * n_dr + row_drafter)[spec]
        accepted = batch.accepted[spec]
        width = max(max_k.values()) + 1
        size = len(classes) * n_dr
        # hist[g, a]: rounds of group g that accepted exactly a tokens
        hist = np.bincount(group * width + accepted, minlength=size * width).reshape(size, width)
        at_least = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]
        accepted_sum = hist @ np.arange(width)
        drafted_sum = np.bincount(group, weights=batch.drafted[spec], minlength=size)
        for g in np.flatnonzero(at_least[:, 0]).tolist():
            c, d = divmod(g, n_dr)
            labels = (classes[c], drafters[d])
            _add(self.request_rounds, labels, int(at_least[g, 0]))
            _add(self.draft_tokens, labels, float(drafted_sum[g]))
            _add(self.accepted_tokens, labels, int(accepted_sum[g]))
            for pos in range(1, max_k[drafters[d]] + 1):
                _add(self.accepted_at_least, (*labels, pos), int(at_least[g, pos]))
        if off_contexts:
            nb = num_load_buckets
            probe = np.bincount((batch.class_index * nb + rows_bucket)[spec])
            for key in np.flatnonzero(probe).tolist():
                c, b = divmod(key, nb)
                if (classes[c], b) in off_contexts:
                    _add(self.probe_rounds, classes[c], int(probe[key]))


def _add(counts: dict[Any, Any], key: object, amount: float) -> None:
    counts[key] = counts.get(key, 0) + amount
