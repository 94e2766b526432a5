"""The decision log: round trip, rotation, crash safety and bad input named by file and row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from replay_support import Environment, logging_dist, run

from specctl.decisionlog import (
    SCHEMA,
    SCHEMA_VERSION,
    DecisionLogConfig,
    DecisionLogWriter,
    LogInputError,
    batch_to_table,
    read_decision_log,
)
from specctl.decisionlog.files import log_files, write_table
from specctl.decisionlog.rows import LogRows, report_batches
from specctl.decisionlog.schema import batches_to_table
from specctl.testing.scripted_engine import ScriptedEngine, hello, report, scrape, wait_for

ENV = Environment()


def _batches(n: int, steps: int = 50, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [run(ENV, logging_dist(), steps, rng, first_step=i * steps).batch for i in range(n)]


def test_round_trip_keeps_every_row_in_order(tmp_path: Path) -> None:
    batches = _batches(5)
    with DecisionLogWriter(DecisionLogConfig(tmp_path, flush_interval_s=60.0)) as writer:
        for b in batches[:3]:
            writer(b)
        writer.flush()
        for b in batches[3:]:
            writer(b)
    log = read_decision_log([tmp_path])
    expected = pa.concat_tables(batch_to_table(b) for b in batches)
    assert log.problems == []
    assert log.num_rows == sum(b.num_rows for b in batches) == writer.rows_written
    assert log.table.equals(expected)
    # close() merged the two segments into one file carrying the schema version
    assert [p.name for p in log_files([tmp_path])] == ["decisions-0000000001-0000000002.parquet"]
    metadata = pq.ParquetFile(log.files[0]).schema_arrow.metadata
    assert metadata[b"specctl.decision_log.schema_version"] == str(SCHEMA_VERSION).encode()


def test_rows_of_a_step_and_class_are_adjacent(tmp_path: Path) -> None:
    table = batch_to_table(_batches(1)[0])
    step = table.column("step_index").to_numpy()
    cls = table.column("workload_class").combine_chunks().indices.to_numpy()
    key = step * 10 + cls
    runs = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    assert len(runs) == len(np.unique(key))


def test_rotation_by_size_merges_segments_and_readers_skip_covered_ones(tmp_path: Path) -> None:
    config = DecisionLogConfig(tmp_path, flush_interval_s=60.0, rotate_bytes=20_000)
    writer = DecisionLogWriter(config)
    batches = _batches(12, steps=40)
    for b in batches:
        writer(b)
        writer.flush()
    writer.close()
    names = sorted(p.name for p in tmp_path.glob("decisions-*.parquet"))
    assert len(names) >= 2, names
    assert all(not n.endswith(".tmp") for n in os.listdir(tmp_path))
    log = read_decision_log([tmp_path])
    assert log.table.equals(pa.concat_tables(batch_to_table(b) for b in batches))
    # A crash between writing a merged file and deleting its segments leaves both:
    # readers take the merged file and ignore the segments it covers.
    first = sorted(tmp_path.glob("decisions-*.parquet"))[0]
    lo, hi = (int(x) for x in first.stem.split("-")[1:])
    for n, part in enumerate(pq.read_table(first).to_batches(max_chunksize=500)):
        if lo + n > hi:
            break
        seg = tmp_path / f"decisions-{lo + n:010d}-{lo + n:010d}.parquet"
        write_table(pa.Table.from_batches([part]), seg)
    again = read_decision_log([tmp_path])
    assert again.table.equals(log.table)
    # and the next writer finishes that merge's clean-up
    with DecisionLogWriter(DecisionLogConfig(tmp_path)):
        pass
    assert not (tmp_path / f"decisions-{lo:010d}-{lo:010d}.parquet").exists()
    assert read_decision_log([tmp_path]).table.equals(log.table)


def test_a_second_writer_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    with DecisionLogWriter(DecisionLogConfig(tmp_path)):
        with pytest.raises(RuntimeError, match="in use by another writer"):
            DecisionLogWriter(DecisionLogConfig(tmp_path))


def test_writer_flushes_on_its_own_by_time(tmp_path: Path) -> None:
    with DecisionLogWriter(DecisionLogConfig(tmp_path, flush_interval_s=0.05)) as writer:
        writer(_batches(1)[0])
        deadline = time.monotonic() + 10.0
        while not list(tmp_path.glob("decisions-*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert read_decision_log([tmp_path]).num_rows == writer.rows_written > 0


CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    from replay_support import Environment, logging_dist, run
    from specctl.decisionlog import DecisionLogConfig, DecisionLogWriter

    writer = DecisionLogWriter(
        DecisionLogConfig(sys.argv[1], flush_interval_s=3600.0, rotate_bytes=400_000)
    )
    rng = np.random.default_rng(7)
    i = 0
    while True:
        writer(run(Environment(), logging_dist(), 400, rng, first_step=i * 400).batch)
        i += 1
        writer.flush()
        print("flushed", writer.rows_written, flush=True)
    """
)


def test_a_killed_writer_leaves_a_log_that_replays(tmp_path: Path) -> None:
    """SIGKILL a writer process mid-write: every flushed batch reads back, nothing is corrupt."""
    log_dir = tmp_path / "log"
    tests_dir = Path(__file__).parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(log_dir), str(tests_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    flushed = 0
    try:
        for line in proc.stdout:
            if not line.startswith("flushed "):
                continue  # the writer's own log lines
            flushed = int(line.split()[1])
            if flushed > 60_000:  # a few rotations in: the kill lands while it writes
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert flushed > 60_000
    log = read_decision_log([log_dir])  # fails loudly on any unreadable file
    assert log.problems == []
    # All flushed rows are there; at most the one batch in flight beyond them.
    assert flushed <= log.num_rows <= flushed + 400 * 16
    rng = np.random.default_rng(7)
    expected = pa.concat_tables(
        batch_to_table(run(ENV, logging_dist(), 400, rng, first_step=i * 400).batch)
        for i in range(log.num_rows // (400 * 4) + 2)
    )
    assert log.table.equals(expected.slice(0, log.num_rows))
    # A new writer cleans up a half-written temporary file and carries on numbering.
    with DecisionLogWriter(DecisionLogConfig(log_dir)) as writer:
        writer(_batches(1)[0])
    assert not list(log_dir.glob("*.tmp"))
    assert read_decision_log([log_dir]).num_rows == log.num_rows + writer.rows_written


def _write_rows(path: Path, table: pa.Table, version: bytes = str(SCHEMA_VERSION).encode()) -> None:
    meta = dict(table.schema.metadata or {})
    meta[b"specctl.decision_log.schema_version"] = version
    pq.write_table(table.replace_schema_metadata(meta), path)


def test_corrupt_and_truncated_files_are_named(tmp_path: Path) -> None:
    good = batch_to_table(_batches(1)[0])
    _write_rows(tmp_path / "a.parquet", good)
    data = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "b.parquet").write_bytes(data[: len(data) // 2])  # truncated: no footer
    (tmp_path / "c.parquet").write_bytes(b"PAR1 this is not parquet")
    files = [tmp_path / n for n in ("a.parquet", "b.parquet", "c.parquet")]
    with pytest.raises(LogInputError, match=r"b\.parquet: not a readable Parquet file"):
        read_decision_log(files)
    log = read_decision_log(files, on_bad_input="skip")
    assert log.num_rows == good.num_rows
    assert [(Path(p.path).name, p.reason) for p in log.problems] == [
        ("b.parquet", "corrupt"),
        ("c.parquet", "corrupt"),
    ]


def test_unknown_schema_version_is_rejected_naming_the_file(tmp_path: Path) -> None:
    _write_rows(tmp_path / "future.parquet", batch_to_table(_batches(1)[0]), version=b"99")
    with pytest.raises(LogInputError, match=r"future\.parquet: decision log schema version '99'"):
        read_decision_log([tmp_path / "future.parquet"])
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "other.parquet")
    log = read_decision_log([tmp_path / "other.parquet"], on_bad_input="skip")
    assert log.num_rows == 0
    assert log.problems[0].reason == "schema_version"
    assert "not a decision log" in log.problems[0].message


@pytest.mark.parametrize("bad", [0.0, 1.5, float("nan"), -0.2])
def test_bad_propensity_is_named_with_file_and_row(tmp_path: Path, bad: float) -> None:
    table = batch_to_table(_batches(1)[0])
    prop = table.column("propensity").to_numpy().copy()
    prop[[17, 30]] = bad
    table = table.set_column(
        SCHEMA.get_field_index("propensity"), SCHEMA.field("propensity"), pa.array(prop)
    )
    _write_rows(tmp_path / "p.parquet", table)
    with pytest.raises(LogInputError) as info:
        read_decision_log([tmp_path / "p.parquet"])
    assert "p.parquet row 17: propensity=" in str(info.value)
    assert "outside (0, 1]" in str(info.value)
    log = read_decision_log([tmp_path / "p.parquet"], on_bad_input="skip")
    assert log.num_rows == table.num_rows - 2
    (problem,) = log.problems
    assert (problem.row, problem.rows, problem.reason) == (17, 2, "propensity")


def test_accepted_above_drafted_is_named(tmp_path: Path) -> None:
    table = batch_to_table(_batches(1)[0])
    drafted = table.column("drafted").to_numpy()
    row = int(np.flatnonzero(drafted == 0)[3])
    acc = table.column("accepted").to_numpy().copy()
    acc[row] = 2
    table = table.set_column(
        SCHEMA.get_field_index("accepted"), SCHEMA.field("accepted"), pa.array(acc, pa.int32())
    )
    _write_rows(tmp_path / "x.parquet", table)
    with pytest.raises(LogInputError, match=rf"x\.parquet row {row}: accepted=2 exceeds drafted=0"):
        read_decision_log([tmp_path / "x.parquet"])


def test_log_rows_become_the_batches_they_were_written_from() -> None:
    """report_batches is the inverse of batches_to_table, up to tables of only the names used."""
    batches = _batches(3)
    decoded = list(report_batches(LogRows.from_table(batches_to_table(batches))))
    assert len(decoded) == len(batches)
    for got, want in zip(decoded, batches, strict=True):
        assert (got.engine_id, got.sequence) == (want.engine_id, want.sequence)
        for name in ("step_index", "step_time_s", "load_bucket", "num_requests", "batch_size"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        order = np.lexsort((want.class_index, want.request_step))
        np.testing.assert_array_equal(got.request_step, want.request_step[order])
        for name in ("propensity", "drafted", "accepted", "arm_k"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name)[order])
        assert [got.classes[c] for c in got.class_index] == [
            want.classes[c] for c in want.class_index[order]
        ]
        assert [got.arms[a] for a in got.arm_index] == [want.arms[a] for a in want.arm_index[order]]


def test_two_sidecars_in_one_process_count_only_their_own_log_rows(
    sidecar_factory: Any, tmp_path: Path
) -> None:
    """The decision log's counters belong to each sidecar's registry, not to the process."""
    reports = {"a": 3, "b": 5}
    sidecars = {
        name: sidecar_factory(
            state_dir=str(tmp_path / name / "state"), state_log_flush_interval_s=0.05
        )
        for name in reports
    }
    for name, count in reports.items():
        engine = ScriptedEngine(sidecars[name].address)
        try:
            engine.send(hello(f"engine-{name}"))
            engine.recv_policy()
            for sequence in range(1, count + 1):
                engine.send(report(sequence))
            log_dir = tmp_path / name / "state" / "decisions"
            wait_for(lambda d=log_dir, n=count: _logged_rows(d) == 2 * n)
        finally:
            engine.close()
    for name, count in reports.items():
        samples = scrape(sidecars[name].metrics_url)
        assert samples["specctl_decision_log_rows_total"] == 2 * count, name
        assert samples["specctl_decision_log_segments_total"] >= 1, name


def _logged_rows(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    return read_decision_log([directory], on_bad_input="skip").num_rows
