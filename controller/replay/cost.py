"""A step-time model fitted to logged steps: what a request-round costs under an arm.

Per load bucket ``b``, a step's wall time is modelled as
``intercept[b] + per_row[b] * rows + sum_d per_draft[b, d] * drafted_d``, where
``drafted_d`` is the number of draft tokens drafter ``d`` proposed in the step,
fitted by least squares with non-negative coefficients. It serves twice: to
split a step's measured time across its rows (a row that drafted more carries
more of the step), and to predict what a round would cost at a shorter
proposal length, which the log never ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MIN_STEPS_PER_FEATURE = 4


@dataclass(frozen=True)
class StepCostModel:
    """Coefficients per load bucket (rows of the arrays) in seconds."""

    intercept: FloatArray  # (buckets,)
    per_row: FloatArray  # (buckets,)
    per_draft: FloatArray  # (buckets, drafters)
    rank_deficient: bool = False

    def predict(self, bucket: IntArray, rows: FloatArray, drafted: FloatArray) -> FloatArray:
        """Step time for steps in ``bucket`` with ``rows`` and ``drafted[:, d]`` per drafter."""
        return (
            self.intercept[bucket]
            + self.per_row[bucket] * rows
            + np.einsum("sd,sd->s", self.per_draft[bucket], drafted)
        )


def _nonnegative_lstsq(
    x: FloatArray, y: FloatArray, w: FloatArray | None
) -> tuple[FloatArray, bool]:
    """Least squares with coefficients clipped to >= 0 by refitting without the negative ones."""
    if w is not None:
        sw = np.sqrt(w)
        x, y = x * sw[:, None], y * sw
    active = np.ones(x.shape[1], dtype=bool)
    coef = np.zeros(x.shape[1])
    rank_deficient = False
    for _ in range(x.shape[1]):
        sol, _res, rank, _sv = np.linalg.lstsq(x[:, active], y, rcond=None)
        rank_deficient = bool(rank < int(active.sum()))
        coef[:] = 0.0
        coef[active] = sol
        negative = coef < 0.0
        if not negative.any():
            break
        active &= ~negative
        coef[negative] = 0.0
        if not active.any():
            break
    return coef, rank_deficient


def fit_step_cost(
    bucket: IntArray,
    step_time_s: FloatArray,
    rows: FloatArray,
    drafted: FloatArray,
    num_buckets: int,
    weights: FloatArray | None = None,
) -> StepCostModel:
    """Fit per bucket; buckets with too few steps share the fit over all steps.

    ``drafted`` is (steps, drafters); ``weights`` (per step) serve the bootstrap.
    """
    num_drafters = drafted.shape[1]
    x = np.column_stack([np.ones_like(rows), rows, drafted])
    p = x.shape[1]
    pooled, pooled_deficient = _nonnegative_lstsq(x, step_time_s, weights)
    intercept = np.full(num_buckets, pooled[0])
    per_row = np.full(num_buckets, pooled[1])
    per_draft = np.tile(pooled[2:], (num_buckets, 1)).reshape(num_buckets, num_drafters)
    deficient = pooled_deficient
    for b in range(num_buckets):
        mask = bucket == b
        if int(mask.sum()) < MIN_STEPS_PER_FEATURE * p:
            continue
        wb = None if weights is None else weights[mask]
        coef, bucket_deficient = _nonnegative_lstsq(x[mask], step_time_s[mask], wb)
        if bucket_deficient:
            continue  # collinear within the bucket (one arm only): the pooled fit is better
        intercept[b], per_row[b], per_draft[b] = coef[0], coef[1], coef[2:]
    return StepCostModel(intercept, per_row, per_draft, deficient)
