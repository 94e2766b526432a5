"""What a request of one class costs at one arm beyond the cost model's fit, with a long
memory of its own.

The cost model (:mod:`specctl.policy.cost`) prices a round of arm ``(d, K)`` for a class
as a line through K, the arm's own column and the class's price per drafter: one shape
over K for the mix of classes, moved up or down per class. A class's rounds do not cost
the same shape: verification attends over the class's context, and a drafter's passes
grow with it, so the cost of K over K differs by class, and not smoothly (on the AMD
study's sweep, Qwen3.5-27B's MTP costs GSM8K 0.23, 0.33, 0.24, 0.46 plain decode steps
per K from K=3 to 7, and HumanEval 0.27, 0.51, 0.54, 0.37). A class choosing between K
that are a few percent apart is biased by that shape.

A column per (class, arm) in the cost model's regression would fit it exactly, but it
costs a column for every pair (16 classes x 16 K x each drafter), and its evidence comes
from how the batch's mix of (class, arm) varies from step to step: slow, so the
cost model's memory of about a thousand steps holds too little of it to count.

So the pairs a class runs get columns here, up to ``capacity`` per load bucket (a new
pair takes the column with the least evidence left once they are taken), in statistics
kept apart from the cost model's: a discounted regression of the step time's residual
at the cost model's current fit on the pairs' requests in the step, with a memory
(``discount``) ten times the fit's. The residual is taken at the fit when the pairs are
read, not when the step came in: the statistics hold the step's features next to its
time (``N^T X``, ``N^T y``), so what the fit has learned since is not charged to the
pairs.

Only the shape is read here, not the level: per class, the deviations are centred on
their mean over the steps that ran the class's pairs, so the class's speculative rounds
cost, on the whole, what the cost model says, and its arms differ from that by what
their own steps show, across K and across drafters (a class's context can make one
drafter's passes dearer than another's, which the mix's drafter terms do not tell).
The level of a class's rounds against ``off`` is the cost model's (the line and the
class's price), on the cost model's shorter memory. A level read here would be the
residual of old steps at a fit made on recent ones: once a class stops speculating,
the fit moves on without it, its old steps' residuals grow, and a class that looked
expensive would keep looking so, and stay ``off``. With ``by_drafter``, the deviations
are centred per (class, drafter) instead, and read only each drafter's shape over K.

A deviation counts only beyond ``z`` posterior standard deviations (soft
thresholding), so a pair costs what the cost model says until its own steps show
otherwise. A change in cost detected by the cost model scales these statistics down
with its own. They are this replica's: the fleet shares the cost model's statistics,
not these.
"""

from __future__ import annotations

import numpy as np

from specctl.arms import MAX_K

# the stored statistics are rescaled once the discount accumulated on them falls below
_RESCALE_BELOW = 1e-100


class PairCost:
    """Per load bucket, discounted regression of the cost model's residual on the
    requests of each (class slot, drafter slot, K) pair in the step."""

    def __init__(
        self,
        num_buckets: int,
        num_features: int,
        max_classes: int,
        max_drafters: int,
        *,
        capacity: int,
        discount: float,
        z: float,
        by_drafter: bool = False,
        prior_rounds: float = 1.0,
    ) -> None:
        self.capacity = capacity
        self.discount = discount
        self.z = z
        # the centring's groups: the pair's class, or its class and drafter
        self.group_by = 2 if by_drafter else 1
        self.prior_rounds = prior_rounds
        p = capacity
        # per bucket: each pair's column (-1: none), and each column's pair
        self.column = np.full((num_buckets, max_classes, max_drafters, MAX_K + 1), -1, np.int32)
        self.pair = np.full((num_buckets, p, 3), -1, dtype=np.int64)
        self.nn = np.zeros((num_buckets, p, p))
        self.nx = np.zeros((num_buckets, p, num_features))
        self.ny = np.zeros((num_buckets, p))
        self.dev = np.zeros((num_buckets, p))
        self.steps = np.zeros((num_buckets, p))
        # the statistics are stored divided by ``weight``, the discount accumulated since
        # they were last rescaled: a step then touches only its own pairs' entries
        self.weight = np.ones(num_buckets)

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything learned, by its key in a policy's state: the live arrays. Each
        pair's column is not among them: :meth:`reindex` rebuilds it from ``pair``."""
        return {
            "cost_pair": self.pair,
            "cost_pair_nn": self.nn,
            "cost_pair_nx": self.nx,
            "cost_pair_ny": self.ny,
            "cost_pair_steps": self.steps,
            "cost_pair_dev": self.dev,
            "cost_pair_weight": self.weight,
        }

    def empty_state(self) -> dict[str, np.ndarray]:
        """:meth:`state_arrays` as a new model holds them: nothing learned."""
        out = {key: np.zeros_like(value) for key, value in self.state_arrays().items()}
        out["cost_pair"] = np.full_like(self.pair, -1)
        out["cost_pair_weight"] = np.ones_like(self.weight)
        return out

    def reindex(self) -> None:
        """Each pair's column from :attr:`pair`, after a state was loaded into it."""
        self.column.fill(-1)
        b, i = np.nonzero(self.pair[:, :, 0] >= 0)
        c, d, k = self.pair[b, i].T
        self.column[b, c, d, k] = i

    def check_pairs(self, pair: np.ndarray) -> None:
        """ValueError unless ``pair`` (a state's ``cost_pair``) names class slots, drafter
        slots and K this model has, each pair at most once per bucket."""
        used = pair[:, :, 0] >= 0
        c, d, k = pair[used].T
        _, classes, drafters, ks = self.column.shape
        if (pair[~used] != -1).any() or (
            (c >= classes) | (d < 0) | (d >= drafters) | (k < 1) | (k >= ks)
        ).any():
            raise ValueError("specctl state: 'cost_pair' names a slot or K out of range")
        b = np.nonzero(used)[0]
        keys = np.stack([b, c, d, k], axis=1)
        if np.unique(keys, axis=0).shape[0] != keys.shape[0]:
            raise ValueError("specctl state: 'cost_pair' names a pair twice in a bucket")

    def index(self, bucket: int, class_slot: int, drafter_slot: int, k: int) -> int:
        """The pair's column in the bucket, assigned on its first step. Once the bucket
        is full, a new pair takes the column of the pair with the least evidence left
        (-1 while every column is new in this report: the pair's requests go unpriced)."""
        i = int(self.column[bucket, class_slot, drafter_slot, k])
        if i >= 0:
            return i
        free = np.flatnonzero(self.pair[bucket, :, 0] < 0)
        if free.size:
            i = int(free[0])
        else:
            # a column assigned in this report has no steps yet: it is not evicted
            held = np.diagonal(self.nn[bucket])
            if not (held > 0.0).any():
                return -1
            i = int(np.argmin(np.where(held > 0.0, held, np.inf)))
            self._clear(bucket, i)
        self.column[bucket, class_slot, drafter_slot, k] = i
        self.pair[bucket, i] = (class_slot, drafter_slot, k)
        return i

    def forget_class(self, class_slot: int) -> None:
        """Drop a class's pairs in every bucket: its slot may go to another class."""
        for b, i in zip(*np.nonzero(self.pair[:, :, 0] == class_slot), strict=True):
            self._clear(int(b), int(i))

    def _clear(self, bucket: int, i: int) -> None:
        c, d, k = self.pair[bucket, i]
        if c >= 0:
            self.column[bucket, c, d, k] = -1
        self.pair[bucket, i] = -1
        self.nn[bucket, i, :] = 0.0
        self.nn[bucket, :, i] = 0.0
        self.nx[bucket, i] = 0.0
        self.ny[bucket, i] = 0.0
        self.dev[bucket, i] = 0.0
        self.steps[bucket, i] = 0.0

    def add(self, bucket: int, x: np.ndarray, y: float, n: np.ndarray, weight: float) -> None:
        """One step of the bucket: its cost features ``x``, time ``y`` and requests per
        pair column ``n``, with the cost model's weight for it."""
        self.weight[bucket] *= self.discount
        if self.weight[bucket] < _RESCALE_BELOW:
            self.scale(bucket, 1.0)
        nz = np.flatnonzero(n)
        if nz.size == 0:
            return
        v = n[nz]
        w = weight / self.weight[bucket]
        self.nn[bucket][np.ix_(nz, nz)] += w * np.outer(v, v)
        self.nx[bucket][nz] += w * np.outer(v, x)
        self.ny[bucket][nz] += w * y * v
        self.steps[bucket][nz] += w

    def scale(self, bucket: int, keep: float) -> None:
        """Keep this share of the bucket's evidence (the cost model detected a change),
        stored at weight 1."""
        keep *= float(self.weight[bucket])
        self.nn[bucket] *= keep
        self.nx[bucket] *= keep
        self.ny[bucket] *= keep
        self.steps[bucket] *= keep
        self.weight[bucket] = 1.0

    def refresh(self, bucket: int, fit: np.ndarray, noise_var: float, request_s: float) -> None:
        """The deviations at the cost model's current ``fit``: prior mean 0 and standard
        deviation ``prior_rounds`` times ``request_s`` (a request's share of a plain
        step), counted beyond ``z`` posterior standard deviations."""
        self.dev[bucket] = 0.0
        cols = np.flatnonzero(np.diagonal(self.nn[bucket]) > 0.0)
        if cols.size == 0:
            return
        w = float(self.weight[bucket])
        resid = w * (self.ny[bucket][cols] - self.nx[bucket][cols] @ fit)
        prior_var = (self.prior_rounds * request_s) ** 2
        precision = w * self.nn[bucket][np.ix_(cols, cols)] / noise_var
        precision[np.diag_indices_from(precision)] += 1.0 / prior_var
        cov = np.linalg.inv(precision)
        mean = cov @ (resid / noise_var)
        # per class (or class and drafter), the deviations' mean over the steps that ran
        # its pairs is 0: the level is the cost model's, learned on its own memory.
        # Centring is linear (mean <- C mean), and the threshold reads the centred
        # deviations' own spread (C cov C^T): a class's level, which the pairs alone may
        # not tell, is not in it.
        _, group = np.unique(self.pair[bucket, cols, : self.group_by], axis=0, return_inverse=True)
        group = group.reshape(-1)
        same = group[:, None] == group[None, :]
        steps = self.steps[bucket][cols]
        share = same * steps[None, :] / (same * steps[None, :]).sum(axis=1, keepdims=True)
        centre = np.eye(cols.size) - share
        mean = centre @ mean
        sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", centre, cov, centre), 0.0))
        self.dev[bucket][cols] = np.sign(mean) * np.maximum(np.abs(mean) - self.z * sd, 0.0)

    def deviations(
        self, bucket: int, class_slot: int, drafter_slot: np.ndarray, k: np.ndarray
    ) -> np.ndarray:
        """Per arm (its drafter slot and K), seconds per request of the class beyond the
        cost model's price. A read."""
        i = self.column[bucket, class_slot, drafter_slot, k]
        return np.where(i >= 0, self.dev[bucket, np.maximum(i, 0)], 0.0)
