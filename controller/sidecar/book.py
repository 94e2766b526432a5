"""PolicyBook: the sidecar's state, free of gRPC and asyncio.

It wraps a :class:`~specctl.policy.base.Policy` and owns what the policy
does not: the union of arms engines offer, the bound on workload classes,
operator overrides, the published distributions and their version, how much
those distributions move (a :class:`~specctl.sidecar.stability.DecisionStability`
per context), and the per-engine restriction of a policy to the arms that
engine can run. The server drives it from one event loop; the simulator drives
it in-process. It answers in plain values (:mod:`specctl.sidecar.published`)
and counts in a plain :class:`~specctl.sidecar.book_stats.BookStats`: the
protocol package makes messages of the one, the metrics exporter series of the
other. It stays one class (about 500 lines): every change to a published
distribution moves the version, the stats and the stability tracker together.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from specctl.arms import OFF, Arm, arms_for
from specctl.logs import get_logger
from specctl.policy.base import Decision, Policy
from specctl.policy.shared import MergeReport, SharedEvidence, SharesEvidence
from specctl.sidecar.book_stats import BookStats, Context
from specctl.sidecar.fleet_entry import MAX_RESETS
from specctl.sidecar.published import (
    BookEvidence,
    ContextEvidence,
    EnginePolicy,
    engine_policy,
)
from specctl.sidecar.stability import (
    FLIP_MARGIN,
    WINDOW_S,
    DecisionStability,
    StabilityStats,
    total_variation,
)
from specctl.steps import StepBatch, merge_batches, validate_class_name

log = get_logger(__name__)

Sink = Callable[[StepBatch], Any]
# a switched-off context's share of speculating rounds is published again when it has
# moved by this factor from what engines run (see _probes_moved)
PROBE_SHARE_FACTOR = 2.0
# Goodput estimates need a policy.evidence() call per context: refresh them at most this often.
EVIDENCE_REFRESH_S = 1.0
# A class reset is shared with the fleet this long (see PolicyBook.fleet_resets), and at most
# as many of the latest as a fleet entry may carry (readers refuse an entry with more).
RESET_MEMORY_S = 24 * 3600.0
MAX_FLEET_RESETS = MAX_RESETS
# a reset's epoch is later than the last one this sidecar knows of by at least this
_RESET_EPOCH_STEP_S = 1e-3


class UnknownClassError(KeyError):
    """A workload class the book has never seen."""


@dataclasses.dataclass
class _Published:
    decision: Decision
    override: bool = False


class PolicyBook:
    """The published policy per (workload class, load bucket), versioned.

    ``version`` moves when a distribution changes materially (total variation
    above ``push_threshold``, or a switched-off context's probes halved or
    doubled), on an override, and when a class appears.
    Every published distribution also goes to the context's stability tracker
    (``flip_margin`` and ``stability_window_s`` configure it; ``clock`` times it).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        policy_name: str | None = None,
        default_class: str = "default",
        max_classes: int = 64,
        load_bucket_bounds: Iterable[int] = (8, 32, 128),
        fallback_arm: Arm | None = None,
        push_threshold: float = 0.05,
        clock: Callable[[], float] = time.time,
        flip_margin: float = FLIP_MARGIN,
        stability_window_s: float = WINDOW_S,
    ) -> None:
        self.policy = policy
        self.policy_name = policy_name or policy.policy_name
        self.default_class = default_class
        self.max_classes = max_classes
        self.load_bucket_bounds = tuple(int(b) for b in load_bucket_bounds)
        self.fallback_arm = fallback_arm
        self.push_threshold = push_threshold
        self.stats = BookStats()
        self.clock = clock
        self.version = 0
        self._arms: list[Arm] = [OFF]
        self._offered: dict[str, int] = {}
        self._classes: dict[str, int] = {}  # name -> id, insertion ordered
        self._overrides: dict[str, Arm] = {}
        self._published: dict[Context, _Published] = {}
        self.flip_margin = flip_margin
        self.stability_window_s = stability_window_s
        self._stability: dict[Context, DecisionStability] = {}
        self._sinks: list[Sink] = []
        self._cache: dict[tuple[int, frozenset[tuple[str, int]], Arm], EnginePolicy] = {}
        self._stale_evidence: set[Context] = set()
        self._off_contexts: set[Context] = set()  # contexts whose most likely arm is off
        # class -> epoch (unix s) of its latest reset, made here or by another member
        self._resets: dict[str, float] = {}
        self._evidence_refreshed = 0.0
        self.policy.set_arms(self._arms)
        self._add_class(default_class)
        self._bump()

    # ----------------------------------------------------------------- arms, classes

    @property
    def num_load_buckets(self) -> int:
        return len(self.load_bucket_bounds) + 1

    @property
    def arms(self) -> tuple[Arm, ...]:
        return tuple(self._arms)

    @property
    def offered(self) -> dict[str, int]:
        """Union of the drafters engines offered (drafter -> largest max K)."""
        return dict(self._offered)

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self._classes)

    @property
    def overrides(self) -> dict[str, Arm]:
        return dict(self._overrides)

    def offer(self, drafters: Mapping[str, int]) -> bool:
        """An engine offers these drafters; grow the arm union. True if it grew."""
        grew = False
        for drafter, max_k in drafters.items():
            if max_k > self._offered.get(drafter, 0):
                self._offered[drafter] = max_k
                grew = True
        if not grew:
            return False
        self._arms = arms_for(sorted(self._offered.items()))
        self.policy.set_arms(self._arms)
        self._republish(self._published.keys(), force=False)
        return True

    def _add_class(self, name: str) -> None:
        self._classes[name] = len(self._classes)
        self.stats.classes = len(self._classes)
        for bucket in range(self.num_load_buckets):
            ctx = (name, bucket)
            decided = self._decide(ctx)
            self._publish(ctx, decided or _Published(Decision.point(OFF, "policy failed: off")))

    def fold_class(self, name: str) -> str:
        """The class the book keeps ``name`` under: itself, or the default class when full."""
        if name in self._classes:
            return name
        if len(self._classes) >= self.max_classes:
            return self.default_class
        return name

    # ----------------------------------------------------------------- decisions

    def _decide(self, ctx: Context) -> _Published | None:
        """The context's distribution now; None if the policy failed (a bug, logged and counted)."""
        arm = self._overrides.get(ctx[0])
        if arm is not None:
            return _Published(Decision.point(arm, f"pinned by operator: {arm}"), override=True)
        try:
            return _Published(self.policy.select_action(*ctx))
        except Exception:
            self.stats.count_internal_error("policy_select")
            log.exception("policy_select_failed", workload_class=ctx[0], load_bucket=ctx[1])
            return None

    def _publish(self, ctx: Context, new: _Published) -> None:
        old = self._published.get(ctx)
        self._published[ctx] = new
        stats = self.stats
        decision = new.decision
        stats.arm_probability[ctx] = dict(
            zip((a.name for a in decision.arms), decision.probabilities.tolist(), strict=True)
        )
        off_now = decision.mode.is_off
        stats.speculation_off[ctx] = off_now
        if off_now:
            self._off_contexts.add(ctx)
        else:
            self._off_contexts.discard(ctx)
        if old is not None and off_now and not old.decision.mode.is_off:
            stats.switch_offs[ctx[0]] = stats.switch_offs.get(ctx[0], 0) + 1
        self._stale_evidence.add(ctx)
        tracker = self._stability.get(ctx)
        if tracker is None:
            self._stability[ctx] = self._new_tracker(decision)
        else:
            tracker.observe(decision, self.clock())

    def _new_tracker(self, decision: Decision) -> DecisionStability:
        return DecisionStability(
            decision,
            self.clock(),
            flip_margin=self.flip_margin,
            window_s=self.stability_window_s,
        )

    def _republish(self, contexts: Iterable[Context], *, force: bool) -> bool:
        changed = False
        for ctx in list(contexts):
            new = self._decide(ctx)
            if new is None:
                continue  # keep what engines run now
            old = self._published[ctx]
            if (
                force
                or new.override != old.override
                or total_variation(new.decision, old.decision) > self.push_threshold
                or _probes_moved(new.decision, old.decision)
            ):
                self._publish(ctx, new)
                changed = True
        if changed:
            self._bump()
        return changed

    def _bump(self) -> None:
        self.version += 1
        self._cache.clear()
        self.stats.policy_version = self.version

    def decision(self, workload_class: str, load_bucket: int) -> Decision:
        """The published distribution for a context (the default class's if unknown)."""
        pub = self._published.get((workload_class, load_bucket))
        if pub is None:
            pub = self._published[(self.default_class, load_bucket)]
        return pub.decision

    # ----------------------------------------------------------------- learning

    def add_sink(self, sink: Sink) -> None:
        """Call ``sink(batch)`` with every ingested batch (classes folded as the policy saw)."""
        self._sinks.append(sink)

    def ingest(self, batch: StepBatch) -> bool:
        """Learn from a validated report; True if the published policy changed (new version)."""
        return self.ingest_many([batch])

    def ingest_many(self, batches: Sequence[StepBatch]) -> bool:
        """Learn from several validated reports at once: one policy update, one republish.

        The server passes every report that arrived while the previous round was
        being learned, so under load the policy recomputes its decisions once per
        round rather than once per report. Sinks still get each report on its own.
        """
        stats = self.stats
        folded: list[StepBatch] = []
        new_classes = False
        for one in batches:
            one, added = self._fold_classes(one)
            new_classes |= added
            folded.append(one)
        if not folded:
            return False
        batch = merge_batches(folded)

        rows_bucket = batch.load_bucket[batch.request_step]
        stats.count_rows(batch, rows_bucket, self.num_load_buckets, self._off_contexts)
        if batch.num_steps:
            stats.learned_until_unix_s = max(
                stats.learned_until_unix_s, float(batch.step_end_unix_s.max())
            )
        try:
            self.policy.update_params(batch)
        except Exception:
            # A policy bug must not take the stream (or other engines) down with it;
            # the report still reaches the sinks so nothing is lost from the log.
            stats.count_internal_error("policy_update")
            log.exception(
                "policy_update_failed",
                engine_id=folded[0].engine_id,
                sequence=folded[0].sequence,
                reports=len(folded),
            )
        changed = self._republish(self._touched(batch), force=False)
        # the estimates of the contexts with rows moved, whether or not their decision did
        nb = self.num_load_buckets
        keys = np.unique(batch.class_index * nb + rows_bucket).tolist()
        self._stale_evidence.update((batch.classes[k // nb], k % nb) for k in keys)
        if new_classes and not changed:
            self._bump()
            changed = True
        for one in folded:
            for sink in self._sinks:
                try:
                    sink(one)
                except Exception:
                    stats.count_internal_error("sink")
                    log.exception("sink_failed", sink=getattr(sink, "__qualname__", repr(sink)))
        return changed

    def _touched(self, batch: StepBatch) -> list[Context]:
        """The contexts whose decision a batch can change.

        A policy's models are shared between contexts: step cost per load
        bucket, acceptance per class. So every class of a load bucket the
        batch's steps ran in, and every load bucket of a class it has rows for.
        """
        nb = self.num_load_buckets
        buckets = np.unique(batch.load_bucket).tolist()
        classes = [batch.classes[i] for i in np.unique(batch.class_index).tolist()]
        by_bucket = [(cls, b) for b in buckets for cls in self._classes]
        by_class = [(cls, b) for cls in classes for b in range(nb)]
        return list(dict.fromkeys(by_bucket + by_class))

    def _fold_classes(self, batch: StepBatch) -> tuple[StepBatch, bool]:
        """The batch with its classes folded into those the book keeps; True if any is new."""
        new_classes = False
        names: list[str] = []
        for name in batch.classes:
            folded = self.fold_class(name)
            if folded not in self._classes:
                self._add_class(folded)
                new_classes = True
            names.append(folded)
        if names != list(batch.classes):
            unique = list(dict.fromkeys(names))
            remap = np.fromiter((unique.index(n) for n in names), np.int64, len(names))
            overflowed = np.fromiter(
                (n != o for n, o in zip(names, batch.classes, strict=True)), bool, len(names)
            )
            if batch.num_rows:
                self.stats.class_overflow_rows += int(overflowed[batch.class_index].sum())
            batch = dataclasses.replace(
                batch, classes=tuple(unique), class_index=remap[batch.class_index]
            )
        return batch, new_classes

    def refresh_estimates(self, *, now: float | None = None) -> None:
        """Put the policy's goodput estimates of recently published contexts in the stats.

        A ``policy.evidence()`` call per context: the server calls it after each
        learning round, and it does the work at most once per ``EVIDENCE_REFRESH_S``.
        """
        now = time.monotonic() if now is None else now
        if now - self._evidence_refreshed < EVIDENCE_REFRESH_S or not self._stale_evidence:
            return
        self._evidence_refreshed = now
        stale, self._stale_evidence = self._stale_evidence, set()
        stats = self.stats
        for ctx in stale:
            ev = self.policy.evidence(*ctx)
            if not ev.arms:
                continue
            by_arm = {e.arm: e for e in ev.arms}
            chosen = by_arm.get(self._published[ctx].decision.mode)
            if chosen is not None:
                stats.chosen_arm_goodput[ctx] = chosen.goodput
            off = by_arm.get(OFF)
            if off is not None:
                stats.no_spec_goodput[ctx] = off.goodput

    # ----------------------------------------------------------------- the fleet

    def contribution(self) -> SharedEvidence | None:
        """What this replica learned, to share with its fleet; None when the policy keeps
        nothing it can share (a fixed rule, a baseline). A read."""
        if not isinstance(self.policy, SharesEvidence):
            return None
        return self.policy.contribution()

    def merge_shared(self, shared: SharedEvidence | None) -> tuple[bool, MergeReport]:
        """Decide from the fleet's evidence too, in place of what was merged before
        (None: from this replica's own only); True if the published policy changed.

        The fleet's classes join the book while it has room (``max_classes``), as
        they would in one sidecar serving every replica: an engine's first request
        of a class that other replicas run gets the fleet's decision for it, not the
        default class's.
        """
        if not isinstance(self.policy, SharesEvidence):
            return False, MergeReport()
        try:
            report = self.policy.merge_shared(shared)
        except Exception:
            self.stats.count_internal_error("policy_merge")
            log.exception("policy_merge_failed")
            return False, MergeReport()
        added = False
        if shared is not None and shared.acceptance is not None:
            for name in shared.acceptance.classes:
                if name not in self._classes and self.fold_class(name) == name:
                    self._add_class(name)
                    added = True
        changed = self._republish(list(self._published), force=False)
        self._stale_evidence.update(self._published)
        if added and not changed:
            self._bump()
            changed = True
        return changed, report

    # ----------------------------------------------------------------- operator

    def set_override(self, workload_class: str, arm: Arm | None) -> int:
        """Pin ``workload_class`` to ``arm`` (``OFF`` disables speculation), or clear with None.

        Returns the new version. The class is created if the book has room.
        """
        problem = validate_class_name(workload_class)
        if problem is not None:
            raise ValueError(problem)
        new_class = workload_class not in self._classes
        if new_class and arm is None:
            return self.version
        if new_class and self.fold_class(workload_class) != workload_class:
            raise ValueError(
                f"workload class {workload_class!r} cannot be added: "
                f"max_classes={self.max_classes} reached"
            )
        if arm is None:
            self._overrides.pop(workload_class, None)
        else:
            self._overrides[workload_class] = arm
        if new_class:
            self._add_class(workload_class)
        contexts = [(workload_class, b) for b in range(self.num_load_buckets)]
        self._republish(contexts, force=True)
        return self.version

    def reset_class(self, workload_class: str) -> int:
        """Forget what the policy learned for a class; returns the new version.

        The reset gets an epoch, the time now or just after the latest reset of
        the class this sidecar knows of (clocks of other members may be ahead),
        that a fleet's store shares (:meth:`fleet_resets`): the other members
        forget the class too, and nobody merges evidence of it from before.
        """
        if workload_class not in self._classes:
            raise UnknownClassError(workload_class)
        known = self._resets.get(workload_class)
        epoch = self.clock() if known is None else max(self.clock(), known + _RESET_EPOCH_STEP_S)
        self._resets[workload_class] = epoch
        self.policy.reset_class(workload_class)
        self._republish([(workload_class, b) for b in range(self.num_load_buckets)], force=True)
        return self.version

    def fleet_resets(self) -> dict[str, float]:
        """The class resets this sidecar has applied, to share with its fleet: class ->
        epoch, the latest ``MAX_FLEET_RESETS`` of the last ``RESET_MEMORY_S``.

        A reset must outlive the evidence from before it in the store: entries
        expire within seconds, but a member may come back from a snapshot saved
        before the reset, and is held back by the reset for as long as it is kept.
        """
        since = self.clock() - RESET_MEMORY_S
        recent = sorted(
            ((epoch, name) for name, epoch in self._resets.items() if epoch >= since),
            reverse=True,
        )[:MAX_FLEET_RESETS]
        self._resets = {name: epoch for epoch, name in recent}
        return dict(self._resets)

    def apply_fleet_reset(self, workload_class: str, epoch: float) -> bool:
        """Another member reset the class at ``epoch``: forget it here too, unless this
        sidecar has applied that reset or a later one. True if the published policy
        changed."""
        known = self._resets.get(workload_class)
        if (known is not None and known >= epoch) or epoch < self.clock() - RESET_MEMORY_S:
            return False  # applied, or forgotten here already (a member's clock is behind)
        self._resets[workload_class] = epoch
        if workload_class not in self._classes:
            return False  # nothing learned here; evidence from before it is not merged
        self.policy.reset_class(workload_class)
        contexts = [(workload_class, b) for b in range(self.num_load_buckets)]
        return self._republish(contexts, force=True)

    def set_fallback_arm(self, arm: Arm | None) -> int:
        """Change the fallback every engine is told (None: each engine's own); a new version."""
        if arm != self.fallback_arm:
            self.fallback_arm = arm
            self._bump()
        return self.version

    def replace_policy(self, policy: Policy, policy_name: str | None = None) -> int:
        """Swap in a new policy (configuration reload); every context is republished."""
        self.policy = policy
        self.policy_name = policy_name or policy.policy_name
        policy.set_arms(self._arms)
        self._republish(list(self._published), force=True)
        return self.version

    def restore(self, *, classes: Iterable[str], overrides: Mapping[str, Arm], version: int) -> int:
        """Bring back classes, overrides and the version counter from a snapshot.

        Classes beyond ``max_classes`` or with invalid names are left out; the
        version continues above the snapshot's, so engines never see it go back.
        """
        for name in classes:
            if name not in self._classes and validate_class_name(name) is None:
                if self.fold_class(name) == name:
                    self._add_class(name)
        for cls, arm in overrides.items():
            if cls in self._classes:
                self._overrides[cls] = arm
        self.version = max(self.version, version)
        self._republish(list(self._published), force=True)
        return self.version

    # ----------------------------------------------------------------- views

    def policy_for(self, offered: Mapping[str, int], fallback: Arm) -> EnginePolicy:
        """The policy as an engine offering ``offered`` (drafter -> max K) receives it.

        The book's fallback arm wins over the engine's own (:func:`engine_policy`
        restricts every distribution to the engine's arms). Kept per version and
        offer, so engines alike share one.
        """
        key = (self.version, frozenset(offered.items()), fallback)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        policy = engine_policy(
            [(ctx, pub.decision) for ctx, pub in self._published.items()],
            offered,
            self.fallback_arm if self.fallback_arm is not None else fallback,
            fallback,
            version=self.version,
            policy_name=self.policy_name,
            load_bucket_bounds=self.load_bucket_bounds,
            default_class=self.default_class,
        )
        self._cache[key] = policy
        return policy

    def full_policy(self) -> EnginePolicy:
        """The policy as an engine offering every drafter seen would receive it."""
        return self.policy_for(self._offered, self.fallback_arm or OFF)

    def stability(self, workload_class: str, load_bucket: int) -> StabilityStats:
        """How much the context's published distribution moves and how settled its mode is.

        A read: the tracker is left as it was. Raises :class:`UnknownClassError`
        for a class the book does not keep, ``KeyError`` for a bucket it has not.
        """
        if workload_class not in self._classes:
            raise UnknownClassError(workload_class)
        return self._stability[(workload_class, load_bucket)].stats(self.clock())

    def stability_by_context(self) -> dict[Context, StabilityStats]:
        """:meth:`stability` of every (workload class, load bucket), at one instant."""
        now = self.clock()
        return {ctx: tracker.stats(now) for ctx, tracker in self._stability.items()}

    def restart_stability(self) -> None:
        """Track every context afresh from what is published now.

        The sidecar calls it once its learned state is restored: the
        distributions published while restoring reached no engine, so their
        movement is not instability.
        """
        self._stability = {
            ctx: self._new_tracker(pub.decision) for ctx, pub in self._published.items()
        }

    def stability_trackers(self) -> list[tuple[Context, DecisionStability]]:
        """Every context's tracker, as a list the metrics exporter reads from its own thread."""
        return list(self._stability.items())

    def evidence(self, workload_class: str | None = None) -> BookEvidence:
        """The evidence behind the policy, for one class or all of them.

        Reading changes no stability tracker.
        """
        if workload_class:
            if workload_class not in self._classes:
                raise UnknownClassError(workload_class)
            classes = [workload_class]
        else:
            classes = list(self._classes)
        now = self.clock()
        contexts = [
            ContextEvidence(
                workload_class=cls,
                load_bucket=bucket,
                decision=self._published[(cls, bucket)].decision,
                override=self._overrides.get(cls),
                evidence=self.policy.evidence(cls, bucket),
                stability=self._stability[(cls, bucket)].stats(now),
            )
            for cls in classes
            for bucket in range(self.num_load_buckets)
        ]
        return BookEvidence(self.version, self.policy_name, tuple(contexts))


def _probes_moved(new: Decision, old: Decision) -> bool:
    """Whether a switched-off context's probes moved enough to publish: its share of
    speculating rounds halved or doubled (``PROBE_SHARE_FACTOR``) since the one engines
    run. Total variation alone never sees it: probes are a few percent of the rounds, so
    moving from 5% to 0.5% is a distance of 0.045, under a push threshold of 0.05, and
    engines kept speculating on ten times the rounds the policy meant to, where every
    speculative arm loses (in the simulator's load swing, 4% of the rounds at a batch of
    256, each costing up to three plain steps). A context that does not probe at all, or
    is not off, is left to total variation."""
    if not (new.mode.is_off or old.mode.is_off):
        return False
    probes_new = 1.0 - new.probability_of(OFF)
    probes_old = 1.0 - old.probability_of(OFF)
    if probes_new <= 0.0 or probes_old <= 0.0:
        return False
    return max(probes_new / probes_old, probes_old / probes_new) > PROBE_SHARE_FACTOR
