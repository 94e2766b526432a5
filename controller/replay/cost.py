"""A step-time model fitted to logged steps: what a request-round costs under an arm.

Per load bucket ``b``, a step's wall time is modelled as
``intercept[b] + per_row[b] * rows + sum_d (per_spec_row[b, d] * rows_d +
per_draft[b, d] * drafted_d)``, where ``rows_d`` is the number of rows that
speculated with drafter ``d`` (a drafter's fixed cost per round: its own
forward pass, verification overhead) and ``drafted_d`` the draft tokens it
proposed in the step, fitted by least squares. The intercept, the cost per row and per draft token
are kept non-negative; a drafter's fixed cost per row is not, so that a true
value of zero is not biased upwards by the clipping (the total cost of a
speculating row stays what the data say). It serves twice: to
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
    per_spec_row: FloatArray  # (buckets, drafters)
    per_draft: FloatArray  # (buckets, drafters)
    rank_deficient: bool = False

    @property
    def coefficients(self) -> FloatArray:
        """(buckets, 2 + 2 * drafters): intercept, per row, per speculating row and per
        draft token of each drafter; the order of :func:`step_features`."""
        return np.column_stack([self.intercept, self.per_row, self.per_spec_row, self.per_draft])


def step_features(rows: FloatArray, spec_rows: FloatArray, drafted: FloatArray) -> FloatArray:
    """(steps, 2 + 2 * drafters): what the cost model's coefficients multiply."""
    return np.column_stack([np.ones_like(rows), rows, spec_rows, drafted])


def _nonnegative_solve(
    xtx: FloatArray, xty: FloatArray, constrained: npt.NDArray[np.bool_]
) -> tuple[FloatArray, bool]:
    """Least squares from the normal equations, ``constrained`` coefficients clipped
    to >= 0 by solving again without the negative ones; also whether X was rank
    deficient."""
    p = xtx.shape[0]
    scale = np.sqrt(np.maximum(np.diag(xtx), 1e-300))
    a = xtx / np.outer(scale, scale)  # equilibrated: a well-posed fit has a ~ correlation matrix
    eig = np.linalg.eigvalsh(a)
    deficient = bool(eig.min() < 1e-9 * max(eig.max(), 1e-300))
    active = np.ones(p, dtype=bool)
    coef = np.zeros(p)
    for _ in range(p):
        sub = a[np.ix_(active, active)]
        rhs = (xty / scale)[active]
        sol = np.linalg.lstsq(sub, rhs, rcond=1e-10)[0]
        coef[:] = 0.0
        coef[active] = sol / scale[active]
        negative = (coef < 0.0) & constrained
        if not negative.any():
            break
        active &= ~negative
        coef[negative] = 0.0
        if not active.any():
            break
    return coef, deficient


class StepCostFitter:
    """Fits :class:`StepCostModel` to one set of steps under many step weightings.

    The per-step normal-equation terms are computed once, so a bootstrap
    replicate's refit is a product of its weights with them, not a pass over
    the rows. Buckets with too few steps, or no variation to tell the
    coefficients apart (one arm only), use the fit over all steps.
    """

    def __init__(
        self, bucket: IntArray, step_time_s: FloatArray, features: FloatArray, num_buckets: int
    ) -> None:
        x = features
        self.p = x.shape[1]
        self.num_buckets = num_buckets
        self.num_drafters = (self.p - 2) // 2
        # Constant columns besides the intercept (every step the same size) cannot be
        # told apart from it: they are left out of the fit, their coefficient 0.
        spread = x.max(axis=0) - x.min(axis=0) if len(x) else np.zeros(self.p)
        self._fixed = np.flatnonzero((spread == 0) & (np.arange(self.p) > 0))
        self._constrained = np.ones(self.p, dtype=bool)
        self._constrained[2 : 2 + self.num_drafters] = False  # per speculating row
        # per step: x x^T (flattened), x y and 1, grouped by bucket
        terms = np.column_stack(
            [np.einsum("sp,sq->spq", x, x).reshape(-1, self.p * self.p), x * step_time_s[:, None]]
        )
        self._terms = np.column_stack([terms, np.ones(len(x))])
        self._bucket = bucket

    def _solve(self, sums: FloatArray) -> StepCostModel:
        """``sums``: (buckets, p*p + p + 1) weighted sums of the per-step terms."""
        p = self.p
        xtx = sums[:, : p * p].reshape(-1, p, p).copy()
        xty = sums[:, p * p : p * p + p].copy()
        counts = sums[:, -1]
        for j in self._fixed:  # solve for 0: a unit row, a zero right-hand side
            xtx[:, j, :] = 0.0
            xtx[:, :, j] = 0.0
            xtx[:, j, j] = np.maximum(counts, 1.0)
            xty[:, j] = 0.0
        pooled, deficient = _nonnegative_solve(xtx.sum(axis=0), xty.sum(axis=0), self._constrained)
        coef = np.tile(pooled, (self.num_buckets, 1))
        for b in range(self.num_buckets):
            if counts[b] < MIN_STEPS_PER_FEATURE * p:
                continue
            fit, bucket_deficient = _nonnegative_solve(xtx[b], xty[b], self._constrained)
            if not bucket_deficient:
                coef[b] = fit
        nd = self.num_drafters
        return StepCostModel(
            coef[:, 0].copy(),
            coef[:, 1].copy(),
            coef[:, 2 : 2 + nd].copy(),
            coef[:, 2 + nd :].copy(),
            deficient,
        )

    def fit(self, weights: FloatArray | None = None) -> StepCostModel:
        return self.fit_many(np.ones((1, len(self._bucket))) if weights is None else weights[None])[
            0
        ]

    def fit_many(self, weights: FloatArray) -> list[StepCostModel]:
        """One model per row of ``weights`` (replicates, steps)."""
        sums = np.zeros((weights.shape[0], self.num_buckets, self._terms.shape[1]))
        for b in range(self.num_buckets):
            mask = self._bucket == b
            if mask.any():
                sums[:, b] = weights[:, mask] @ self._terms[mask]
        return [self._solve(s) for s in sums]


def fit_step_cost(
    bucket: IntArray,
    step_time_s: FloatArray,
    features: FloatArray,
    num_buckets: int,
    weights: FloatArray | None = None,
) -> StepCostModel:
    """Fit per bucket; ``features`` from :func:`step_features`, ``weights`` one per step."""
    return StepCostFitter(bucket, step_time_s, features, num_buckets).fit(weights)
