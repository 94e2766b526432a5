"""The sidecar's durable state: restore on start, snapshot periodically and on stop.

On start: the snapshot (if any) is checked and restored; one that is corrupt
or truncated is moved aside, counted and logged, and the sidecar starts from
the decision log or the prior instead. Then the decision log's tail (rows
after the snapshot) is replayed. While running, the book feeds the decision
log and the per-engine watermarks; a snapshot is captured on the event loop
(a copy of plain arrays) and written from a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from specctl.decisionlog import DecisionLogConfig, DecisionLogMetrics, DecisionLogWriter
from specctl.logs import get_logger
from specctl.policy.base import Policy
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.config import StateConfig
from specctl.sidecar.snapshot import (
    SNAPSHOT_NAME,
    IngestWatermarks,
    ReplayResult,
    Snapshot,
    SnapshotError,
    SnapshotMetrics,
    capture,
    quarantine,
    read_snapshot,
    replay_log_tail,
    restore,
    write_snapshot,
)

log = get_logger(__name__)

DECISION_LOG_DIR = "decisions"


class StateKeeper:
    """Snapshots and the decision log of one sidecar, under ``state.dir``."""

    def __init__(
        self,
        config: StateConfig,
        book: PolicyBook,
        registry: CollectorRegistry,
        fresh_policy: Callable[[], Policy],
    ) -> None:
        self.config = config
        self.book = book
        self.fresh_policy = fresh_policy
        self.directory = Path(config.dir)
        self.path = self.directory / SNAPSHOT_NAME
        self.log_dir = self.directory / DECISION_LOG_DIR
        self.metrics = SnapshotMetrics(registry)
        self.log_metrics = DecisionLogMetrics(registry)
        self.watermarks = IngestWatermarks()
        self.writer: DecisionLogWriter | None = None
        self.restored_from: str = "prior"

    def open(self) -> None:
        """Restore what survives, then start recording. Never raises on bad state files."""
        self.directory.mkdir(parents=True, exist_ok=True)
        snap: Snapshot | None = None
        try:
            snap = read_snapshot(self.path)
        except SnapshotError as exc:
            self.metrics.errors.labels(exc.reason).inc()
            moved = quarantine(self.path)
            log.error(
                "snapshot_unusable",
                path=str(self.path),
                reason=exc.reason,
                error=exc.message,
                moved_to=str(moved) if moved else None,
            )
        if snap is not None:
            try:
                problem = restore(self.book, snap, self.fresh_policy)
            except Exception as exc:  # a state that does not fit must not stop the sidecar
                problem = f"restore failed: {type(exc).__name__}: {exc}"
            if problem is not None:
                self.metrics.errors.labels("policy_state").inc()
                log.error("snapshot_policy_state_unused", path=str(self.path), error=problem)
            self.watermarks = IngestWatermarks(snap.watermarks)
            self.restored_from = "snapshot"
        replayed = 0
        if self.config.decision_log:
            try:
                result = replay_log_tail(
                    self.book,
                    self.log_dir,
                    self.watermarks,
                    snap.created_unix_s if snap is not None else None,
                )
            except Exception as exc:  # never crash on what the log holds
                self.metrics.errors.labels("replay").inc()
                log.exception("decision_log_replay_failed", directory=str(self.log_dir))
                result = ReplayResult(problems=(f"{type(exc).__name__}: {exc}",))
            replayed = result.rows
            self.metrics.replayed_rows.inc(result.rows)
            for problem in result.problems[:20]:
                log.warning("decision_log_replay_problem", problem=problem)
            if result.rows:
                self.restored_from += "+log"
        log.info(
            "state_restored",
            source=self.restored_from,
            policy_version=self.book.version,
            classes=len(self.book.classes),
            replayed_rows=replayed,
        )
        self.book.add_sink(self.watermarks)
        if self.config.decision_log:
            self.writer = DecisionLogWriter(
                DecisionLogConfig(self.log_dir, flush_interval_s=self.config.log_flush_interval_s),
                self.log_metrics,
            )
            self.book.add_sink(self.writer)

    def capture(self) -> Snapshot:
        return capture(self.book, self.watermarks)

    def write(self, snap: Snapshot) -> bool:
        """Write ``snap``; count and log a failure (the previous snapshot stays)."""
        try:
            write_snapshot(self.path, snap)
        except (OSError, SnapshotError) as exc:
            self.metrics.errors.labels("write").inc()
            log.error("snapshot_write_failed", path=str(self.path), error=str(exc))
            return False
        self.metrics.written.inc()
        self.metrics.last_success.set(snap.created_unix_s)
        return True

    async def run(self) -> None:
        """Snapshot every ``state.snapshot_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.config.snapshot_interval_s)
            await asyncio.to_thread(self.write, self.capture())

    def close(self) -> None:
        """A last snapshot, and the decision log flushed and closed."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.write(self.capture())
