"""Step reports of random rows, for tests that need something to learn, keep and restore.

What a snapshot, a restart or a decision log must carry is whatever was learned,
so their tests need reports that are valid and varied rather than realistic:
each row draws its arm and class uniformly (so its propensity is one over the
number of arms), drafts its arm's K and accepts a binomial share of it; each
step draws its load bucket, and takes longer the more its rows drafted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from specctl.api import pb
from specctl.arms import parse_arm
from specctl.protocol.reports import encode_step_report
from specctl.steps import StepRecord

BASE_STEP_TIME_S = 0.02
DRAFT_STEP_TIME_S = 0.002  # per draft token a row proposes, on average over the step
STEP_TIME_NOISE_S = 0.002  # uniform, added to every step


@dataclass(frozen=True)
class RandomReports:
    """The shape of the reports: which arms and classes, how many steps and rows."""

    arms: tuple[str, ...]
    classes: tuple[str, ...]
    steps_per_report: int = 3
    rows_per_step: int = 8
    num_load_buckets: int = 2
    acceptance: float = 0.7
    step_interval_s: float = 0.005

    def __post_init__(self) -> None:
        if not self.arms or not self.classes:
            raise ValueError("reports need at least one arm and one class")
        for arm in self.arms:
            parse_arm(arm)
        if min(self.steps_per_report, self.rows_per_step, self.num_load_buckets) < 1:
            raise ValueError("steps_per_report, rows_per_step and num_load_buckets must be >= 1")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"acceptance {self.acceptance} must be in [0, 1]")

    def reports(
        self, n: int, seed: int, start_unix_s: float | None = None
    ) -> Iterator[pb.StepReport]:
        """Reports 1 to ``n``, drawn from ``seed``; steps end ``step_interval_s`` apart,
        the first that long after ``start_unix_s`` (now, by default)."""
        rng = np.random.default_rng(seed)
        t = time.time() if start_unix_s is None else start_unix_s
        rows = self.rows_per_step
        for sequence in range(1, n + 1):
            steps = []
            for j in range(self.steps_per_report):
                t += self.step_interval_s
                arms = [self.arms[i] for i in rng.integers(0, len(self.arms), rows)]
                drafted = [parse_arm(a).k for a in arms]
                step_time_s = (
                    BASE_STEP_TIME_S
                    + DRAFT_STEP_TIME_S * sum(drafted) / rows
                    + rng.uniform(0, STEP_TIME_NOISE_S)
                )
                steps.append(
                    StepRecord(
                        step_index=sequence * self.steps_per_report + j,
                        step_time_s=float(step_time_s),
                        batch_size=rows,
                        num_scheduled_tokens=rows + sum(drafted),
                        policy_version=1,
                        load_bucket=int(rng.integers(0, self.num_load_buckets)),
                        step_end_unix_s=t,
                        classes=[self.classes[i] for i in rng.integers(0, len(self.classes), rows)],
                        arms=arms,
                        propensity=[1.0 / len(self.arms)] * rows,
                        drafted=drafted,
                        accepted=[int(rng.binomial(d, self.acceptance)) for d in drafted],
                    )
                )
            yield encode_step_report(sequence, steps)
