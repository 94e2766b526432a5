"""Append-only, crash-safe decision log writer: a sink for validated step batches.

Every flush becomes a complete Parquet file (a *segment*) written atomically
(:mod:`specctl.decisionlog.files`), so a killed process loses at most the
rows buffered since the last flush and never leaves a file that cannot be
read. Segments are merged into larger files when they reach ``rotate_bytes``
or ``rotate_interval_s`` (rotation); a merged file is named after the range
of segments it covers, and readers ignore segments a merged file covers, so a
crash between writing the merged file and deleting its segments duplicates
nothing. One writer per directory, enforced with an advisory lock.
"""

from __future__ import annotations

import fcntl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry, Counter

from specctl.decisionlog.files import (
    TMP_SUFFIX,
    file_name,
    fsync_path,
    log_files_in,
    split_covered,
    write_table,
)
from specctl.decisionlog.schema import SCHEMA, batches_to_table
from specctl.logs import get_logger
from specctl.steps import StepBatch

log = get_logger(__name__)

LOCK_NAME = ".lock"


class DecisionLogMetrics:
    """``specctl_decision_log_*`` counters, on the registry of the sidecar that writes the log."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rows_written = Counter(
            "specctl_decision_log_rows",
            "Decision log rows durably written to a segment.",
            registry=registry,
        )
        self.segments_written = Counter(
            "specctl_decision_log_segments",
            "Decision log segment files written.",
            registry=registry,
        )
        self.rows_dropped = Counter(
            "specctl_decision_log_dropped_rows",
            "Decision log rows dropped, by reason (buffer_full: the disk could not keep up; "
            "write_error: a flush failed).",
            ["reason"],
            registry=registry,
        )


@dataclass(frozen=True)
class DecisionLogConfig:
    """Where and how often the decision log is written."""

    directory: Path
    # A flush writes the rows buffered so far as one segment.
    flush_interval_s: float = 1.0
    flush_rows: int = 65_536
    # Segments are merged into one file once they hold this many bytes or this much time.
    rotate_bytes: int = 64 * 1024 * 1024
    rotate_interval_s: float = 600.0
    # Beyond this many buffered rows, new rows are dropped (and counted): the
    # controller never waits on the disk.
    max_buffered_rows: int = 4_000_000
    compression: str = "zstd"

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))
        if not self.flush_interval_s > 0:
            raise ValueError(f"flush_interval_s={self.flush_interval_s} must be positive")
        for name in ("flush_rows", "rotate_bytes", "max_buffered_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if not self.rotate_interval_s > 0:
            raise ValueError(f"rotate_interval_s={self.rotate_interval_s} must be positive")


@dataclass
class _Segment:
    number: int
    path: Path
    size: int
    created_monotonic: float = field(default_factory=time.monotonic)


class DecisionLogWriter:
    """Buffers rows from :meth:`__call__` and writes them from a background thread.

    Plug an instance into the sidecar's policy book as a sink; call
    :meth:`close` on shutdown to flush and merge what is pending. ``metrics``:
    where it counts what it writes and drops (default: a registry of its own,
    which nothing exports).
    """

    def __init__(
        self, config: DecisionLogConfig, metrics: DecisionLogMetrics | None = None
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else DecisionLogMetrics(CollectorRegistry())
        directory = config.directory
        directory.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(directory / LOCK_NAME, "a")  # held until close
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise RuntimeError(
                f"decision log directory {directory} is in use by another writer"
            ) from None
        for entry in directory.iterdir():
            if entry.name.endswith(TMP_SUFFIX):
                entry.unlink()  # a flush that a crash interrupted: never renamed, never read
        files = log_files_in(directory)
        for f in split_covered(files)[1]:
            f.path.unlink()  # a segment a merge already holds: the crash came before its delete
        self._next_number = max((f.last for f in files), default=0) + 1
        self._buffer: list[StepBatch] = []  # converted to a table at flush, off the caller
        self._buffered_rows = 0
        self._pending: list[_Segment] = []
        self._buffer_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.rows_written = 0
        self.rows_dropped = 0
        self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
        self._thread.start()
        log.info("decision_log_open", directory=str(directory), next_segment=self._next_number)

    def __call__(self, batch: StepBatch) -> None:
        """Buffer a validated batch; cheap, never blocks on the disk."""
        if batch.num_rows == 0:
            return
        rows = batch.num_rows
        with self._buffer_lock:
            if self._buffered_rows + rows > self.config.max_buffered_rows:
                self.rows_dropped += rows
                self.metrics.rows_dropped.labels("buffer_full").inc(rows)
                return
            self._buffer.append(batch)
            self._buffered_rows += rows
            full = self._buffered_rows >= self.config.flush_rows
        if full:
            self._wake.set()

    def flush(self) -> None:
        """Write what is buffered as one segment, then rotate if due."""
        with self._write_lock:
            with self._buffer_lock:
                batches, self._buffer = self._buffer, []
                rows, self._buffered_rows = self._buffered_rows, 0
            if batches:
                number = self._next_number
                path = self.config.directory / file_name(number, number)
                try:
                    table = batches_to_table(batches)
                    size = write_table(table, path, self.config.compression)
                except OSError as exc:
                    self.rows_dropped += rows
                    self.metrics.rows_dropped.labels("write_error").inc(rows)
                    log.error(
                        "decision_log_write_failed", path=str(path), rows=rows, error=str(exc)
                    )
                    return
                self._next_number += 1
                self._pending.append(_Segment(number, path, size))
                self.rows_written += rows
                self.metrics.rows_written.inc(rows)
                self.metrics.segments_written.inc()
            self._rotate_if_due(force=False)

    def _rotate_if_due(self, *, force: bool) -> None:
        if len(self._pending) < 2:
            return
        size = sum(s.size for s in self._pending)
        age = time.monotonic() - self._pending[0].created_monotonic
        if not (force or size >= self.config.rotate_bytes or age >= self.config.rotate_interval_s):
            return
        segments, first, last = self._pending, self._pending[0].number, self._pending[-1].number
        path = self.config.directory / file_name(first, last)
        try:
            table = pa.concat_tables(pq.read_table(s.path, schema=SCHEMA) for s in segments)
            write_table(table, path, self.config.compression)
        except (OSError, pa.ArrowException) as exc:
            # The segments stay readable as they are; try again at the next flush.
            log.error("decision_log_rotate_failed", path=str(path), error=str(exc))
            return
        for s in segments:
            s.path.unlink(missing_ok=True)
        fsync_path(self.config.directory)
        self._pending = []
        log.info("decision_log_rotated", path=str(path), segments=len(segments))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.flush_interval_s)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # the log must never take the controller down
                log.exception("decision_log_flush_failed")

    def close(self) -> None:
        """Flush, merge pending segments into one file, release the directory."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self.flush()
        with self._write_lock:
            self._rotate_if_due(force=True)
        fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
        self._lock_file.close()
        log.info("decision_log_closed", rows_written=self.rows_written, dropped=self.rows_dropped)

    def __enter__(self) -> DecisionLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
