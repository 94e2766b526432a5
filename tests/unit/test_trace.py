"""The trace format end to end: a synthetic engine writes through the engine's writer,
the reader gets back every request's rounds, and nothing identifying is written."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from trace_support import PROMPT_LEN, SECRET_PREFIX, synthetic_trace

from specctl.api import pb
from specctl.arms import Arm
from specctl.engine.client import SidecarClient
from specctl.engine.config import ConfigError, EngineConfig
from specctl.engine.policy_view import Choice
from specctl.engine.recorder import RawStep, _Plan
from specctl.trace import format as trace_format
from specctl.trace.format import (
    FILE_RE,
    META_KEY,
    SCHEMA_VERSION,
    VERSION_KEY,
    TraceError,
    TraceMeta,
    read_trace,
)
from specctl.trace.writer import TraceWriter


def test_round_trip_keeps_every_requests_rounds(tmp_path: Path) -> None:
    syn = synthetic_trace(
        tmp_path / "t", steps=600, batch=12, swing=4, row_group_steps=64, rotate_rows=1500
    )
    files = sorted(p.name for p in syn.directory.iterdir())
    assert len(files) > 1 and all(FILE_RE.match(f) for f in files), files  # rotated, no .tmp
    trace = read_trace(syn.directory)
    assert trace.num_steps == 600
    assert trace.meta[0].drafter == "ngram" and trace.meta[0].max_k == 4
    assert trace.batch_size.tolist() == syn.batch_sizes
    assert trace.step_time_s.tolist() == pytest.approx(syn.step_times)
    assert trace.wall_time_s.tolist() == pytest.approx(syn.step_times)  # the wall clock
    # one request number per request, in the order the trace first saw them
    started = [r for r in syn.requests.values() if r.rounds]
    assert trace.num_requests == len(started)
    for number, truth in enumerate(syn.requests.values()):
        rows = trace.request == number
        got = list(
            zip(
                trace.position[rows].tolist(),
                trace.drafted[rows].tolist(),
                trace.accepted[rows].tolist(),
                strict=True,
            )
        )
        assert got == truth.rounds, truth.req_id
    # positions: the prefill's token, then accepted + 1 per round
    for truth in started:
        position = 1
        for p, _, a in truth.rounds:
            assert p == position
            position += a + 1
    arms = {trace.arms[i] for i in trace.arm_index.tolist()}
    assert arms == {"ngram/k=4"} and set(trace.k.tolist()) == {4}
    # the step's own columns agree with its requests
    assert (trace.decode_tokens <= trace.scheduled_tokens).all()
    prefill_steps = trace.scheduled_tokens - trace.decode_tokens
    assert set((prefill_steps % PROMPT_LEN).tolist()) == {0}
    # no request id reaches the files
    for f in syn.directory.iterdir():
        assert SECRET_PREFIX.encode() not in f.read_bytes()
        metadata = pq.read_schema(f).metadata
        assert metadata[VERSION_KEY] == str(SCHEMA_VERSION).encode()
        assert b'"drafter": "ngram"' in metadata[META_KEY]


def _one_step(step: int, governing: dict[str, Choice]) -> RawStep:
    return RawStep(
        step_index=step,
        step_time_s=0.01,
        step_end_unix_s=time.time(),
        num_scheduled_tokens=5,
        plan=_Plan(0.0, governing, 3, 0, 4),
        classes=["chat"],
        num_scheduled={"a-request": 5},
        spec_tokens={"a-request": [1, 2, 3, 4]},
        req_id_to_index={"a-request": 0},
        sampled_token_ids=[[1, 2, 3]],
        wall_time_s=0.02,
    )


def test_unknown_arm_is_null_and_process_clock_keeps_wall_time(tmp_path: Path) -> None:
    meta = TraceMeta(trace_id="", drafter="ngram", max_k=4, step_clock="process_cpu")
    writer = TraceWriter(tmp_path, meta)
    writer.push(_one_step(1, {}))  # the class had no arm yet: drafts at the step's K
    writer.push(_one_step(2, {"chat": Choice(Arm("ngram", 4), 0.25)}))
    writer.push(SimpleNamespace(record=lambda: None))  # a bare report record: not traced
    writer.close()
    trace = read_trace(tmp_path)
    assert trace.k.tolist() == [-1, 4]
    assert trace.arm_index[0] == -1 and trace.arms[trace.arm_index[1]] == "ngram/k=4"
    assert trace.propensity[1] == 0.25
    assert trace.position.tolist() == [0, 3]  # first seen while decoding: counted from there
    assert trace.accepted.tolist() == [2, 2]
    assert trace.step_time_s.tolist() == [0.01, 0.01]
    assert trace.wall_time_s.tolist() == [0.02, 0.02]
    assert trace.step_clock == "process_cpu"


def test_reader_refuses_what_it_cannot_trust(tmp_path: Path) -> None:
    syn = synthetic_trace(tmp_path / "t", steps=50, batch=4)
    (path,) = syn.directory.iterdir()
    table = pq.read_table(path)
    # an unknown schema version
    metadata = dict(table.schema.metadata)
    metadata[VERSION_KEY] = b"99"
    bad = tmp_path / "v99" / path.name
    bad.parent.mkdir()
    pq.write_table(table.replace_schema_metadata(metadata), bad)
    with pytest.raises(TraceError, match="schema version 99 is not supported"):
        read_trace(bad.parent)
    # not a trace at all
    plain = tmp_path / "plain" / path.name
    plain.parent.mkdir()
    pq.write_table(table.replace_schema_metadata({}), plain)
    with pytest.raises(TraceError, match="not a trace"):
        read_trace(plain)
    # a half-written segment (a crash) is never read
    (syn.directory / f".{path.name}.tmp").write_bytes(b"PAR1 torn")
    assert read_trace(syn.directory).num_steps == 50
    with pytest.raises(TraceError, match="no trace segments"):
        read_trace(tmp_path / "plain" / "..")  # a directory without segments


def test_packaged_traces_are_found_by_name(tmp_path: Path, monkeypatch) -> None:
    packaged = tmp_path / "packaged"
    synthetic_trace(packaged / "greedy-cpu", steps=60, batch=4)
    monkeypatch.setattr(trace_format, "packaged_trace_dir", lambda: packaged)
    assert trace_format.packaged_traces() == ["greedy-cpu"]
    assert read_trace("greedy-cpu").name == "greedy-cpu"
    with pytest.raises(TraceError, match=r"packaged: greedy-cpu"):
        read_trace("no-such-trace")


def test_two_recordings_in_one_directory_keep_their_requests_apart(tmp_path: Path) -> None:
    a = synthetic_trace(tmp_path / "a", steps=80, batch=4, seed=1)
    b = synthetic_trace(tmp_path / "b", steps=80, batch=4, seed=2)
    both = tmp_path / "both"
    both.mkdir()
    for f in [*a.directory.iterdir(), *b.directory.iterdir()]:
        (both / f.name).write_bytes(f.read_bytes())
    trace = read_trace(both)
    assert trace.num_steps == 160 and len(trace.meta) == 2
    assert trace.num_requests == len(a.requests) + len(b.requests)


def test_a_writer_that_cannot_write_stops_quietly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = TraceWriter(blocker / "sub", TraceMeta(trace_id="", drafter="ngram", max_k=4))
    writer.push(_one_step(1, {}))
    writer.close()  # no exception into the engine
    assert writer.failed
    writer.push(_one_step(2, {}))
    assert not writer.queue


@pytest.mark.parametrize(
    ("value", "message"),
    [("relative/dir", "must be an absolute path"), ("__FILE__", "must be an absolute path")],
)
def test_trace_dir_setting_is_checked(tmp_path: Path, value: str, message: str) -> None:
    if value == "__FILE__":
        value = str(tmp_path / "a-file")
        Path(value).write_text("")
    with pytest.raises(ConfigError, match=message):
        EngineConfig.load({"SPECCTL_TRACE_DIR": value})
    assert EngineConfig.load({"SPECCTL_TRACE_DIR": str(tmp_path / "new")}).trace_dir == str(
        tmp_path / "new"
    )


def test_engine_client_traces_without_a_sidecar(tmp_path: Path) -> None:
    config = EngineConfig(
        address=f"unix://{tmp_path}/nobody.sock", trace_dir=str(tmp_path / "trace"),
        reconnect_min_s=0.05, reconnect_max_s=0.1, engine_id="e",
    )  # fmt: skip
    hello = pb.Hello(
        engine_id="e", model="tiny", vllm_version="0.32.0", specctl_version="test",
        drafters=[pb.Drafter(method="ngram", max_k=4)], fallback_arm="ngram/k=4",
    )  # fmt: skip
    client = SidecarClient(config, hello, {"ngram": 4}, Arm("ngram", 4))
    client.start()
    for i in range(1, 6):
        client.push(_one_step(i, {"chat": Choice(Arm("ngram", 4), 1.0)}))
    client.close()
    trace = read_trace(tmp_path / "trace")
    assert trace.num_steps == 5
    assert trace.meta[0].model == "tiny" and trace.meta[0].step_clock == "wall"
    assert trace.wall_time_s.tolist() == trace.step_time_s.tolist()
