"""Per-position acceptance of each drafter in each workload class, censored and discounted.

A request-round that ran arm ``(d, K)`` and accepted ``a`` drafts observed
positions ``1..min(a + 1, K)``: positions ``1..a`` were accepted, and position
``a + 1`` (when ``a < K``) was not, either because the target rejected it or
because the drafter proposed fewer than K tokens, which costs goodput in the
same way. Positions beyond K were never tried: they are censored, not
failures. So a K=5 round that accepted 2 tells about K=1..4 too, and evidence
is shared across K instead of spread over unrelated (drafter, K) arms.

Each position's conditional acceptance rate has a Beta posterior:
``Beta(prior_mean * prior_strength + successes, (1 - prior_mean) *
prior_strength + failures)``. The expected committed tokens of a round at K
are ``1 + sum_{j<=K} prod_{i<=j} r_i``, which never decreases with K.

Non-stationarity: before a report's rows are added, a class's counts are
multiplied by ``discount ** n``, n being the number of steps in the report
that carried the class, so old evidence loses half its weight every
``ln 2 / -ln(discount)`` of the class's steps (69 steps at 0.99). The counts
of a (class, drafter) are also capped at ``max_rounds`` request-rounds at
position 1, all positions scaled down together: rounds in one step, and
successive rounds of one request, are correlated, and the cap stops a busy
class from becoming so certain that it stops exploring. It also makes a busy
class forget in proportion to its traffic, and deep positions as fast as
position 1: discounting alone leaves a deep position's old rate in place
until new rounds reach it, which after a drop in acceptance few do. The cap
only ever speeds up forgetting.
"""

from __future__ import annotations

import numpy as np

from controller.arms import MAX_K


class AcceptanceModel:
    """Discounted counts per (class slot, drafter slot, success/failure, position)."""

    def __init__(
        self,
        num_classes: int,
        num_drafters: int,
        *,
        discount: float,
        prior_mean: float,
        prior_strength: float,
        max_rounds: float,
    ) -> None:
        self.discount = discount
        self.prior_success = prior_mean * prior_strength
        self.prior_failure = (1.0 - prior_mean) * prior_strength
        self.max_rounds = max_rounds
        # [..., 0, j]: successes at position j + 1; [..., 1, j]: failures there
        self.counts = np.zeros((num_classes, num_drafters, 2, MAX_K))
        # all request-rounds of the class, speculative or not (for cold start)
        self.rounds = np.zeros(num_classes)

    @property
    def success(self) -> np.ndarray:
        return self.counts[:, :, 0, :]

    @property
    def failure(self) -> np.ndarray:
        return self.counts[:, :, 1, :]

    def update(
        self,
        class_slots: np.ndarray,
        drafter_slots: np.ndarray,
        class_index: np.ndarray,
        drafter_index: np.ndarray,
        arm_k: np.ndarray,
        accepted: np.ndarray,
        request_step: np.ndarray,
    ) -> None:
        """Add one report's request rows.

        Rows name their class and drafter by index into the report's small
        tables ``class_slots`` and ``drafter_slots`` (the model's slots);
        a drafter slot of -1 (``off``, or a drafter not tracked) observes no
        position, but its rows still count as rounds of their class.
        """
        nc = class_slots.shape[0]
        nd = drafter_slots.shape[0]
        if class_index.shape[0] == 0 or nc == 0:
            return
        rows = np.bincount(class_index, minlength=nc)
        num_steps = int(request_step[-1]) + 1
        if num_steps == 1:
            decay = np.where(rows > 0, self.discount, 1.0)
        else:
            # once per step that carried the class
            present = np.zeros((num_steps, nc), dtype=bool)
            present[request_step, class_index] = True
            decay = self.discount ** present.sum(axis=0, dtype=np.float64)
        self.counts[class_slots] *= decay[:, None, None, None]
        self.rounds[class_slots] = self.rounds[class_slots] * decay + rows

        tracked = np.flatnonzero(drafter_slots >= 0)
        if tracked.shape[0] == 0:
            return
        width = int(arm_k.max()) + 1
        if width == 1:
            return
        stopped = accepted < arm_k
        key = ((class_index * nd + drafter_index) * 2 + stopped) * width + accepted
        # hist[c, d, s, x]: rounds of (c, d) that accepted exactly x, s = stopped before K
        hist = np.bincount(key, minlength=nc * nd * 2 * width).reshape(nc, nd, 2, width)
        hist = hist[:, tracked]
        new = np.empty((nc, tracked.shape[0], 2, width - 1))
        # successes at position j (1-based): rounds that accepted >= j
        new[:, :, 0] = np.cumsum(hist.sum(axis=2)[..., ::-1], axis=-1)[..., -2::-1]
        # a failure at position x + 1 for a round that accepted x and stopped before its K;
        # positions beyond a round's K are censored: no count at all
        new[:, :, 1] = hist[:, :, 1, : width - 1]
        cs = class_slots[:, None]
        ds = drafter_slots[tracked][None, :]
        block = self.counts[cs, ds, :, : width - 1] + new
        observed = block[..., 0, 0] + block[..., 1, 0]
        scale = self.max_rounds / np.maximum(observed, self.max_rounds)
        self.counts[cs, ds, :, : width - 1] = block * scale[..., None, None]
        if (scale < 1.0).any():
            self.counts[cs, ds, :, width - 1 :] *= scale[..., None, None]

    def posterior(
        self, class_slot: int | None, drafter_slots: np.ndarray, max_k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Beta parameters (alpha, beta), shape (len(drafter_slots), max_k)."""
        if class_slot is None:
            shape = (drafter_slots.shape[0], max_k)
            return np.full(shape, self.prior_success), np.full(shape, self.prior_failure)
        c = self.counts[class_slot, drafter_slots, :, :max_k]
        return c[:, 0] + self.prior_success, c[:, 1] + self.prior_failure

    def reset(self, class_slot: int) -> None:
        self.counts[class_slot] = 0.0
        self.rounds[class_slot] = 0.0


def expected_tokens(conditional: np.ndarray) -> np.ndarray:
    """Committed tokens per round for K = 1..n from conditional rates along the last axis."""
    return 1.0 + np.cumsum(np.cumprod(conditional, axis=-1), axis=-1)
