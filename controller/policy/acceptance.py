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

Non-stationarity: long memory, and detection of change. Two sets of counts
are kept per (class, drafter). The *long* counts, which the posterior reads,
are multiplied by ``discount ** n`` before a report's rows are added (n: the
report's steps that carried the class) and capped at ``max_rounds`` request-
rounds at position 1, all positions scaled together. The *recent* counts do
the same with ``recent_discount`` and ``recent_max_rounds``: a window of the
last hundred or so steps. After every update the two are compared position
by position; where a position's recent rate differs from its long rate by at
least ``change_min_shift`` and by ``change_z`` standard errors, the
acceptance of that class has changed: the long counts of the drafter that
showed it are replaced by its recent ones, and the class's other drafters
keep at most a few rounds of their recent evidence (a workload that changed
under one drafter changed under all of them; a drafter the class ran too
little to show the change is explored again). So a steady class accumulates
thousands of rounds and gets a steady, confident decision (a short memory
keeps the posterior wide, and Thompson sampling then flips between arms on
noise), while a drafter whose acceptance halves is re-learnt from the recent
window within tens of steps, instead of after the long memory decays. The
caps remain because rounds of one step, and successive rounds of one
request, are correlated: the long cap bounds how certain a busy class can
become, the recent cap keeps the window short in steps.

The fleet's evidence. Replicas that share what they learn
(:mod:`specctl.policy.shared`) hand this model the sum of the others' long
counts, which it keeps apart from its own (:meth:`AcceptanceModel.set_shared`):
only its own counts are decayed by its steps, capped, compared for change
and shared in turn, so nothing is counted twice and nothing is decayed
twice, and a member that leaves the fleet leaves the sum. The posterior reads
its own counts plus a weighted share of the fleet's
(:meth:`AcceptanceModel.weigh_shared`).
"""

from __future__ import annotations

import numpy as np

from specctl.arms import MAX_K

# observations of a position in the recent window before a change there can be declared
MIN_RECENT_OBSERVATIONS = 20.0
# rounds a class's other drafters keep after a change is detected under one of them
_STALE_ROUNDS = 20.0


# per (class, drafter, K): rounds, accepted drafts, their squares, drafts proposed
ARM_STATS = 4


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
        fleet_max_rounds: float | None = None,
        recent_discount: float | None = None,
        recent_max_rounds: float = 500.0,
        change_z: float = 5.0,
        change_min_shift: float = 0.1,
    ) -> None:
        self.discount = discount
        self.prior_success = prior_mean * prior_strength
        self.prior_failure = (1.0 - prior_mean) * prior_strength
        self.max_rounds = max_rounds
        # the cap on this replica's and the fleet's rounds together, never below its own
        # (see weigh_shared)
        self.fleet_max_rounds = max(fleet_max_rounds or 0.0, max_rounds)
        # without a recent window (None), there is one memory and no change detection
        self.recent_discount = recent_discount
        self.recent_max_rounds = min(recent_max_rounds, max_rounds)
        self.change_z = change_z
        self.change_min_shift = change_min_shift
        # [..., 0, j]: successes at position j + 1; [..., 1, j]: failures there
        self.counts = np.zeros((num_classes, num_drafters, 2, MAX_K))
        self.recent = np.zeros_like(self.counts)
        # per class: times a change in acceptance was detected (any drafter)
        self.changes = np.zeros(num_classes, dtype=np.int64)
        # per (class, drafter, K): rounds run at that K, their accepted drafts and squares,
        # and the drafts proposed; the arm's own measurement, which corrects the censored
        # model where it is wrong, and tells a drafter that proposes fewer than K (an
        # n-gram lookup that finds no match proposes nothing) from one that always drafts K
        self.arm_stats = np.zeros((num_classes, num_drafters, ARM_STATS, MAX_K + 1))
        # all request-rounds of the class, speculative or not (for cold start)
        self.rounds = np.zeros(num_classes)
        # the fleet's evidence by this model's slots (set_shared), never added into the
        # arrays above, and the weight each (class, drafter) block of it gets now
        self.shared_counts = np.zeros_like(self.counts)
        self.shared_arm_stats = np.zeros_like(self.arm_stats)
        self.shared_rounds = np.zeros(num_classes)
        self.shared_weight = np.zeros((num_classes, num_drafters))
        # per class: 1 unless a block of it sets the fleet's evidence aside (cold start)
        self.shared_class_weight = np.zeros(num_classes)
        self.has_shared = False

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything learned, by its key in a policy's state: the live arrays, not copies."""
        return {
            "acceptance_counts": self.counts,
            "acceptance_rounds": self.rounds,
            "acceptance_recent": self.recent,
            "acceptance_arm_stats": self.arm_stats,
            "acceptance_changes": self.changes,
        }

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
        drafted: np.ndarray | None = None,
    ) -> None:
        """Add one report's request rows (``drafted``: the drafts each row proposed;
        None: its arm's K).

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
        self.arm_stats[class_slots] *= decay[:, None, None, None]
        self.rounds[class_slots] = self.rounds[class_slots] * decay + rows
        if self.recent_discount is not None:
            if num_steps == 1:
                recent_decay = np.where(rows > 0, self.recent_discount, 1.0)
            else:
                recent_decay = self.recent_discount ** present.sum(axis=0, dtype=np.float64)
            self.recent[class_slots] *= recent_decay[:, None, None, None]

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
        self._add_arm_stats(
            class_slots,
            drafter_slots,
            class_index,
            drafter_index,
            arm_k,
            accepted,
            arm_k if drafted is None else np.minimum(drafted, arm_k),
        )
        long = _add_capped(self.counts, cs, ds, new, width, self.max_rounds)
        if self.recent_discount is None:
            return
        recent = _add_capped(self.recent, cs, ds, new, width, self.recent_max_rounds)
        changed = self._changed(long, recent)
        if changed.any():
            # a class whose acceptance moved under one drafter moved under every drafter
            # (its workload changed): what the others' long counts hold is stale as well
            for c_idx in np.flatnonzero(changed.any(axis=1)):
                c = int(class_slots[c_idx])
                moved = drafter_slots[tracked][changed[c_idx]]
                others = np.setdiff1d(np.arange(self.counts.shape[1]), moved)
                self.counts[c, moved] = self.recent[c, moved]
                # the drafters the class ran too little to see the change keep a few rounds
                # of their recent evidence: wide enough to be explored again
                for counts in (self.counts, self.recent):
                    block = counts[c, others]
                    observed = block[:, 0, 0] + block[:, 1, 0]
                    scale = _STALE_ROUNDS / np.maximum(observed, _STALE_ROUNDS)
                    counts[c, others] = self.recent[c, others] * scale[:, None, None]
                stats = self.arm_stats[c]
                stats *= np.minimum(1.0, _STALE_ROUNDS / np.maximum(stats[:, :1], 1e-12))
                self.changes[c] += 1

    def _add_arm_stats(
        self,
        class_slots: np.ndarray,
        drafter_slots: np.ndarray,
        class_index: np.ndarray,
        drafter_index: np.ndarray,
        arm_k: np.ndarray,
        accepted: np.ndarray,
        drafted: np.ndarray,
    ) -> None:
        row_drafter = drafter_slots[drafter_index]
        spec = (row_drafter >= 0) & (arm_k > 0)
        if not spec.any():
            return
        nd, kw = self.arm_stats.shape[1], MAX_K + 1
        c = class_slots[class_index[spec]]
        key = (c * nd + row_drafter[spec]) * kw + arm_k[spec]
        a = accepted[spec].astype(np.float64)
        touched, inverse = np.unique(key, return_inverse=True)
        m = touched.shape[0]
        cls, rest = np.divmod(touched, nd * kw)
        d, k = np.divmod(rest, kw)
        cell = self.arm_stats[cls, d, :, k]  # (m, ARM_STATS)
        cell[:, 0] += np.bincount(inverse, minlength=m)
        cell[:, 1] += np.bincount(inverse, weights=a, minlength=m)
        cell[:, 2] += np.bincount(inverse, weights=a * a, minlength=m)
        cell[:, 3] += np.bincount(inverse, weights=drafted[spec].astype(np.float64), minlength=m)
        cell *= (self.max_rounds / np.maximum(cell[:, 0], self.max_rounds))[:, None]
        self.arm_stats[cls, d, :, k] = cell

    def arm_posterior(
        self, class_slot: int | None, drafter_slots: np.ndarray, max_k: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (drafter, K = 1..max_k): rounds run at K, and their mean accepted drafts and
        its variance per round (zeros without rounds)."""
        shape = (drafter_slots.shape[0], max_k)
        if class_slot is None:
            return np.zeros(shape), np.zeros(shape), np.zeros(shape)
        stats = self.arm_stats[class_slot, drafter_slots][:, :, 1 : max_k + 1]
        if self.has_shared:
            weight = self.shared_weight[class_slot, drafter_slots][:, None, None]
            shared = self.shared_arm_stats[class_slot, drafter_slots][:, :, 1 : max_k + 1]
            stats = stats + weight * shared
        n = stats[:, 0]
        safe = np.maximum(n, 1e-12)
        mean = stats[:, 1] / safe
        var = np.maximum(stats[:, 2] / safe - mean * mean, 0.0)
        return n, mean, var

    def drafted_share(
        self, class_slot: int | None, drafter_slots: np.ndarray, max_k: int, prior_rounds: float
    ) -> np.ndarray:
        """Per (drafter, K = 1..max_k): the share of its K drafts a round of the class
        proposes: 1 for a drafter that always drafts K (a model), the class's match rate
        for an n-gram lookup. A read.

        Each K is read from its own rounds with ``prior_rounds`` rounds at the class's
        share over all of the drafter's K (all K proposed where the class has not run
        the drafter). Whether a lookup finds a match depends on the context, not on
        the K asked of it, so a K the class has barely run is charged what the class's
        matches propose at its other K: charged in full instead, a K next to the one a
        class runs looks dearer than both its neighbours, and Thompson sampling, which
        ranks it behind them, never runs it to find out.
        """
        shape = (drafter_slots.shape[0], max_k)
        if class_slot is None:
            return np.ones(shape)
        stats = self.arm_stats[class_slot, drafter_slots][:, :, 1 : max_k + 1]
        if self.has_shared:
            weight = self.shared_weight[class_slot, drafter_slots][:, None, None]
            shared = self.shared_arm_stats[class_slot, drafter_slots][:, :, 1 : max_k + 1]
            stats = stats + weight * shared
        k = np.arange(1, max_k + 1, dtype=np.float64)
        # rounds' worth of drafts proposed, and rounds, per (drafter, K)
        proposed, rounds = stats[:, 3] / k, stats[:, 0]
        pooled = (proposed.sum(axis=1) + prior_rounds) / (rounds.sum(axis=1) + prior_rounds)
        share = (proposed + prior_rounds * pooled[:, None]) / (rounds + prior_rounds)
        return np.clip(share, 0.0, 1.0)

    def _changed(self, long: np.ndarray, recent: np.ndarray) -> np.ndarray:
        """Per (class, drafter) block: has a position's recent rate moved from its long rate?

        Both blocks are (classes, drafters, 2, positions) after the update. A
        position needs a few recent observations to be judged; the standard
        error is that of the difference of two binomial rates (the long counts
        include the recent ones, which makes the test conservative).
        """
        a0, b0 = self.prior_success, self.prior_failure
        n_r = recent[..., 0, :] + recent[..., 1, :]
        n_l = long[..., 0, :] + long[..., 1, :]
        p_r = (recent[..., 0, :] + a0) / (n_r + a0 + b0)
        p_l = (long[..., 0, :] + a0) / (n_l + a0 + b0)
        p = np.clip(0.5 * (p_r + p_l), 0.02, 0.98)
        se = np.sqrt(p * (1.0 - p) * (1.0 / (n_r + a0 + b0) + 1.0 / (n_l + a0 + b0)))
        shift = np.abs(p_r - p_l)
        moved = (shift >= self.change_min_shift) & (shift >= self.change_z * se)
        moved &= n_r >= MIN_RECENT_OBSERVATIONS
        return np.asarray(moved.any(axis=-1))

    # -- the fleet's evidence -------------------------------------------------

    def set_shared(self, counts: np.ndarray, arm_stats: np.ndarray, rounds: np.ndarray) -> None:
        """Replace the fleet's evidence: arrays shaped like :attr:`counts`,
        :attr:`arm_stats` and :attr:`rounds`, by this model's slots (zeros where the
        fleet has none), summed over the other replicas."""
        self.shared_counts[...] = counts
        self.shared_arm_stats[...] = arm_stats
        self.shared_rounds[...] = rounds
        self.has_shared = bool(rounds.any() or counts.any() or arm_stats.any())
        self.weigh_shared(np.arange(self.counts.shape[0]))

    def weigh_shared(self, class_slots: np.ndarray) -> None:
        """How much of the fleet's evidence each (class, drafter) block of ``class_slots``
        takes into its posterior, after the fleet's evidence or this replica's changed.

        The fleet's counts fill in what this replica has not seen, up to the
        ``fleet_max_rounds`` cap (never below the ``max_rounds`` its own long counts
        have). Rounds of one step and of one request are correlated, a hundred
        replicas' no less than one's, so a cap bounds how certain a class can become
        however many replicas run it; but at one replica's cap a fleet holds no
        more than one replica would, and each replica keeps exploring as one
        replica does, on a sixteenth of the traffic. The default holds sixteen
        replicas' own memories (docs/fleet.md, "A fleet cap above one replica's
        memory").
        A new replica then decides on the fleet's evidence and a busy one on its
        own. And where the fleet's rate at a position differs from this replica's
        recent window by the change test's margin (``change_min_shift`` and
        ``change_z`` standard errors), the block takes none of it: the workload
        changed here first (or differs here), and the fleet's older evidence must
        not outvote what this replica sees now, nor hide the change from its
        detection. The block takes the fleet's evidence again once the two agree,
        as the other members detect the change and their contributions follow.
        """
        if not self.has_shared:
            self.shared_weight[class_slots] = 0.0
            self.shared_class_weight[class_slots] = 0.0
            return
        shared = self.shared_counts[class_slots]
        n_shared = shared[..., 0, 0] + shared[..., 1, 0]
        own = self.counts[class_slots]
        room = self.fleet_max_rounds - (own[..., 0, 0] + own[..., 1, 0])
        weight = np.clip(room / np.maximum(n_shared, 1e-12), 0.0, 1.0)
        weight[n_shared <= 0.0] = 0.0
        disagree = np.zeros(weight.shape, dtype=bool)
        if self.recent_discount is not None:
            disagree = self._changed(shared, self.recent[class_slots])
            weight[disagree] = 0.0
        self.shared_weight[class_slots] = weight
        has_rounds = self.shared_rounds[class_slots] > 0.0
        self.shared_class_weight[class_slots] = np.where(
            disagree.any(axis=1) | ~has_rounds, 0.0, 1.0
        )

    def total_rounds(self, class_slot: int) -> float:
        """The class's request-rounds, its own and the share of the fleet's it merges."""
        shared = self.shared_rounds[class_slot] * self.shared_class_weight[class_slot]
        return float(self.rounds[class_slot] + shared)

    def posterior(
        self, class_slot: int | None, drafter_slots: np.ndarray, max_k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Beta parameters (alpha, beta), shape (len(drafter_slots), max_k)."""
        if class_slot is None:
            shape = (drafter_slots.shape[0], max_k)
            return np.full(shape, self.prior_success), np.full(shape, self.prior_failure)
        c = self.counts[class_slot, drafter_slots, :, :max_k]
        if self.has_shared:
            weight = self.shared_weight[class_slot, drafter_slots][:, None, None]
            c = c + weight * self.shared_counts[class_slot, drafter_slots, :, :max_k]
        return c[:, 0] + self.prior_success, c[:, 1] + self.prior_failure

    def reset(self, class_slot: int) -> None:
        """Forget the class: its own evidence, and the fleet's until the next merge."""
        self.counts[class_slot] = 0.0
        self.recent[class_slot] = 0.0
        self.arm_stats[class_slot] = 0.0
        self.rounds[class_slot] = 0.0
        self.changes[class_slot] = 0
        self.shared_counts[class_slot] = 0.0
        self.shared_arm_stats[class_slot] = 0.0
        self.shared_rounds[class_slot] = 0.0
        self.shared_weight[class_slot] = 0.0
        self.shared_class_weight[class_slot] = 0.0


def _add_capped(
    counts: np.ndarray,
    cs: np.ndarray,
    ds: np.ndarray,
    new: np.ndarray,
    width: int,
    cap: float,
) -> np.ndarray:
    """Add ``new`` to ``counts[cs, ds]`` and scale each block down to ``cap`` rounds at
    position 1; returns the updated observed block (positions ``1..width - 1``)."""
    block = counts[cs, ds, :, : width - 1] + new
    observed = block[..., 0, 0] + block[..., 1, 0]
    scale = cap / np.maximum(observed, cap)
    block *= scale[..., None, None]
    counts[cs, ds, :, : width - 1] = block
    if (scale < 1.0).any():
        counts[cs, ds, :, width - 1 :] *= scale[..., None, None]
    return block


def expected_tokens(conditional: np.ndarray) -> np.ndarray:
    """Committed tokens per round for K = 1..n from conditional rates along the last axis."""
    return 1.0 + np.cumsum(np.cumprod(conditional, axis=-1), axis=-1)
