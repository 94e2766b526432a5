"""Decision stability: how much a context's published distribution moves, and how often its
most likely arm changes.

A policy that keeps changing its mind costs goodput even when each decision
is reasonable: engines switch drafters and K, and the evidence behind every
choice stays thin. Per (workload class, load bucket) the
:class:`~specctl.sidecar.book.PolicyBook` keeps one :class:`DecisionStability`
and feeds it every distribution it publishes. It is a plain stats object, in
the manner of vLLM's ``SpecDecodingStats``: it knows nothing of Prometheus or
gRPC; the exporter in :mod:`specctl.sidecar.metrics` and
``PolicyBook.evidence`` read it (:mod:`specctl.protocol.policy_messages` puts
it in messages), and reading never changes it.

What it measures, per context:

* **changes** and their **total-variation distance**: every published
  distribution that differs from the previous one, and by how much (TV, in
  [0, 1]). The book publishes only material changes (above
  ``policy.push_threshold``), so this is the movement engines are sent.
* **mode flips**, with hysteresis: the mode is the arm last *clearly* most
  likely. It changes only when another arm's probability beats the current
  mode's by at least ``flip_margin`` (or the mode left the distribution), so
  two arms that trade places around a tie do not count as flips. Each flip
  restarts the mode's **dwell time**.
* the same counts over a **recent window** (``window_s``, 10 minutes by
  default, kept in ``window_slots`` slots of a ring, so it slides in steps of
  ``window_s / window_slots``), from which the rates (flips per minute, TV
  per second) are taken. Memory per context is constant.

Operator overrides and class resets publish like any other decision and count
the same way: the tracker measures what engines are told, whoever decided it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specctl.arms import Arm
from specctl.policy.base import Decision

# Another arm must beat the current mode's probability by this much to take over.
FLIP_MARGIN = 0.1
# The recent window, and the ring slots it slides in.
WINDOW_S = 600.0
WINDOW_SLOTS = 10


def total_variation(a: Decision, b: Decision) -> float:
    """Total-variation distance between two distributions over (possibly different) arms."""
    if a.arms == b.arms:
        if len(a.arms) == 1:
            return 0.0
        return 0.5 * float(np.abs(a.probabilities - b.probabilities).sum())
    pa = dict(zip(a.arms, a.probabilities.tolist(), strict=True))
    pb_ = dict(zip(b.arms, b.probabilities.tolist(), strict=True))
    return 0.5 * sum(abs(pa.get(arm, 0.0) - pb_.get(arm, 0.0)) for arm in pa.keys() | pb_.keys())


@dataclass(frozen=True)
class StabilityStats:
    """What a :class:`DecisionStability` says at one moment: a read-only copy.

    ``window_s`` is the span the ``*_recent`` counts cover: the configured
    window, or less while the context is younger than that.
    """

    mode: Arm
    mode_since: float
    mode_dwell_s: float
    mode_flips_total: int
    changes_total: int
    change_tv_total: float
    window_s: float
    mode_flips_recent: int
    changes_recent: int
    change_tv_recent: float
    mode_flips_per_minute: float
    change_tv_per_second: float


class DecisionStability:
    """Movement of one context's published distribution: totals, a recent window, the mode.

    ``observe`` is the only method that changes it; ``stats`` and the
    attributes are reads. Times are in the caller's clock (the book's), in
    seconds.
    """

    __slots__ = (
        "_slot_changes",
        "_slot_flips",
        "_slot_index",
        "_slot_s",
        "_slot_tv",
        "change_tv_total",
        "changes_total",
        "decision",
        "flip_margin",
        "mode",
        "mode_flips_total",
        "mode_since",
        "started",
        "window_s",
    )

    def __init__(
        self,
        decision: Decision,
        now: float,
        *,
        flip_margin: float = FLIP_MARGIN,
        window_s: float = WINDOW_S,
        window_slots: int = WINDOW_SLOTS,
    ) -> None:
        if not 0.0 <= flip_margin <= 1.0:
            raise ValueError(f"flip_margin={flip_margin} must be in [0, 1]")
        if not (window_s > 0.0 and math.isfinite(window_s)) or window_slots < 1:
            raise ValueError(f"window_s={window_s}, window_slots={window_slots} must be positive")
        self.flip_margin = flip_margin
        self.window_s = float(window_s)
        self.started = now
        self.decision = decision
        self.mode = decision.mode
        self.mode_since = now
        self.mode_flips_total = 0
        self.changes_total = 0
        self.change_tv_total = 0.0
        self._slot_s = self.window_s / window_slots
        self._slot_index = [-1] * window_slots  # which slot-sized interval each slot holds
        self._slot_flips = [0] * window_slots
        self._slot_changes = [0] * window_slots
        self._slot_tv = [0.0] * window_slots

    def observe(self, decision: Decision, now: float) -> bool:
        """A new distribution is published; True if the mode flipped."""
        tv = total_variation(self.decision, decision)
        self.decision = decision
        flipped = False
        candidate = decision.mode
        if candidate != self.mode and (
            decision.probability_of(candidate) - decision.probability_of(self.mode)
            >= self.flip_margin
            or self.mode not in decision.arms
        ):
            self.mode = candidate
            self.mode_since = now
            self.mode_flips_total += 1
            flipped = True
        if tv <= 0.0 and not flipped:
            return False
        slot = self._slot(now)
        if tv > 0.0:
            self.changes_total += 1
            self.change_tv_total += tv
            self._slot_changes[slot] += 1
            self._slot_tv[slot] += tv
        if flipped:
            self._slot_flips[slot] += 1
        return flipped

    def _slot(self, now: float) -> int:
        """The ring slot for ``now``, emptied first when it still holds an older interval."""
        index = math.floor(now / self._slot_s)
        slot = index % len(self._slot_index)
        if self._slot_index[slot] != index:
            self._slot_index[slot] = index
            self._slot_flips[slot] = 0
            self._slot_changes[slot] = 0
            self._slot_tv[slot] = 0.0
        return slot

    def dwell_s(self, now: float) -> float:
        """Seconds the current mode has been the mode (since the context appeared, if ever)."""
        return max(0.0, now - self.mode_since)

    def stats(self, now: float) -> StabilityStats:
        """The totals, the recent window and the rates at ``now``; changes nothing."""
        n = len(self._slot_index)
        current = math.floor(now / self._slot_s)
        oldest = current - n + 1
        flips = changes = 0
        tv = 0.0
        for i in range(n):
            if oldest <= self._slot_index[i] <= current:
                flips += self._slot_flips[i]
                changes += self._slot_changes[i]
                tv += self._slot_tv[i]
        covered = max(0.0, now - max(oldest * self._slot_s, self.started))
        # at least one slot: a context seconds old with one flip is not at 1000 flips/min
        per = max(covered, self._slot_s)
        return StabilityStats(
            mode=self.mode,
            mode_since=self.mode_since,
            mode_dwell_s=self.dwell_s(now),
            mode_flips_total=self.mode_flips_total,
            changes_total=self.changes_total,
            change_tv_total=self.change_tv_total,
            window_s=covered,
            mode_flips_recent=flips,
            changes_recent=changes,
            change_tv_recent=tv,
            mode_flips_per_minute=60.0 * flips / per,
            change_tv_per_second=tv / per,
        )
