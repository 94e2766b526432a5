"""The trace format: one Parquet row per engine step, the step's requests nested in it.

A trace is what one engine recorded (:mod:`specctl.trace.writer`): a
directory of Parquet files, ``trace-<trace id>-<segment>.parquet``, each a
complete table written under a temporary name and renamed into place. One row
is one engine step; its ``requests`` column lists the requests that decoded
in it, so a file is a single table and a step in which nobody decoded still
counts in the load. Requests are numbered per trace (``request``), in the
order the trace first saw them: a trace holds no request id and no text,
only counts, the workload class and the arm.

The schema version and a JSON description of the recording (model, drafter,
its largest K, which clock ``step_time_s`` was measured on) live in the
Parquet key-value metadata under :data:`VERSION_KEY` and :data:`META_KEY`;
readers reject versions they do not know. ``docs/traces.md`` has the table.

:func:`read_trace` reads a file, a directory of segments (several recordings
in one directory are concatenated, their request numbers kept apart), or a
trace shipped with specctl by name (``controller/sim/data/traces/<name>``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SCHEMA_VERSION = 1
VERSION_KEY = b"specctl.trace.schema_version"
META_KEY = b"specctl.trace.meta"
SUPPORTED_VERSIONS = frozenset({1})
FILE_RE = re.compile(r"^trace-(?P<trace>[0-9a-f]{12})-(?P<segment>[0-9]{6})\.parquet$")
STEP_CLOCKS = ("wall", "process_cpu")
# Where traces shipped with specctl live, inside the installed package.
PACKAGED_PACKAGE = "specctl.sim"
PACKAGED_PATH = ("data", "traces")

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

REQUEST = pa.struct(
    [
        pa.field("request", pa.int64(), nullable=False),  # per-trace number, from 0
        pa.field("workload_class", pa.string(), nullable=False),
        # The arm that governed this round's drafts; null when the engine had not yet
        # sampled one for the class (its first step), with k and propensity.
        pa.field("arm", pa.string()),
        pa.field("k", pa.int32()),
        pa.field("propensity", pa.float64()),
        pa.field("drafted", pa.int32(), nullable=False),
        pa.field("accepted", pa.int32(), nullable=False),
        # Tokens the request had committed before this step, since the trace first saw it.
        pa.field("position", pa.int64(), nullable=False),
    ]
)

STEP_FIELDS = [
    pa.field("step", pa.int64(), nullable=False),  # the engine's step counter (gaps: dropped)
    pa.field("end_unix_s", pa.float64(), nullable=False),
    pa.field("step_time_s", pa.float64(), nullable=False),  # on the clock in meta.step_clock
    pa.field("wall_time_s", pa.float64(), nullable=False),
    pa.field("batch_size", pa.int32(), nullable=False),  # requests scheduled
    pa.field("scheduled_tokens", pa.int32(), nullable=False),
    pa.field("decode_requests", pa.int32(), nullable=False),  # entries in `requests`
    pa.field("decode_tokens", pa.int32(), nullable=False),  # sum of 1 + drafted over them
    pa.field("policy_version", pa.int64(), nullable=False),
    pa.field("load_bucket", pa.int32(), nullable=False),
    pa.field("requests", pa.list_(pa.field("item", REQUEST, nullable=False)), nullable=False),
]


class TraceError(ValueError):
    """A trace that cannot be read or used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class TraceMeta:
    """What was recorded, on what: stored as JSON in every segment of a recording."""

    trace_id: str  # 12 hex digits, random per recording (per engine process)
    model: str = ""
    drafter: str = ""
    max_k: int = 0  # the engine's num_speculative_tokens
    step_clock: str = "wall"  # what step_time_s measures (the engine's step_clock)
    vllm_version: str = ""
    specctl_version: str = ""
    started_unix_s: float = 0.0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> TraceMeta:
        try:
            doc = json.loads(raw)
            known = {f for f in cls.__dataclass_fields__}
            meta = cls(**{k: v for k, v in doc.items() if k in known})
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{where}: unreadable trace metadata: {exc}") from None
        if not re.fullmatch(r"[0-9a-f]{12}", str(meta.trace_id)):
            raise TraceError(f"{where}: trace_id={meta.trace_id!r} must be 12 hex digits")
        if meta.step_clock not in STEP_CLOCKS:
            raise TraceError(f"{where}: step_clock={meta.step_clock!r} is not one of {STEP_CLOCKS}")
        return meta


def schema(meta: TraceMeta) -> pa.Schema:
    """The Arrow schema of a segment, with its version and recording in the metadata."""
    return pa.schema(
        STEP_FIELDS, metadata={VERSION_KEY: str(SCHEMA_VERSION).encode(), META_KEY: meta.to_json()}
    )


@dataclass(frozen=True, eq=False)
class Trace:
    """A trace as numpy columns: S steps and R request rows (one per request per step).

    ``arm_index`` is -1 (and ``k`` -1, ``propensity`` NaN) where the arm is not
    known; ``recording`` says which entry of ``meta`` a step came from.
    """

    name: str
    meta: tuple[TraceMeta, ...]
    classes: tuple[str, ...]
    arms: tuple[str, ...]
    # step columns, length S
    recording: IntArray
    step: IntArray
    end_unix_s: FloatArray
    step_time_s: FloatArray
    wall_time_s: FloatArray
    batch_size: IntArray
    scheduled_tokens: IntArray
    decode_requests: IntArray
    decode_tokens: IntArray
    policy_version: IntArray
    load_bucket: IntArray
    # request columns, length R
    row_step: IntArray  # index into the step columns
    request: IntArray  # unique over the whole trace (recordings are kept apart)
    class_index: IntArray
    arm_index: IntArray
    k: IntArray
    propensity: FloatArray
    drafted: IntArray
    accepted: IntArray
    position: IntArray
    files: tuple[str, ...] = field(default=())

    @property
    def num_steps(self) -> int:
        return int(self.step.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.request.shape[0])

    @property
    def num_requests(self) -> int:
        return int(np.unique(self.request).shape[0]) if self.num_rows else 0

    @property
    def drafter(self) -> str:
        return self.meta[0].drafter if self.meta else ""

    @property
    def max_k(self) -> int:
        """The largest K any recording's engine could run, or any row ran."""
        recorded = max((m.max_k for m in self.meta), default=0)
        return max(recorded, int(self.k.max()) if self.num_rows else 0)

    @property
    def step_clock(self) -> str:
        clocks = {m.step_clock for m in self.meta}
        return clocks.pop() if len(clocks) == 1 else "mixed"


# --------------------------------------------------------------------------- reading


def packaged_trace_dir() -> Path:
    """The directory of traces shipped with specctl (it may not exist)."""
    base = resources.files(PACKAGED_PACKAGE)
    return Path(str(base.joinpath(*PACKAGED_PATH)))


def packaged_traces() -> list[str]:
    """Names of the traces shipped with specctl: ``<name>.parquet`` files and ``<name>/`` dirs."""
    root = packaged_trace_dir()
    if not root.is_dir():
        return []
    names = set()
    for entry in root.iterdir():
        if entry.is_dir() and any(FILE_RE.match(p.name) for p in entry.iterdir()):
            names.add(entry.name)
        elif entry.suffix == ".parquet" and not entry.name.startswith("."):
            names.add(entry.stem)
    return sorted(names)


def resolve(source: str | Path) -> tuple[str, list[Path]]:
    """A trace's name and its segment files: a file, a directory, or a packaged name."""
    path = Path(source)
    if not path.exists() and isinstance(source, str) and "/" not in source:
        root = packaged_trace_dir()
        for candidate in (root / source, root / f"{source}.parquet"):
            if candidate.exists():
                path = candidate
                break
        else:
            known = ", ".join(packaged_traces()) or "none"
            raise TraceError(
                f"trace {source!r} is not a file or directory, nor a packaged trace "
                f"(packaged: {known})"
            )
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if FILE_RE.match(p.name))
        if not files:
            raise TraceError(f"{path}: no trace segments (trace-<id>-<segment>.parquet) in it")
        return path.name, files
    if path.is_file():
        return path.stem, [path]
    raise TraceError(f"trace {str(source)!r} does not exist")


def _read_segment(path: Path) -> tuple[TraceMeta, pa.Table]:
    where = str(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{where}: not a readable Parquet file: {exc}") from None
    metadata = table.schema.metadata or {}
    raw_version = metadata.get(VERSION_KEY)
    if raw_version is None:
        raise TraceError(f"{where}: no {VERSION_KEY.decode()} in its metadata: not a trace")
    try:
        version = int(raw_version)
    except ValueError:
        raise TraceError(f"{where}: schema version {raw_version!r} is not a number") from None
    if version not in SUPPORTED_VERSIONS:
        raise TraceError(
            f"{where}: trace schema version {version} is not supported "
            f"(this specctl reads {sorted(SUPPORTED_VERSIONS)})"
        )
    meta = TraceMeta.from_json(metadata.get(META_KEY, b"{}"), where)
    expected = pa.schema(STEP_FIELDS)
    for f in expected:
        if f.name not in table.column_names:
            raise TraceError(f"{where}: missing column {f.name!r}")
        got = table.schema.field(f.name).type
        if not got.equals(f.type) and f.name != "requests":
            raise TraceError(f"{where}: column {f.name!r} is {got}, expected {f.type}")
    return meta, table.select(expected.names)


def _int(a: pa.Array | pa.ChunkedArray, fill: int = -1) -> IntArray:
    return np.asarray(pc.fill_null(a, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def _float(a: pa.Array | pa.ChunkedArray) -> FloatArray:
    return np.asarray(
        pc.fill_null(a.cast(pa.float64()), math.nan).to_numpy(zero_copy_only=False),
        dtype=np.float64,
    )


def _strings(a: pa.Array) -> tuple[IntArray, list[str]]:
    encoded = pc.dictionary_encode(a)
    codes = np.asarray(pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False))
    return codes.astype(np.int64), [str(v) for v in encoded.dictionary.to_pylist()]


def read_trace(source: str | Path | Sequence[str | Path]) -> Trace:
    """Read and validate a trace (see :func:`resolve` for what ``source`` may be).

    Several sources, or several recordings in one directory, become one trace:
    steps in order of recording then step, request numbers offset so that
    each recording's stay apart.
    """
    sources = [source] if isinstance(source, str | Path) else list(source)
    if not sources:
        raise TraceError("no trace given")
    names: list[str] = []
    files: list[Path] = []
    for s in sources:
        name, found = resolve(s)
        names.append(name)
        files.extend(found)
    by_recording: dict[str, list[tuple[int, Path, TraceMeta, pa.Table]]] = {}
    for path in files:
        meta, table = _read_segment(path)
        m = FILE_RE.match(path.name)
        segment = int(m.group("segment")) if m else 0
        by_recording.setdefault(meta.trace_id, []).append((segment, path, meta, table))
    recordings = sorted(
        by_recording.values(),
        key=lambda segs: (min(s[2].started_unix_s for s in segs), segs[0][2].trace_id),
    )
    metas: list[TraceMeta] = []
    tables: list[pa.Table] = []
    recording_of: list[IntArray] = []
    request_offset: list[int] = []
    offset = 0
    for r, segments in enumerate(recordings):
        segments.sort(key=lambda s: s[0])
        metas.append(segments[0][2])
        table = pa.concat_tables([s[3] for s in segments]).sort_by("step")
        tables.append(table)
        recording_of.append(np.full(table.num_rows, r, dtype=np.int64))
        request_offset.append(offset)
        nested = table.column("requests").combine_chunks()
        flat = nested.flatten()
        top = int(pc.max(flat.field("request")).as_py() or 0) if len(flat) else -1
        offset += top + 1
    drafters = {m.drafter for m in metas}
    if len(drafters) > 1:
        raise TraceError(
            f"the trace mixes drafters {sorted(drafters)}: replay one drafter at a time"
        )
    table = pa.concat_tables(tables)
    recording = np.concatenate(recording_of)
    nested = table.column("requests").combine_chunks()
    flat = nested.flatten()
    row_step = np.asarray(pc.list_parent_indices(nested).to_numpy(), dtype=np.int64)
    request = (
        _int(flat.field("request"))
        + np.asarray(request_offset, dtype=np.int64)[recording[row_step]]
    )
    class_index, classes = _strings(flat.field("workload_class"))
    arm_index, arms = _strings(flat.field("arm"))
    trace = Trace(
        name="+".join(names),
        meta=tuple(metas),
        classes=tuple(classes),
        arms=tuple(arms),
        recording=recording,
        step=_int(table.column("step")),
        end_unix_s=_float(table.column("end_unix_s")),
        step_time_s=_float(table.column("step_time_s")),
        wall_time_s=_float(table.column("wall_time_s")),
        batch_size=_int(table.column("batch_size")),
        scheduled_tokens=_int(table.column("scheduled_tokens")),
        decode_requests=_int(table.column("decode_requests")),
        decode_tokens=_int(table.column("decode_tokens")),
        policy_version=_int(table.column("policy_version")),
        load_bucket=_int(table.column("load_bucket")),
        row_step=row_step,
        request=request,
        class_index=class_index,
        arm_index=arm_index,
        k=_int(flat.field("k")),
        propensity=_float(flat.field("propensity")),
        drafted=_int(flat.field("drafted")),
        accepted=_int(flat.field("accepted")),
        position=_int(flat.field("position")),
        files=tuple(str(p) for p in files),
    )
    validate(trace)
    return trace


def validate(trace: Trace) -> None:
    """Raise TraceError naming the first row that breaks the format's rules."""

    def first(mask: np.ndarray) -> int:
        return int(np.flatnonzero(mask)[0])

    t = trace.step_time_s
    bad = ~np.isfinite(t) | (t <= 0)
    if bad.any():
        i = first(bad)
        raise TraceError(f"{trace.name}: step_time_s[{i}]={t[i]!r} must be finite and positive")
    w = trace.wall_time_s
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        i = first(bad)
        raise TraceError(f"{trace.name}: wall_time_s[{i}]={w[i]!r} must be finite, >= 0")
    bad = trace.decode_requests > trace.batch_size
    if bad.any():
        i = first(bad)
        raise TraceError(
            f"{trace.name}: step {trace.step[i]}: decode_requests={trace.decode_requests[i]} "
            f"exceeds batch_size={trace.batch_size[i]}"
        )
    counts = np.bincount(trace.row_step, minlength=trace.num_steps)
    bad = counts != trace.decode_requests
    if bad.any():
        i = first(bad)
        raise TraceError(
            f"{trace.name}: step {trace.step[i]} lists {counts[i]} requests, "
            f"decode_requests={trace.decode_requests[i]}"
        )
    checks: list[tuple[str, np.ndarray, str]] = [
        ("drafted", trace.drafted < 0, "must be >= 0"),
        (
            "accepted",
            (trace.accepted < 0) | (trace.accepted > trace.drafted),
            "must be in 0..drafted",
        ),
        ("k", (trace.k >= 0) & (trace.drafted > trace.k), "drafted exceeds k"),
        ("position", trace.position < 0, "must be >= 0"),
        ("workload_class", trace.class_index < 0, "must not be null"),
    ]
    for name, mask, what in checks:
        if mask.any():
            i = first(mask)
            raise TraceError(
                f"{trace.name}: request row {i} (step {trace.step[trace.row_step[i]]}): "
                f"{name} {what} (drafted={trace.drafted[i]}, accepted={trace.accepted[i]}, "
                f"k={trace.k[i]}, position={trace.position[i]})"
            )


def describe(trace: Trace) -> dict[str, Any]:
    """A short summary for logs and the bench's scenario description."""
    return {
        "name": trace.name,
        "steps": trace.num_steps,
        "requests": trace.num_requests,
        "rows": trace.num_rows,
        "classes": list(trace.classes),
        "drafter": trace.drafter,
        "max_k": trace.max_k,
        "step_clock": trace.step_clock,
        "models": sorted({m.model for m in trace.meta}),
    }
