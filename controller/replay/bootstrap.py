"""The Poisson bootstrap over steps that every estimator's intervals come from.

A replicate gives each step a Poisson(1) weight; every unit of a step gets the
step's weight, so rows that shared a step's time and draw stay together. Each
replicate also refits the step cost model under its weights, so intervals
carry the cost model's uncertainty too. One plan serves every estimator and
candidate on one log.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specctl.replay.cost import StepCostFitter, StepCostModel
from specctl.replay.data import LoggedRounds

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Resample:
    """The log as one bootstrap replicate sees it (``step_weights`` None: the log itself)."""

    step_weights: FloatArray | None
    cost: StepCostModel

    @classmethod
    def of(cls, data: LoggedRounds) -> Resample:
        """The log itself: every step once, the cost model fitted to it."""
        return cls(None, data.cost)

    def unit_weights(self, data: LoggedRounds) -> FloatArray:
        if self.step_weights is None:
            return np.ones(data.num_units)
        return self.step_weights[data.unit_step]

    def unit_seconds(self, data: LoggedRounds) -> FloatArray:
        """Seconds per unit as this replicate splits step time."""
        if self.step_weights is None:
            return data.unit_seconds
        return data.attribute_seconds(self.cost)


class Bootstrap:
    """``n_bootstrap_samples`` replicates of the log; iterate to get them one at a time.

    Weights are kept as one byte per step and replicate; the cost models are
    refitted once, here, for all replicates.
    """

    def __init__(
        self, data: LoggedRounds, n_bootstrap_samples: int = 200, random_state: int | None = None
    ) -> None:
        if n_bootstrap_samples < 1:
            raise ValueError(f"n_bootstrap_samples={n_bootstrap_samples} must be at least 1")
        self.data = data
        self.n = n_bootstrap_samples
        self.original = Resample.of(data)
        rng = np.random.default_rng(random_state)
        self._weights = np.minimum(
            rng.poisson(1.0, (self.n, data.num_steps)), np.iinfo(np.uint8).max
        ).astype(np.uint8)
        fitter = StepCostFitter(
            data.step_bucket, data.step_time_s, data.step_features, data.num_buckets
        )
        self._costs: list[StepCostModel] = []
        chunk = max(1, 8_000_000 // max(data.num_steps, 1))
        for lo in range(0, self.n, chunk):
            self._costs += fitter.fit_many(self._weights[lo : lo + chunk].astype(np.float64))

    def step_weights(self, b: int) -> FloatArray:
        return self._weights[b].astype(np.float64)

    def __iter__(self) -> Iterator[Resample]:
        for b in range(self.n):
            yield Resample(self.step_weights(b), self._costs[b])
