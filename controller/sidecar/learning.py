"""Learning rounds: admitted reports wait in a bounded queue and are learned from together.

Stream readers admit each report as it arrives and queue it; one task hands
the book everything that arrived since the previous round, so the policy
updates once per round instead of once per report. A round costs about the
same for one report as for several (most of it is deciding each context
again), so rounds come at most every ``policy.learn_interval_s``: a report
after a quiet spell is learned at once, and those that arrive within the
interval after a round wait for the next. Pushes go out at most every
``policy.min_push_interval_s`` anyway, so an engine sees little of the wait.
The queue's bound is the admission's overload limit; half of it starts a
round without waiting. Not serving (a sidecar driven in-process), a report is
learned from as soon as it is admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from specctl.api import pb
from specctl.sidecar.admission import MAX_PENDING_REPORTS, Admission
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.config import PolicyConfig
from specctl.sidecar.metrics import SidecarMetrics
from specctl.sidecar.sessions import Session
from specctl.steps import StepBatch


class Learner:
    """Feeds admitted reports to the book; ``on_change`` when its version moves."""

    def __init__(
        self,
        book: PolicyBook,
        admission: Admission,
        metrics: SidecarMetrics,
        on_change: Callable[[], None],
        config: PolicyConfig,
    ) -> None:
        self.book = book
        self.admission = admission
        self.metrics = metrics
        self.on_change = on_change
        self.config = config
        # admitted reports waiting for the next round, with their arrival times
        self._pending: list[tuple[StepBatch, float]] = []
        self._ready: asyncio.Event | None = None
        self._full: asyncio.Event | None = None

    def configure(self, config: PolicyConfig) -> None:
        """A reloaded policy section: the round waiting on the old ``learn_interval_s``
        starts now, and the new one applies from there."""
        self.config = config
        if self._full is not None:
            self._full.set()

    def submit(self, session: Session, report: pb.StepReport, received_at: float) -> None:
        """Admit a report (``received_at``: its ``time.perf_counter()`` arrival) and queue it."""
        batch = self.admission.admit_report(
            session, report, received_at, backlog=len(self._pending)
        )
        if batch is None:
            return
        if self._ready is None:
            self._learn([(batch, received_at)])
            return
        self._pending.append((batch, received_at))
        self._ready.set()
        if len(self._pending) >= MAX_PENDING_REPORTS // 2 and self._full is not None:
            self._full.set()

    def begin(self) -> None:
        """From now on reports wait for :meth:`run` (call it on the serving loop)."""
        self._ready = asyncio.Event()
        self._full = asyncio.Event()

    async def run(self) -> None:
        """Learn from every report that arrived since the last round, in one round, at
        most every ``learn_interval_s`` (sooner when the queue is half full)."""
        assert self._ready is not None and self._full is not None, "begin() first"
        while True:
            await self._ready.wait()
            self._ready.clear()
            self._full.clear()
            self.learn_pending()
            # read on every round: a configuration reload may change it
            interval = self.config.learn_interval_s
            if interval > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), timeout=interval)
            else:
                await asyncio.sleep(0)  # let the stream readers queue what arrived meanwhile

    def learn_pending(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            self._learn(pending)

    def _learn(self, pending: list[tuple[StepBatch, float]]) -> None:
        changed = self.book.ingest_many([batch for batch, _ in pending])
        learned_at = time.perf_counter()
        self.metrics.learning_rounds.inc()
        for _, received_at in pending:
            self.metrics.policy_update_latency.observe(learned_at - received_at)
        self.book.refresh_estimates()
        if changed:
            self.on_change()
