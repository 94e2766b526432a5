"""Snapshots of what the sidecar learned, so a restart (or a SIGKILL) loses almost nothing.

A snapshot is one file: a header line of JSON (format, schema version, the
SHA-256 and length of the body) and a body that is a numpy ``.npz`` archive
of plain arrays: the policy's ``state_dict()`` under ``policy.<key>`` and the
book's state (classes, overrides, offered drafters, version, per-engine
watermarks) as JSON bytes under ``book``. No pickle anywhere: the body is
loaded with ``allow_pickle=False`` and only after its checksum matched, so a
truncated or corrupt file is detected before any of it is used and is never
half-loaded.

Writes are atomic, as the decision log's (:mod:`specctl.decisionlog.files`):
a temporary file in the same directory, fsync, rename, fsync of the
directory. On start the sidecar restores the snapshot and then replays the
decision log's rows that came after it (per engine, rows whose step ended
after the last step the snapshot had seen), so what it learned up to the
last flushed log segment survives.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from specctl.arms import ArmError, parse_arm
from specctl.decisionlog.files import write_atomically
from specctl.decisionlog.rows import report_batches
from specctl.decisionlog.tail import read_log_tail
from specctl.logs import get_logger
from specctl.policy.base import Policy
from specctl.sidecar.book import PolicyBook
from specctl.steps import StepBatch, validate_class_name

log = get_logger(__name__)

FORMAT = "specctl-snapshot"
SCHEMA_VERSION = 1
SNAPSHOT_NAME = "state.snapshot"
MAX_HEADER_BYTES = 4096
# Engines a snapshot remembers a watermark for; the oldest are forgotten first.
MAX_WATERMARKS = 4096
_POLICY_PREFIX = "policy."
_BOOK_KEY = "book"


class SnapshotError(ValueError):
    """A snapshot that cannot be used; ``reason`` is a short metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Snapshot:
    """The sidecar's learned state at one instant."""

    policy_name: str
    version: int
    classes: tuple[str, ...]
    overrides: dict[str, str]
    offered: dict[str, int]
    # engine_id -> the latest step_end_unix_s the state includes
    watermarks: dict[str, float]
    # the policy's state_dict(); None in a snapshot written without one
    policy_state: dict[str, np.ndarray | str | float] | None
    created_unix_s: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.version < 0:
            raise SnapshotError("schema", f"version={self.version} is negative")
        for name in self.classes:
            problem = validate_class_name(name)
            if problem is not None:
                raise SnapshotError("schema", f"classes: {problem}")
        for cls, arm in self.overrides.items():
            try:
                parse_arm(arm)
            except ArmError as exc:
                raise SnapshotError("schema", f"overrides[{cls!r}]={arm!r}: {exc}") from None
        for drafter, k in self.offered.items():
            if not isinstance(k, int) or k < 1:
                raise SnapshotError("schema", f"offered[{drafter!r}]={k!r} is not a K >= 1")
        for engine, t in self.watermarks.items():
            if not isinstance(t, float) or not math.isfinite(t):
                raise SnapshotError("schema", f"watermarks[{engine!r}]={t!r} is not a time")


class IngestWatermarks:
    """A book sink remembering, per engine, the end time of the latest step ingested."""

    def __init__(self, initial: Mapping[str, float] | None = None) -> None:
        self.latest: dict[str, float] = dict(initial or {})

    def __call__(self, batch: StepBatch) -> None:
        if batch.num_steps == 0:
            return
        self.observe(batch.engine_id, float(batch.step_end_unix_s.max()))

    def observe(self, engine_id: str, step_end_unix_s: float) -> None:
        if step_end_unix_s > self.latest.get(engine_id, -math.inf):
            self.latest[engine_id] = step_end_unix_s
        if len(self.latest) > MAX_WATERMARKS:
            oldest = min(self.latest, key=self.latest.__getitem__)
            del self.latest[oldest]


# --------------------------------------------------------------------- capture and restore


def capture(book: PolicyBook, watermarks: IngestWatermarks) -> Snapshot:
    """The book's and its policy's state now (copies: safe to write from another thread)."""
    policy_state = dict(book.policy.state_dict())
    return Snapshot(
        policy_name=book.policy.policy_name,
        version=book.version,
        classes=book.classes,
        overrides={cls: arm.name for cls, arm in book.overrides.items()},
        offered=book.offered,
        watermarks=dict(watermarks.latest),
        policy_state=policy_state,
    )


def restore(book: PolicyBook, snapshot: Snapshot, fresh_policy: Callable[[], Policy]) -> str | None:
    """Bring ``book`` to ``snapshot``'s state; None, or why the policy's state was not used.

    The policy either loads the whole state or is replaced by ``fresh_policy()``
    (its prior): never half of it.
    """
    book.offer(snapshot.offered)
    problem: str | None = None
    if snapshot.policy_name != book.policy.policy_name:
        problem = (
            f"snapshot is of policy {snapshot.policy_name!r}, the sidecar runs "
            f"{book.policy.policy_name!r}"
        )
    elif snapshot.policy_state is not None:
        try:
            book.policy.load_state_dict(snapshot.policy_state)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            problem = f"policy state does not fit this configuration: {exc}"
            book.replace_policy(fresh_policy())
    book.restore(
        classes=snapshot.classes,
        overrides={cls: parse_arm(arm) for cls, arm in snapshot.overrides.items()},
        version=snapshot.version,
    )
    return problem


# --------------------------------------------------------------------- file format


def encode(snapshot: Snapshot) -> bytes:
    """Header line + npz body."""
    arrays: dict[str, np.ndarray] = {}
    for key, value in (snapshot.policy_state or {}).items():
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufUS":
            raise SnapshotError(
                "encode", f"policy state {key!r} has dtype {arr.dtype}: only plain arrays"
            )
        arrays[_POLICY_PREFIX + key] = arr
    book = {
        "policy_name": snapshot.policy_name,
        "version": snapshot.version,
        "classes": list(snapshot.classes),
        "overrides": snapshot.overrides,
        "offered": snapshot.offered,
        "watermarks": snapshot.watermarks,
        "has_policy_state": snapshot.policy_state is not None,
        "created_unix_s": snapshot.created_unix_s,
    }
    arrays[_BOOK_KEY] = np.frombuffer(json.dumps(book).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    body = buf.getvalue()
    header = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body_bytes": len(body),
    }
    return json.dumps(header).encode() + b"\n" + body


def decode(data: bytes) -> Snapshot:
    """Check and parse a snapshot file's bytes; SnapshotError names what is wrong."""
    newline = data.find(b"\n", 0, MAX_HEADER_BYTES)
    if newline < 0:
        raise SnapshotError("header", "no header line in the first 4096 bytes")
    try:
        header = json.loads(data[:newline])
    except (ValueError, UnicodeDecodeError) as exc:
        raise SnapshotError("header", f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SnapshotError("header", f"not a {FORMAT} file")
    if header.get("schema_version") != SCHEMA_VERSION:
        raise SnapshotError(
            "schema_version",
            f"schema_version={header.get('schema_version')!r}; this specctl reads {SCHEMA_VERSION}",
        )
    body = data[newline + 1 :]
    if len(body) != header.get("body_bytes"):
        raise SnapshotError(
            "truncated", f"body has {len(body)} bytes, the header says {header.get('body_bytes')}"
        )
    if hashlib.sha256(body).hexdigest() != header.get("body_sha256"):
        raise SnapshotError("checksum", "body does not match its SHA-256")
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        book = json.loads(arrays.pop(_BOOK_KEY).tobytes())
        policy_state: dict[str, np.ndarray | str | float] | None = None
        if book["has_policy_state"]:
            policy_state = {}
            for name, arr in arrays.items():
                if not name.startswith(_POLICY_PREFIX):
                    raise SnapshotError("schema", f"unexpected array {name!r}")
                key = name[len(_POLICY_PREFIX) :]
                policy_state[key] = arr.item() if arr.ndim == 0 else arr
        return Snapshot(
            policy_name=str(book["policy_name"]),
            version=int(book["version"]),
            classes=tuple(str(c) for c in book["classes"]),
            overrides={str(k): str(v) for k, v in dict(book["overrides"]).items()},
            offered={str(k): int(v) for k, v in dict(book["offered"]).items()},
            watermarks={str(k): float(v) for k, v in dict(book["watermarks"]).items()},
            policy_state=policy_state,
            created_unix_s=float(book["created_unix_s"]),
        )
    except SnapshotError:
        raise
    except Exception as exc:  # a body whose checksum matches but does not parse
        raise SnapshotError("schema", f"body does not parse: {type(exc).__name__}: {exc}") from None


def write_snapshot(path: Path, snapshot: Snapshot) -> int:
    """Write atomically: ``path`` is always either the previous snapshot or this one."""
    data = encode(snapshot)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, lambda f: f.write(data))


def read_snapshot(path: Path) -> Snapshot | None:
    """The snapshot at ``path``; None if there is none; SnapshotError if it is unusable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SnapshotError("read", f"cannot read {path}: {exc}") from None
    return decode(data)


def quarantine(path: Path) -> Path | None:
    """Move a bad snapshot aside as ``<name>.corrupt-<unix time>``, for a post-mortem."""
    target = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    try:
        os.replace(path, target)
    except OSError as exc:
        log.error("snapshot_quarantine_failed", path=str(path), error=str(exc))
        return None
    return target


# --------------------------------------------------------------------- decision log tail


@dataclass(frozen=True)
class ReplayResult:
    rows: int = 0
    batches: int = 0
    skipped_rows: int = 0
    problems: tuple[str, ...] = ()


def replay_log_tail(
    book: PolicyBook,
    directory: Path,
    watermarks: IngestWatermarks,
    since_unix_s: float | None = None,
) -> ReplayResult:
    """Feed ``book`` the decision log's rows newer than ``watermarks`` (per engine).

    ``since_unix_s``: the snapshot's creation time; files last written well
    before it are not read. What the tail leaves out is counted
    (:mod:`specctl.decisionlog.tail`); a report the book refuses is skipped.
    Never raises on bad data.
    """
    tail = read_log_tail(
        directory,
        after=watermarks.latest,
        num_load_buckets=book.num_load_buckets,
        since_unix_s=since_unix_s,
    )
    skipped, problems = tail.skipped_rows, tail.problems
    if tail.rows.num_rows == 0:
        return ReplayResult(skipped_rows=skipped, problems=problems)
    # the drafters the tail used must be arms of the book before it learns from them
    book.offer(tail.offered())
    replayed = batches = 0
    for batch in report_batches(tail.rows):
        try:
            book.ingest(batch)
        except Exception as exc:  # never crash on what the log held
            problems += (f"replay of {batch.engine_id} report {batch.sequence}: {exc}",)
            skipped += batch.num_rows
            continue
        watermarks(batch)
        replayed += batch.num_rows
        batches += 1
    return ReplayResult(replayed, batches, skipped, problems)


class SnapshotMetrics:
    """``specctl_snapshot*`` metrics, on the sidecar's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = Counter(
            "specctl_snapshots_written", "State snapshots written.", registry=registry
        )
        self.errors = Counter(
            "specctl_snapshot_errors",
            "Snapshots that could not be written or used, by reason (checksum, truncated, "
            "header, schema, write, policy_state, ...).",
            ["reason"],
            registry=registry,
        )
        self.last_success = Gauge(
            "specctl_snapshot_last_success_unix_seconds",
            "When the last snapshot was written.",
            registry=registry,
        )
        self.replayed_rows = Counter(
            "specctl_state_replayed_rows",
            "Decision log rows replayed into the policy at start-up.",
            registry=registry,
        )
