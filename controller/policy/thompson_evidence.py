"""The evidence specctl's policy keeps and updates, per workload class and load bucket.

The policy (:mod:`specctl.policy.thompson`) decides from posterior draws; what
those draws rest on is kept here, apart from how they are drawn: the
acceptance model per class and drafter (:mod:`specctl.policy.acceptance`), the
cost model and the typical load per bucket (:mod:`specctl.policy.cost`,
:mod:`specctl.policy.load`), the slots classes and drafters hold in those
models' arrays, and each bucket's class mix, which tells the classes that
share its batches (decided together) from those that take turns in it.
Learning from a report (:meth:`ThompsonEvidence.update`) changes only this;
:mod:`specctl.policy.thompson_state` saves and restores it.

Replicas that share what they learn exchange the part of it that is a sum of
decayed statistics, named rather than slotted (:mod:`specctl.policy.shared`):
:meth:`ThompsonEvidence.contribution` is this replica's own, and
:meth:`ThompsonEvidence.merge_shared` hands the models the sum of the
others', which each keeps apart from its own and weighs into its posterior
(:mod:`specctl.policy.acceptance`, :mod:`specctl.policy.cost`). The class
mix stays local: which classes share this replica's batches is its own
traffic's business.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specctl.arms import Arm, parse_arm
from specctl.policy.acceptance import AcceptanceModel
from specctl.policy.cost import BASE_FEATURES, FEATURES_PER_DRAFTER, CostModel, num_features
from specctl.policy.load import BucketLoad
from specctl.policy.shared import (
    FeatureKey,
    MergeReport,
    SharedAcceptance,
    SharedCost,
    SharedEvidence,
)
from specctl.steps import StepBatch

# memory of a load bucket's class mix, per step in the bucket (about 100 steps)
_MIX_DISCOUNT = 0.99
# an arm's or a class's own step-cost column: its prior lets a batch that runs the arm (or
# is the class) move a step by a quarter of what the other terms' priors let them (see cost)
_K_COLUMN_TYPICAL = 4.0
# classes with at least this share of a bucket's requests are decided together
_MIN_MIX_SHARE = 0.02
# ... if they share batches: other classes hold at least this share of the requests in the
# steps the class runs in (classes that take turns in a bucket share none)
_MIN_SHARED_SHARE = 0.05
MAX_JOINT_CLASSES = 16
# refits of a bucket whose shared statistics moved, at most (see _refit)
_REFIT_ITERATIONS = 50


@dataclass(frozen=True)
class EvidenceUpdate:
    """What one report changed in the evidence."""

    # the slot of each of the report's classes (empty for a report without rows)
    class_slots: np.ndarray
    # each step's load bucket
    buckets: np.ndarray
    # classes evicted for the report's new ones, with the slots they held
    evicted: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class SharedUpdate:
    """What merging the fleet's evidence changed, and what it could not place."""

    # class slots and load buckets whose merged evidence moved
    class_slots: np.ndarray
    buckets: np.ndarray
    # classes known only from the fleet that it no longer has, with the slots they held
    forgotten: tuple[tuple[str, int], ...]
    left_out: MergeReport


class ThompsonEvidence:
    """Acceptance per class, cost and load per bucket, class and drafter slots, class mix."""

    def __init__(
        self,
        acceptance: AcceptanceModel,
        cost: CostModel,
        load: BucketLoad,
        max_classes: int,
        max_drafters: int,
    ) -> None:
        self.acceptance = acceptance
        self.cost = cost
        self.load = load
        self.num_buckets = load.num_buckets
        self.max_classes = max_classes
        self.max_drafters = max_drafters
        # classes -> slots in the acceptance arrays; least recently updated is evicted
        self.class_slot: dict[str, int] = {}
        self.slot_class: list[str | None] = [None] * max_classes
        # when each class slot was last updated, on a clock that counts updates
        self.last_update = np.zeros(max_classes, dtype=np.int64)
        self.clock = 0
        self.drafter_slot: dict[str, int] = {}
        self.classes_evicted = 0
        self.rows_untracked = 0
        # per load bucket: discounted request-rounds per class slot, and steps
        self.mix = np.zeros((self.num_buckets, max_classes))
        # per load bucket: discounted committed tokens per class slot (the work each brings)
        self.mix_tokens = np.zeros((self.num_buckets, max_classes))
        # per bucket and class: the requests of every class in the steps the class ran in
        self.mix_present = np.zeros((self.num_buckets, max_classes))
        self.mix_steps = np.zeros(self.num_buckets)
        self.bucket_steps = np.zeros(self.num_buckets, dtype=np.int64)
        # per bucket, mix_members until the mix changes (asked dozens of times a report)
        self._members: dict[int, np.ndarray] = {}

    # -- slots ----------------------------------------------------------------

    def slot_of_drafter(self, drafter: str) -> int:
        """The drafter's slot, a free one for a new drafter; -1 when none is left."""
        slot = self.drafter_slot.get(drafter)
        if slot is None:
            if len(self.drafter_slot) >= self.max_drafters:
                return -1
            slot = self.drafter_slot[drafter] = len(self.drafter_slot)
        return slot

    def slot_of_class(self, name: str) -> tuple[int, str | None]:
        """The class's slot, and the class evicted to free it for a new class (or None)."""
        slot = self.class_slot.get(name)
        if slot is not None:
            return slot, None
        evicted = None
        if len(self.class_slot) < len(self.slot_class):
            slot = self.slot_class.index(None)
        else:
            slot = int(np.argmin(self.last_update))
            evicted = self.slot_class[slot]
            assert evicted is not None
            self.forget(evicted)
            self.classes_evicted += 1
        self.class_slot[name] = slot
        self.slot_class[slot] = name
        self.last_update[slot] = self._next_stamp()
        return slot, evicted

    def forget(self, name: str) -> int:
        """Drop what was learned for a class; returns the slot it held."""
        slot = self.class_slot.pop(name)
        self.slot_class[slot] = None
        self.acceptance.reset(slot)
        for b in self.cost.forget_class(slot).tolist():
            self.cost.refresh(b, self.typical_features(b))
        self.mix[:, slot] = 0.0
        self.mix_tokens[:, slot] = 0.0
        self.mix_present[:, slot] = 0.0
        self.mix_changed()
        self.last_update[slot] = 0
        return slot

    def _next_stamp(self) -> int:
        self.clock += 1
        return self.clock

    # -- learning -------------------------------------------------------------

    def update(self, batch: StepBatch) -> EvidenceUpdate:
        """Learn acceptance, class mix, load and step cost from one validated report."""
        s = batch.num_steps
        nd = self.max_drafters
        requests: np.ndarray = np.zeros((s, nd))
        draft_tokens: np.ndarray = np.zeros((s, nd))
        step_k: np.ndarray = np.zeros((s, nd))
        second_verified: np.ndarray = np.zeros((s, nd))
        decode_tokens: np.ndarray = np.zeros(s)
        arm_requests: np.ndarray = np.zeros((s, self.cost.num_features - self.cost.arm_start))
        class_slots = np.zeros(0, dtype=np.int64)
        # per speculative row: (step, class slot, drafter slot, K), for the pair columns
        pair_rows: np.ndarray | None = None
        evicted: list[tuple[str, int]] = []
        stamp = self._next_stamp()
        self._mark_batch_drafter(batch)
        if batch.num_rows:
            slots = []
            for c in batch.classes:
                slot, gone = self.slot_of_class(c)
                if gone is not None:
                    evicted.append((gone, slot))
                slots.append(slot)
            class_slots = np.array(slots, dtype=np.int64)
            # the report's drafters, and each arm's index among them (off: its own entry)
            local: dict[str, int] = {"": 0}
            arm_drafter = np.array(
                [local.setdefault(a.drafter, len(local)) for a in batch.arms], dtype=np.int64
            )
            drafter_slots = np.array(
                [-1] + [self.slot_of_drafter(d) for d in list(local)[1:]], dtype=np.int64
            )
            drafter_index = arm_drafter[batch.arm_index]
            self.acceptance.update(
                class_slots,
                drafter_slots,
                batch.class_index,
                drafter_index,
                batch.arm_k,
                batch.accepted,
                batch.request_step,
                batch.drafted,
            )
            if self.acceptance.has_shared:
                self.acceptance.weigh_shared(class_slots)
            self.last_update[class_slots] = stamp
            decode_tokens = np.bincount(
                batch.request_step, weights=batch.drafted + 1.0, minlength=s
            )
            # per (step, drafter slot): requests drafting, and the K they asked of it
            row_slot = drafter_slots[drafter_index]
            spec = row_slot >= 0
            key = batch.request_step[spec] * nd + row_slot[spec]
            requests = np.bincount(key, minlength=s * nd).reshape(s, nd)
            draft_tokens = np.bincount(key, weights=batch.arm_k[spec], minlength=s * nd).reshape(
                s, nd
            )
            second_verified = np.bincount(
                key, weights=(batch.arm_k[spec] >= 2).astype(np.float64), minlength=s * nd
            ).reshape(s, nd)
            # the largest K each drafter ran in each step: it proposed that many for all
            flat_k = np.zeros(s * nd)
            np.maximum.at(flat_k, key, batch.arm_k[spec].astype(np.float64))
            step_k = flat_k.reshape(s, nd)
            self._use_reported_draft_k(step_k, batch)
            # per (step, drafter slot x K): the requests that ran the arm
            kc = self.cost.k_columns
            own = spec & (batch.arm_k <= kc)
            if own.any():
                col = row_slot[own] * kc + batch.arm_k[own].astype(np.int64) - 1
                arm_requests[:, : nd * kc] = (
                    np.bincount(batch.request_step[own] * (nd * kc) + col, minlength=s * nd * kc)
                    .reshape(s, nd * kc)
                    .astype(np.float64)
                )
            # per (step, class slot x drafter slot): the class's requests drafting with it
            row_class = class_slots[batch.class_index]
            mine = spec & (row_class < self.cost.class_columns)
            if mine.any():
                col = nd * kc + row_class[mine] * nd + row_slot[mine]
                width = arm_requests.shape[1]
                arm_requests += np.bincount(
                    batch.request_step[mine] * width + col, minlength=s * width
                ).reshape(s, width)
            if self.cost.pairs is not None and spec.any():
                pair_rows = np.stack(
                    [
                        batch.request_step[spec],
                        row_class[spec],
                        row_slot[spec],
                        batch.arm_k[spec].astype(np.int64),
                    ],
                    axis=1,
                )
            self._update_mix(class_slots[batch.class_index], batch)
            untracked = (row_slot < 0) & (batch.arm_k > 0)
            if untracked.any():
                self.rows_untracked += int(untracked.sum())
        bucket = self.load.update(batch, decode_tokens)
        features = self.cost.step_features(
            decode_tokens,
            np.maximum(batch.num_scheduled_tokens - decode_tokens, 0.0),
            requests,
            draft_tokens,
            step_k,
            batch.batch_size.astype(np.float64),
            second_verified,
            arm_requests,
        )
        self.cost.update(
            bucket, features, batch.step_time_s, self._pair_requests(bucket, pair_rows, s)
        )
        for b in np.unique(bucket).tolist():
            if self.cost.has_shared:
                self._weigh_shared_cost(b)
            self.cost.refresh(b, self.typical_features(b))
        return EvidenceUpdate(class_slots, bucket, tuple(evicted))

    def _pair_requests(
        self, bucket: np.ndarray, pair_rows: np.ndarray | None, num_steps: int
    ) -> np.ndarray | None:
        """Per step, the requests of each pair column of its bucket (see
        :mod:`specctl.policy.pair_cost`), or None without pair columns."""
        pairs = self.cost.pairs
        if pairs is None or pair_rows is None:
            return None
        out = np.zeros((num_steps, pairs.capacity))
        keyed = np.concatenate([bucket[pair_rows[:, 0], None], pair_rows[:, 1:]], axis=1)
        unique, inverse = np.unique(keyed, axis=0, return_inverse=True)
        column = np.array(
            [pairs.index(b, c, d, k) for b, c, d, k in unique.tolist()], dtype=np.int64
        )[inverse.reshape(-1)]
        kept = column >= 0
        np.add.at(out, (pair_rows[kept, 0], column[kept]), 1.0)
        return out

    def _mark_batch_drafter(self, batch: StepBatch) -> None:
        """The drafter the engine runs for the whole batch has batch-wide cost terms from
        its first report on (see :mod:`specctl.policy.cost`)."""
        if batch.batch_drafter:
            slot = self.slot_of_drafter(batch.batch_drafter)
            if slot >= 0:
                self.cost.batch_wide[slot] = True

    def _mark_shared_batch_drafters(self, xtx: np.ndarray) -> None:
        """A drafter the fleet's steps give batch-wide terms runs for the whole batch on
        this pool's engines too (its engines are identical): a replica that has not
        reported yet fits the fleet's cost in the fleet's terms."""
        first = BASE_FEATURES + FEATURES_PER_DRAFTER * np.arange(self.max_drafters)
        filled = xtx[:, first + 2, first + 2].any(axis=0) | xtx[:, first + 3, first + 3].any(axis=0)
        self.cost.batch_wide |= filled

    def _use_reported_draft_k(self, step_k: np.ndarray, batch: StepBatch) -> None:
        """The batch drafter's passes: the K it proposed in the step, where the engine says.

        A step verifies the drafts of the arms chosen the step before, and drafts
        for the next step at the K of the arms chosen now: its time holds this
        step's drafting. Read from the rows' arms, the drafting K is one step
        late, so the cost of a short K is measured with a long K's passes in it
        whenever the K changes between steps.
        """
        draft_k = batch.draft_k
        if draft_k is None or batch.batch_drafter not in self.drafter_slot:
            return
        slot = self.drafter_slot[batch.batch_drafter]
        known = draft_k >= 0
        step_k[known, slot] = draft_k[known]

    def _update_mix(self, row_slots: np.ndarray, batch: StepBatch) -> None:
        """Learn each load bucket's class mix: mean request-rounds per step per class, the
        tokens they committed, and per class the requests of the steps it ran in, which
        tells classes that share batches from classes that take turns in the bucket."""
        nb, nc = self.num_buckets, self.max_classes
        bucket = np.minimum(batch.load_bucket, nb - 1)
        steps = np.bincount(bucket, minlength=nb).astype(np.float64)
        rows = np.bincount(bucket[batch.request_step] * nc + row_slots, minlength=nb * nc)
        tokens = np.bincount(
            bucket[batch.request_step] * nc + row_slots,
            weights=np.minimum(batch.accepted, batch.arm_k) + 1.0,
            minlength=nb * nc,
        )
        step_rows = np.bincount(batch.request_step, minlength=batch.num_steps)
        pairs = np.unique(batch.request_step * nc + row_slots)
        pair_step, pair_slot = np.divmod(pairs, nc)
        present = np.bincount(
            bucket[pair_step] * nc + pair_slot,
            weights=step_rows[pair_step].astype(np.float64),
            minlength=nb * nc,
        )
        decay = _MIX_DISCOUNT**steps
        self.mix *= decay[:, None]
        self.mix += rows.reshape(nb, nc)
        self.mix_tokens *= decay[:, None]
        self.mix_tokens += tokens.reshape(nb, nc)
        self.mix_present *= decay[:, None]
        self.mix_present += present.reshape(nb, nc)
        self.mix_steps = self.mix_steps * decay + steps
        self.bucket_steps += steps.astype(np.int64)
        self.mix_changed()

    def mix_changed(self) -> None:
        """The class mix was written (a report, a class forgotten, a state loaded): what
        was worked out from it is stale."""
        self._members.clear()

    # -- the fleet's evidence -------------------------------------------------

    def contribution(self) -> SharedEvidence:
        """This replica's own evidence, by name (a read: copies, never the fleet's)."""
        drafters = tuple(sorted(self.drafter_slot, key=self.drafter_slot.__getitem__))
        nd = len(drafters)
        acc = self.acceptance
        slots = [s for s, c in enumerate(self.slot_class) if c is not None and acc.rounds[s] > 0]
        counts = acc.counts[slots][:, :nd]
        arm_stats = acc.arm_stats[slots][:, :nd]
        # positions no round of these reached hold nothing: they are left out
        used = np.flatnonzero(counts.any(axis=(0, 1, 2)) | arm_stats[..., 1:].any(axis=(0, 1, 2)))
        k = int(used[-1]) + 1 if used.size else 0
        acceptance = None
        if slots:
            acceptance = SharedAcceptance(
                classes=tuple(str(self.slot_class[s]) for s in slots),
                drafters=drafters,
                counts=np.ascontiguousarray(counts[..., :k]),
                arm_stats=np.ascontiguousarray(arm_stats[..., : k + 1]),
                rounds=acc.rounds[slots].copy(),
            )
        cost = None
        if self.cost.steps.any():
            cols, arm_columns, class_columns = self._shared_cost_columns(drafters)
            cost = SharedCost(
                load_bucket_bounds=self.load.bounds,
                drafters=drafters,
                xtx=np.ascontiguousarray(self.cost.xtx[:, cols[:, None], cols[None, :]]),
                xty=np.ascontiguousarray(self.cost.xty[:, cols]),
                yy=self.cost.yy.copy(),
                steps=self.cost.steps.copy(),
                load_steps=self.load.steps.copy(),
                load_batch_sum=self.load.batch_sum.copy(),
                load_extra_tokens_sum=self.load.extra_tokens_sum.copy(),
                arm_columns=arm_columns,
                class_columns=class_columns,
            )
        return SharedEvidence(acceptance, cost)

    def _shared_cost_columns(
        self, drafters: tuple[str, ...]
    ) -> tuple[np.ndarray, tuple[str, ...], tuple[tuple[str, str], ...]]:
        """The cost model's columns this replica shares, and the names of those past the
        line's: an arm's or a class's own column where a step has filled it."""
        cost = self.cost
        filled = np.asarray(np.diagonal(cost.xtx, axis1=1, axis2=2).any(axis=0))
        cols = list(range(num_features(len(drafters))))
        arm_columns: list[str] = []
        for slot, drafter in enumerate(drafters):
            for k in range(1, cost.k_columns + 1):
                col = cost.arm_start + cost.k_columns * slot + k - 1
                if filled[col]:
                    cols.append(col)
                    arm_columns.append(str(Arm(drafter, k)))
        class_columns: list[tuple[str, str]] = []
        for class_slot in range(min(cost.class_columns, len(self.slot_class))):
            name = self.slot_class[class_slot]
            if name is None:
                continue
            for slot, drafter in enumerate(drafters):
                col = cost.class_start + cost.num_drafters * class_slot + slot
                if filled[col]:
                    cols.append(col)
                    class_columns.append((name, drafter))
        return np.array(cols, dtype=np.int64), tuple(arm_columns), tuple(class_columns)

    def merge_shared(self, shared: SharedEvidence | None) -> SharedUpdate:
        """Replace the fleet's evidence in the models with ``shared`` (None: none).

        The fleet's classes take free class slots only, never evicting one of
        this replica's (a slot held only for the fleet goes first when this
        replica needs one); its drafters take free drafter slots.
        """
        acc = self.acceptance
        before = (
            acc.shared_counts.copy(),
            acc.shared_arm_stats.copy(),
            acc.shared_weight.copy(),
            acc.shared_class_weight.copy(),
        )
        merged, no_class, no_drafter = self._merge_acceptance(
            shared.acceptance if shared is not None else None
        )
        forgotten = self._forget_shared_only(merged)
        part = shared.cost if shared is not None else None
        bounds_differ = part is not None and part.load_bucket_bounds != self.load.bounds
        buckets, cost_no_drafter = self._merge_cost(None if bounds_differ else part)
        moved = (
            (acc.shared_counts != before[0]).any(axis=(1, 2, 3))
            | (acc.shared_arm_stats != before[1]).any(axis=(1, 2, 3))
            | (acc.shared_weight != before[2]).any(axis=1)
            | (acc.shared_class_weight != before[3])
        )
        return SharedUpdate(
            class_slots=np.flatnonzero(moved),
            buckets=np.flatnonzero(buckets),
            forgotten=forgotten,
            left_out=MergeReport(no_class, max(no_drafter, cost_no_drafter), bounds_differ),
        )

    def _merge_acceptance(self, part: SharedAcceptance | None) -> tuple[set[str], int, int]:
        """Place the fleet's acceptance by this replica's slots; the classes placed, and
        how many classes and drafters found no slot."""
        acc = self.acceptance
        counts = np.zeros_like(acc.counts)
        arm_stats = np.zeros_like(acc.arm_stats)
        rounds = np.zeros_like(acc.rounds)
        if part is None:
            acc.set_shared(counts, arm_stats, rounds)
            return set(), 0, 0
        d_slots = np.array([self.slot_of_drafter(d) for d in part.drafters], dtype=np.int64)
        c_slots = np.array([self._shared_class_slot(c) for c in part.classes], dtype=np.int64)
        ci, di = np.flatnonzero(c_slots >= 0), np.flatnonzero(d_slots >= 0)
        k = part.max_k
        block = np.zeros((ci.size, di.size, 2, counts.shape[3]))
        block[..., :k] = part.counts[np.ix_(ci, di)]
        counts[np.ix_(c_slots[ci], d_slots[di])] = block
        block = np.zeros((ci.size, di.size, arm_stats.shape[2], arm_stats.shape[3]))
        block[..., : k + 1] = part.arm_stats[np.ix_(ci, di)]
        arm_stats[np.ix_(c_slots[ci], d_slots[di])] = block
        rounds[c_slots[ci]] = part.rounds[ci]
        acc.set_shared(counts, arm_stats, rounds)
        merged = {part.classes[i] for i in ci.tolist()}
        return merged, int((c_slots < 0).sum()), int((d_slots < 0).sum())

    def _merge_cost(self, part: SharedCost | None) -> tuple[np.ndarray, int]:
        """Place the fleet's cost and load in this replica's feature layout and refit the
        buckets they moved; those buckets, and how many of the fleet's drafters found
        no slot (its cost is then left out whole: a regression without some of its
        features means something else)."""
        cost, load = self.cost, self.load
        xtx, xty = np.zeros_like(cost.xtx), np.zeros_like(cost.xty)
        zeros = np.zeros(self.num_buckets)
        vectors = (zeros, zeros, zeros, zeros, zeros)
        missing = 0
        if part is not None:
            slots = [self.slot_of_drafter(d) for d in part.drafters]
            missing = sum(1 for slot in slots if slot < 0)
            if not missing:
                idx = np.array([self._cost_column(key) for key in part.feature_keys()])
                keep = np.flatnonzero(idx >= 0)
                placed = idx[keep]
                xtx[:, placed[:, None], placed[None, :]] = part.xtx[:, keep[:, None], keep[None, :]]
                xty[:, placed] = part.xty[:, keep]
                self._mark_shared_batch_drafters(xtx)
                vectors = (
                    part.yy,
                    part.steps,
                    part.load_steps,
                    part.load_batch_sum,
                    part.load_extra_tokens_sum,
                )
        before = [
            cost.shared_xtx.copy(),
            cost.shared_xty.copy(),
            cost.shared_yy.copy(),
            cost.shared_steps.copy(),
            load.shared_steps.copy(),
            load.shared_batch_sum.copy(),
            load.shared_extra_tokens_sum.copy(),
            cost.shared_weight.copy(),
        ]
        cost.set_shared(xtx, xty, vectors[0], vectors[1])
        load.set_shared(*vectors[2:])
        for b in range(self.num_buckets):
            self._weigh_shared_cost(b)
        after = [
            cost.shared_xtx,
            cost.shared_xty,
            cost.shared_yy,
            cost.shared_steps,
            load.shared_steps,
            load.shared_batch_sum,
            load.shared_extra_tokens_sum,
            cost.shared_weight,
        ]
        moved = np.zeros(self.num_buckets, dtype=bool)
        for old, new in zip(before, after, strict=True):
            moved |= (old != new).reshape(self.num_buckets, -1).any(axis=1)
        for b in np.flatnonzero(moved).tolist():
            self._refit(b)
        return moved, missing

    def _cost_column(self, key: FeatureKey) -> int:
        """Where a shared cost feature sits in this replica's layout; -1 where it has no
        column for it (an arm beyond its ``k_columns``, a class without a slot or
        beyond its ``class_columns``): the feature is then left out of the sums."""
        cost = self.cost
        kind = key[0]
        if kind == "line":
            return int(key[1])
        if kind == "drafter":
            return (
                BASE_FEATURES + FEATURES_PER_DRAFTER * self.drafter_slot[str(key[1])] + int(key[2])
            )
        if kind == "arm":
            arm = parse_arm(str(key[1]))
            if arm.k > cost.k_columns:
                return -1
            return cost.arm_start + cost.k_columns * self.drafter_slot[arm.drafter] + arm.k - 1
        class_slot = self.class_slot.get(str(key[1]), -1)
        if not 0 <= class_slot < cost.class_columns:
            return -1
        return cost.class_start + cost.num_drafters * class_slot + self.drafter_slot[str(key[2])]

    def _refit(self, bucket: int) -> None:
        """Fit the bucket again after the fleet's statistics moved.

        The noise variance and the fit depend on each other: a large variance
        lets the prior pull the fit away from the data, whose residuals then
        confirm the large variance. A replica's own refits after every report
        grow the variance from below as steps arrive; statistics that arrive
        whole are fitted the same way, from a small variance up until it settles.
        """
        typical = self.typical_features(bucket)
        floor = 1e-3 * self.cost.mean_step_s(bucket)
        self.cost.noise_var[bucket] = floor * floor
        for _ in range(_REFIT_ITERATIONS):
            noise = float(self.cost.noise_var[bucket])
            self.cost.refresh(bucket, typical)
            if abs(float(self.cost.noise_var[bucket]) - noise) <= 1e-3 * noise:
                break

    def clear_shared(self) -> None:
        """Drop the fleet's evidence, keeping every slot and this replica's own fits."""
        acc, cost, load = self.acceptance, self.cost, self.load
        acc.set_shared(
            np.zeros_like(acc.counts), np.zeros_like(acc.arm_stats), np.zeros_like(acc.rounds)
        )
        zeros = np.zeros(self.num_buckets)
        cost.set_shared(np.zeros_like(cost.xtx), np.zeros_like(cost.xty), zeros, zeros)
        cost.shared_weight[:] = 0.0
        cost.shared_held[:] = False
        load.set_shared(zeros, zeros, zeros)
        load.shared_weight[:] = 0.0

    def _weigh_shared_cost(self, bucket: int) -> None:
        self.cost.weigh_shared(bucket, self.typical_features(bucket))
        self.load.shared_weight[bucket] = self.cost.shared_weight[bucket]

    def _shared_class_slot(self, name: str) -> int:
        """The class's slot, or a free one for a class known only from the fleet (it
        keeps update stamp 0, so it is the first evicted); -1 when none is free."""
        slot = self.class_slot.get(name)
        if slot is not None:
            return slot
        if len(self.class_slot) >= len(self.slot_class):
            return -1
        slot = self.slot_class.index(None)
        self.class_slot[name] = slot
        self.slot_class[slot] = name
        self.last_update[slot] = 0
        return slot

    def _forget_shared_only(self, merged: set[str]) -> tuple[tuple[str, int], ...]:
        """Free the slots of classes known only from the fleet that it no longer has."""
        gone = [
            name
            for name, slot in self.class_slot.items()
            if name not in merged
            and self.last_update[slot] == 0
            and self.acceptance.rounds[slot] == 0.0
        ]
        return tuple((name, self.forget(name)) for name in gone)

    # -- reading --------------------------------------------------------------

    def mix_members(self, bucket: int) -> np.ndarray:
        """Class slots that share the bucket's batches (the largest shares), by slot.

        A class that runs alone in its steps (classes arriving in bursts, one batch after
        another) is decided alone: in a joint choice the other classes' requests would
        pay its drafts' batch-wide cost in steps they are never in. Where a class's steps
        are not known (a state saved before they were counted) it counts as sharing.
        Kept until the mix changes (:meth:`mix_changed`), read-only.
        """
        cached = self._members.get(bucket)
        if cached is None:
            cached = self._members[bucket] = self._find_members(bucket)
            cached.setflags(write=False)
        return cached

    def _find_members(self, bucket: int) -> np.ndarray:
        mix = self.mix[bucket]
        total = float(mix.sum())
        if total <= 0.0:
            return np.zeros(0, dtype=np.int64)
        present = self.mix_present[bucket]
        others = np.where(present > 0.0, 1.0 - mix / np.maximum(present, 1e-12), 1.0)
        members = np.flatnonzero((mix >= _MIN_MIX_SHARE * total) & (others >= _MIN_SHARED_SHARE))
        if members.shape[0] < 2:
            return np.zeros(0, dtype=np.int64)
        order = np.argsort(-mix[members], kind="stable")
        return np.sort(members[order][:MAX_JOINT_CLASSES])

    def requests_per_step(self, bucket: int, slot: int) -> float:
        """The class's mean request-rounds per step of the bucket (0 before any step)."""
        steps = float(self.mix_steps[bucket])
        return float(self.mix[bucket, slot]) / steps if steps > 0.0 else 0.0

    def token_demand(self, bucket: int, members: np.ndarray) -> np.ndarray:
        """Each member's share of the committed tokens of the bucket's classes: the work
        each brings, which sets how many slots it holds at a given arm (while a member
        has no tokens counted, as after loading a state saved before they were: each
        member's share of the requests)."""
        tokens = self.mix_tokens[bucket, members]
        if (tokens <= 0.0).any():
            tokens = self.mix[bucket, members]
        return tokens / max(float(tokens.sum()), 1e-12)

    def typical_features(self, bucket: int) -> np.ndarray:
        """A step of the bucket running K=2 for the whole batch: the cost prior's scales."""
        batch_size = self.load.batch_size(bucket)
        typical = np.empty(self.cost.num_features)
        typical[0] = 1.0
        typical[1] = 3.0 * batch_size
        typical[2] = self.load.extra_tokens(bucket)
        f, n = BASE_FEATURES, FEATURES_PER_DRAFTER
        e = self.cost.arm_start
        typical[f:e:n] = batch_size
        typical[f + 1 : e : n] = 2.0 * batch_size
        typical[f + 2 : e : n] = 2.0 * batch_size
        typical[f + 3 : e : n] = batch_size
        typical[f + 4 : e : n] = batch_size
        typical[e:] = _K_COLUMN_TYPICAL * batch_size
        return typical
