"""Learning rounds: admitted reports wait in a bounded queue and are learned from together.

Stream readers admit each report as it arrives and queue it; one task hands
the book everything that arrived since the previous round, so under load the
policy updates once per round instead of once per report (the queue's bound
is the admission's overload limit). Not serving (a sidecar driven
in-process), a report is learned from as soon as it is admitted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from specctl.api import pb
from specctl.sidecar.admission import Admission
from specctl.sidecar.book import PolicyBook
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
    ) -> None:
        self.book = book
        self.admission = admission
        self.metrics = metrics
        self.on_change = on_change
        # admitted reports waiting for the next round, with their arrival times
        self._pending: list[tuple[StepBatch, float]] = []
        self._ready: asyncio.Event | None = None

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

    def begin(self) -> None:
        """From now on reports wait for :meth:`run` (call it on the serving loop)."""
        self._ready = asyncio.Event()

    async def run(self) -> None:
        """Learn from every report that arrived since the last round, in one round."""
        assert self._ready is not None, "begin() first"
        while True:
            await self._ready.wait()
            self._ready.clear()
            self.learn_pending()
            await asyncio.sleep(0)  # let the stream readers queue what has arrived meanwhile

    def learn_pending(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            self._learn(pending)

    def _learn(self, pending: list[tuple[StepBatch, float]]) -> None:
        changed = self.book.ingest_many([batch for batch, _ in pending])
        learned_at = time.perf_counter()
        for _, received_at in pending:
            self.metrics.policy_update_latency.observe(learned_at - received_at)
        self.book.refresh_estimates()
        if changed:
            self.on_change()
