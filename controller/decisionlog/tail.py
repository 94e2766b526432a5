"""The log's tail: the rows a restarted sidecar has not learned from yet.

A snapshot remembers, per engine, the end of the latest step it includes; the
tail is every logged row of a later step. Rows that do not fit the running
configuration (a load bucket it does not have, a name that is not an arm, an
invalid class) are left out and counted, and bad files are reported by the
log reader and skipped: reading a tail never raises on what the log holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specctl.decisionlog.files import log_files_since
from specctl.decisionlog.reader import read_decision_log
from specctl.decisionlog.rows import LogRows
from specctl.decisionlog.schema import SCHEMA
from specctl.steps import validate_class_name


def _no_rows() -> LogRows:
    return LogRows.from_table(SCHEMA.empty_table())


@dataclass(frozen=True, eq=False)
class LogTail:
    """The rows to learn from, in log order, and what was left out."""

    rows: LogRows = field(default_factory=_no_rows)
    skipped_rows: int = 0
    problems: tuple[str, ...] = ()

    def offered(self) -> dict[str, int]:
        """Drafter -> the largest K the rows ran it at, or their steps' batch drafter
        drafted at: what must be offered to learn them."""
        out: dict[str, int] = {}
        for code in np.unique(self.rows.arm):
            arm = self.rows.arms[int(code)]
            if arm is not None and not arm.is_off:
                out[arm.drafter] = max(out.get(arm.drafter, 0), arm.k)
        rows = self.rows
        for code in np.unique(rows.batch_drafter):
            drafter = rows.batch_drafters[int(code)]
            k = int(rows.draft_k[rows.batch_drafter == code].max())
            if drafter and k > 0:
                out[drafter] = max(out.get(drafter, 0), k)
        return out


def read_log_tail(
    directory: Path,
    *,
    after: Mapping[str, float],
    num_load_buckets: int,
    since_unix_s: float | None = None,
) -> LogTail:
    """Rows of ``directory`` whose step ended after ``after[engine]`` (all of an engine
    it does not name). ``since_unix_s``: when the state ``after`` comes from was
    captured; files last written well before it are not read."""
    if not directory.is_dir():
        return LogTail()
    files = log_files_since(directory, since_unix_s)
    if not files:
        return LogTail()
    logged = read_decision_log(files, on_bad_input="skip")
    problems = tuple(str(p) for p in logged.problems)
    if logged.num_rows == 0:
        return LogTail(problems=problems)
    rows = LogRows.from_table(logged.table)
    mark = np.array([after.get(e, -math.inf) for e in rows.engines], dtype=np.float64)
    newer = rows.time_unix_s > mark[rows.engine]
    keep = newer & (rows.load_bucket < num_load_buckets)
    keep &= np.array([a is not None for a in rows.arms], dtype=bool)[rows.arm]
    bad_class = np.array([validate_class_name(c) is not None for c in rows.classes], dtype=bool)
    keep &= ~bad_class[rows.workload_class]
    skipped = int(newer.sum() - keep.sum())
    return LogTail(rows.take(np.flatnonzero(keep)), skipped, problems)
