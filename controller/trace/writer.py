"""The engine's trace writer: every step's requests to Parquet, off the step path.

With ``SPECCTL_TRACE_DIR`` set, the engine's client hands each captured step
(:class:`specctl.engine.recorder.RawStep`) to :meth:`TraceWriter.push`,
which only appends it to a bounded deque (the oldest step is dropped, and
counted, when it is full). The writer's own background thread turns steps
into rows and writes them; it runs whether or not a sidecar is connected, so
an engine with no sidecar (running its fallback arm, the engine's own K)
records too.

Per request it keeps a per-trace number (assigned when the trace first sees
the request; the request id never leaves this module) and the tokens
committed so far, accumulated from every step's sampled tokens (prefill
included), which is the ``position`` a row carries. A request not seen for
:data:`FORGET_AFTER_STEPS` steps is forgotten.

Files: rows go into ``.trace-<id>-<segment>.parquet.tmp`` as row groups;
when the segment reaches ``rotate_rows`` request rows, ``rotate_bytes`` or
``rotate_interval_s``, or on close, the file is closed and published as
``trace-<id>-<segment>.parquet`` the way the decision log publishes its
files (:func:`specctl.decisionlog.files.publish`: fsync, rename, fsync of
the directory). A file with a trace name is always complete; a crash loses
the segment being written. Nothing here raises into the engine: a failure is
logged once and tracing stops.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from specctl.api import pb
from specctl.decisionlog.files import publish, temporary_path
from specctl.engine.config import EngineConfig
from specctl.logs import get_logger
from specctl.trace.format import REQUEST, TraceMeta, schema

log = get_logger(__name__)

FORGET_AFTER_STEPS = 8192
_FORGET_EVERY_STEPS = 1024
_NO_DRAFTS: tuple[int, ...] = ()


class TraceSource(Protocol):
    """What a captured step carries (the recorder's ``RawStep``)."""

    step_index: int
    step_time_s: float
    step_end_unix_s: float
    num_scheduled_tokens: int
    plan: Any  # .governing (class -> Choice), .policy_version, .load_bucket
    classes: list[str | None]
    num_scheduled: Mapping[str, int]
    spec_tokens: Mapping[str, Sequence[int]]
    req_id_to_index: Mapping[str, int]
    sampled_token_ids: Sequence[Sequence[int]]


def new_trace_id() -> str:
    return uuid.uuid4().hex[:12]


class TraceWriter:
    """Buffers captured steps and writes them as trace segments from its own thread."""

    def __init__(
        self,
        directory: str | Path,
        meta: TraceMeta,
        *,
        queue_size: int = 1024,
        drain_interval_s: float = 0.2,
        row_group_steps: int = 4096,
        rotate_rows: int = 1_000_000,
        rotate_bytes: int = 64 * 1024 * 1024,
        rotate_interval_s: float = 60.0,
        compression: str = "zstd",
    ) -> None:
        self.directory = Path(directory)
        if not meta.trace_id:
            meta = replace(meta, trace_id=new_trace_id())
        if not meta.started_unix_s:
            meta = replace(meta, started_unix_s=time.time())
        self.meta = meta
        self.queue: deque[Any] = deque(maxlen=queue_size)
        self.drain_interval_s = drain_interval_s
        self.row_group_steps = row_group_steps
        self.rotate_rows = rotate_rows
        self.rotate_bytes = rotate_bytes
        self.rotate_interval_s = rotate_interval_s
        self.compression = compression
        self._schema = schema(meta)
        self._wall_is_step_time = meta.step_clock == "wall"
        # counters (steps_dropped is written by the step path only)
        self.steps_dropped = 0
        self.steps_written = 0
        self.rows_written = 0
        self.files_written = 0
        self.failed = False
        # per request: [number, tokens committed, last step seen]
        self._requests: dict[str, list[int]] = {}
        self._next_request = 0
        self._last_forget = 0
        self._reset_buffer()
        # the segment being written
        self._segment = 0
        self._parquet: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._segment_rows = 0
        self._segment_started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specctl-trace", daemon=True)

    # -- step path -----------------------------------------------------------------------

    def push(self, step: Any) -> None:
        """Queue a captured step; the oldest one is dropped (and counted) when full."""
        if self.failed:
            return
        queue = self.queue
        if len(queue) == queue.maxlen:
            self.steps_dropped += 1
        queue.append(step)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        log.info(
            "specctl_trace_started", directory=str(self.directory), trace_id=self.meta.trace_id
        )

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued and finish the current segment."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        elif not self.failed:
            self._cycle(final=True)

    # -- the writer thread ---------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.drain_interval_s):
            self._cycle(final=False)
        self._cycle(final=True)

    def _cycle(self, *, final: bool) -> None:
        if self.failed:
            return
        try:
            queue = self.queue
            while queue:
                step = queue.popleft()
                if hasattr(step, "num_scheduled"):  # a captured vLLM step, not a bare record
                    self._add(step)
                if self._buffered_steps >= self.row_group_steps:  # a backlog: write as it goes
                    self._write(self._take_table())
                    if self._segment_full():
                        self._finish_segment()
            now = time.monotonic()
            started = self._segment_started
            due_time = started is not None and now - started >= self.rotate_interval_s
            if self._buffered_steps and (
                final or due_time or self._buffered_steps >= self.row_group_steps
            ):
                self._write(self._take_table())
            if self._parquet is not None and (final or due_time or self._segment_full()):
                self._finish_segment()
        except Exception as exc:  # never into the engine
            self.failed = True
            self.queue.clear()
            self._reset_buffer()
            log.exception("specctl_trace_failed", directory=str(self.directory), error=str(exc))

    # -- rows ----------------------------------------------------------------------------

    def _reset_buffer(self) -> None:
        self._steps: dict[str, list[Any]] = {f: [] for f in self._step_names()}
        self._rows: dict[str, list[Any]] = {f.name: [] for f in REQUEST}
        self._offsets: list[int] = [0]
        self._buffered_steps = 0

    @staticmethod
    def _step_names() -> list[str]:
        return [
            "step", "end_unix_s", "step_time_s", "wall_time_s", "batch_size",
            "scheduled_tokens", "decode_requests", "decode_tokens", "policy_version",
            "load_bucket",
        ]  # fmt: skip

    def _add(self, raw: TraceSource) -> None:
        plan = raw.plan
        governing = plan.governing
        spec = raw.spec_tokens
        index_of = raw.req_id_to_index
        sampled = raw.sampled_token_ids
        n_sampled = len(sampled)
        step = int(raw.step_index)
        known = self._requests
        rows = self._rows
        decode = 0
        decode_tokens = 0
        for (req_id, n), cls in zip(raw.num_scheduled.items(), raw.classes, strict=False):
            if cls is None:
                continue  # finished before the step was captured
            index = index_of.get(req_id)
            s = len(sampled[index]) if index is not None and index < n_sampled else 0
            state = known.get(req_id)
            if state is None:
                state = known[req_id] = [self._next_request, 0, step]
                self._next_request += 1
            state[2] = step
            drafted = len(spec.get(req_id, _NO_DRAFTS))
            if n == drafted + 1 and s > 0:  # a decode round (not prefill or a resumption)
                choice = governing.get(cls)
                if choice is not None and drafted <= choice.arm.k:
                    rows["arm"].append(choice.arm.name)
                    rows["k"].append(choice.arm.k)
                    rows["propensity"].append(choice.propensity)
                else:  # drafts from before the engine sampled an arm for the class
                    rows["arm"].append(None)
                    rows["k"].append(None)
                    rows["propensity"].append(None)
                rows["request"].append(state[0])
                rows["workload_class"].append(cls)
                rows["drafted"].append(drafted)
                rows["accepted"].append(min(s - 1, drafted))
                rows["position"].append(state[1])
                decode += 1
                decode_tokens += drafted + 1
            state[1] += s
        steps = self._steps
        steps["step"].append(step)
        steps["end_unix_s"].append(float(raw.step_end_unix_s))
        steps["step_time_s"].append(float(raw.step_time_s))
        wall = raw.step_time_s if self._wall_is_step_time else getattr(raw, "wall_time_s", 0.0)
        steps["wall_time_s"].append(float(wall))
        steps["batch_size"].append(len(raw.num_scheduled))
        steps["scheduled_tokens"].append(int(raw.num_scheduled_tokens))
        steps["decode_requests"].append(decode)
        steps["decode_tokens"].append(decode_tokens)
        steps["policy_version"].append(int(plan.policy_version))
        steps["load_bucket"].append(int(plan.load_bucket))
        self._offsets.append(self._offsets[-1] + decode)
        self._buffered_steps += 1
        if self._segment_started is None:
            self._segment_started = time.monotonic()
        if step - self._last_forget >= _FORGET_EVERY_STEPS:
            self._last_forget = step
            cutoff = step - FORGET_AFTER_STEPS
            for req_id in [r for r, st in known.items() if st[2] < cutoff]:
                del known[req_id]

    def _take_table(self) -> pa.Table:
        struct = pa.StructArray.from_arrays(
            [pa.array(self._rows[f.name], type=f.type) for f in REQUEST], fields=list(REQUEST)
        )
        requests_field = self._schema.field("requests")
        requests = pa.ListArray.from_arrays(
            pa.array(self._offsets, type=pa.int32()), struct, type=requests_field.type
        )
        columns = [
            pa.array(self._steps[f.name], type=f.type) for f in self._schema if f.name != "requests"
        ]
        table = pa.Table.from_arrays([*columns, requests], schema=self._schema)
        self._reset_buffer()
        return table

    # -- files ---------------------------------------------------------------------------

    def _write(self, table: pa.Table) -> None:
        if self._parquet is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._segment += 1
            self._tmp = temporary_path(self.directory / self._final_name())
            self._parquet = pq.ParquetWriter(self._tmp, self._schema, compression=self.compression)
        self._parquet.write_table(table)
        self._segment_rows += int(table.column("decode_requests").to_numpy().sum())
        self.steps_written += table.num_rows

    def _final_name(self) -> str:
        return f"trace-{self.meta.trace_id}-{self._segment:06d}.parquet"

    def _segment_full(self) -> bool:
        if self._segment_rows >= self.rotate_rows:
            return True
        tmp = self._tmp
        return tmp is not None and tmp.stat().st_size >= self.rotate_bytes

    def _finish_segment(self) -> None:
        parquet, tmp = self._parquet, self._tmp
        assert parquet is not None and tmp is not None
        parquet.close()
        final = self.directory / self._final_name()
        publish(tmp, final)
        self.rows_written += self._segment_rows
        self.files_written += 1
        self._parquet = None
        self._tmp = None
        self._segment_rows = 0
        self._segment_started = None
        log.debug("specctl_trace_segment", path=str(final))


def engine_trace_writer(config: EngineConfig, hello: pb.Hello) -> TraceWriter:
    """The writer of an engine with ``trace_dir`` set: its recording described from its hello."""
    drafter = hello.drafters[0] if len(hello.drafters) else None
    meta = TraceMeta(
        trace_id=new_trace_id(),
        model=hello.model,
        drafter=drafter.method if drafter is not None else "",
        max_k=drafter.max_k if drafter is not None else 0,
        step_clock=config.step_clock,
        vllm_version=hello.vllm_version,
        specctl_version=hello.specctl_version,
        started_unix_s=time.time(),
    )
    return TraceWriter(config.trace_dir, meta, queue_size=config.report_queue_size)
