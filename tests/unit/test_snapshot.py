"""Snapshots: round trip, corruption detected and never half-loaded, decision-log tail replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specctl.arms import parse_arm
from specctl.decisionlog import DecisionLogConfig, DecisionLogWriter
from specctl.policy.registry import make_policy
from specctl.protocol.reports import decode_step_report
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.snapshot import (
    IngestWatermarks,
    Snapshot,
    SnapshotError,
    capture,
    decode,
    encode,
    quarantine,
    read_snapshot,
    replay_log_tail,
    restore,
    write_snapshot,
)
from specctl.steps import StepBatch
from specctl.testing.random_reports import RandomReports

OFFERED = {"ngram": 4, "eagle3": 3}
ARMS = ["off", "ngram/k=2", "ngram/k=4", "eagle3/k=3"]
CLASSES = ["chat", "code", "math"]
REPORTS = RandomReports(
    tuple(ARMS),
    tuple(CLASSES),
    steps_per_report=4,
    rows_per_step=6,
    num_load_buckets=4,
    step_interval_s=0.01,
)


def make_book(**params: object) -> PolicyBook:
    policy = make_policy("specctl", {"seed": 1, "num_samples": 64, **params})
    return PolicyBook(policy, load_bucket_bounds=(8, 32, 128))


def batches(n: int, *, engine: str = "engine-1", seed: int = 0) -> list[StepBatch]:
    """``n`` validated reports of 4 steps x 6 rows, each step ending 10 ms after the last."""
    return [
        decode_step_report(report, engine_id=engine, offered=OFFERED, num_load_buckets=4)
        for report in REPORTS.reports(n, seed)
    ]


def assert_same_state(a: PolicyBook, b: PolicyBook) -> None:
    sa, sb = a.policy.state_dict(), b.policy.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        np.testing.assert_array_equal(sa[key], sb[key], err_msg=key)
    for cls in CLASSES:
        for bucket in range(a.num_load_buckets):
            ea, eb = a.policy.evidence(cls, bucket), b.policy.evidence(cls, bucket)
            assert ea == eb


def test_round_trip_restores_posteriors_overrides_and_version(tmp_path: Path) -> None:
    book = make_book()
    book.offer(OFFERED)
    marks = IngestWatermarks()
    book.add_sink(marks)
    for batch in batches(30):
        book.ingest(batch)
    book.set_override("code", parse_arm("ngram/k=2"))
    path = tmp_path / "state.snapshot"
    write_snapshot(path, capture(book, marks))
    assert not list(tmp_path.glob(".*.tmp"))

    snap = read_snapshot(path)
    assert snap is not None
    fresh = make_book()
    assert restore(fresh, snap, lambda: make_policy("specctl", {})) is None
    assert_same_state(book, fresh)
    assert fresh.overrides == {"code": parse_arm("ngram/k=2")}
    assert set(fresh.classes) == set(book.classes)
    assert fresh.offered == OFFERED
    assert fresh.version > book.version
    assert snap.watermarks == marks.latest


def test_missing_snapshot_is_none(tmp_path: Path) -> None:
    assert read_snapshot(tmp_path / "state.snapshot") is None


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: d[: len(d) // 2], "truncated"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 0xFF]), "checksum"),
        (lambda d: b"not json\n" + d, "header"),
        (lambda d: b"", "header"),
        (lambda d: d.replace(b'"schema_version": 1', b'"schema_version": 99', 1), "schema_version"),
    ],
)
def test_damaged_snapshot_is_detected_and_moved_aside(tmp_path: Path, damage, reason) -> None:
    book = make_book()
    book.offer(OFFERED)
    for batch in batches(3):
        book.ingest(batch)
    path = tmp_path / "state.snapshot"
    write_snapshot(path, capture(book, IngestWatermarks()))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(SnapshotError) as info:
        read_snapshot(path)
    assert info.value.reason == reason
    moved = quarantine(path)
    assert moved is not None and moved.name.startswith("state.snapshot.corrupt-")
    assert not path.exists() and moved.exists()


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2048), cut=st.integers(min_value=0, max_value=10_000))
def test_decode_never_raises_anything_but_snapshot_error(data: bytes, cut: int) -> None:
    good = _good_bytes()
    for candidate in (data, good[:cut], good[:cut] + data, data + good):
        try:
            decode(candidate)
        except SnapshotError:
            pass


_GOOD: list[bytes] = []


def _good_bytes() -> bytes:
    if not _GOOD:
        book = make_book()
        book.offer(OFFERED)
        for batch in batches(2):
            book.ingest(batch)
        _GOOD.append(encode(capture(book, IngestWatermarks())))
    return _GOOD[0]


def test_a_state_that_does_not_fit_is_not_half_loaded() -> None:
    book = make_book()
    book.offer(OFFERED)
    for batch in batches(5):
        book.ingest(batch)
    snap = capture(book, IngestWatermarks())
    # the configuration changed: fewer class slots than the snapshot has
    other = make_book(max_classes=8)
    problem = restore(other, snap, lambda: make_policy("specctl", {"max_classes": 8}))
    assert problem is not None and "max_classes" in problem
    prior = make_book(max_classes=8)
    prior.offer(OFFERED)
    assert np.array_equal(
        other.policy.state_dict()["acceptance_counts"],
        prior.policy.state_dict()["acceptance_counts"],
    )
    # what the book itself keeps comes back regardless
    assert set(other.classes) >= set(CLASSES)


def test_another_policy_state_is_not_loaded() -> None:
    book = make_book()
    snap = capture(book, IngestWatermarks())
    static = PolicyBook(make_policy("static", {"arm": "off"}))
    problem = restore(static, snap, lambda: make_policy("static", {"arm": "off"}))
    assert problem is not None and "specctl" in problem


def test_snapshot_rejects_object_arrays() -> None:
    snap = Snapshot(
        policy_name="x",
        version=1,
        classes=(),
        overrides={},
        offered={},
        watermarks={},
        policy_state={"bad": np.array([object()], dtype=object)},
    )
    with pytest.raises(SnapshotError):
        encode(snap)


def test_snapshot_plus_log_tail_equals_uninterrupted_state(tmp_path: Path) -> None:
    """Restore the snapshot taken at report 10, replay the log: same posteriors as at report 25."""
    log_dir = tmp_path / "log"
    live = make_book()
    live.offer(OFFERED)
    marks = IngestWatermarks()
    live.add_sink(marks)
    writer = DecisionLogWriter(DecisionLogConfig(log_dir, flush_interval_s=3600.0))
    live.add_sink(writer)
    reports = batches(25) + batches(5, engine="engine-2", seed=7)
    snap = None
    for i, batch in enumerate(reports):
        live.ingest(batch)
        if i == 9:
            snap = capture(live, marks)
            writer.flush()
    writer.close()
    assert snap is not None

    restored = make_book()
    restore(restored, decode(encode(snap)), lambda: make_policy("specctl", {}))
    result = replay_log_tail(
        restored, log_dir, IngestWatermarks(snap.watermarks), snap.created_unix_s
    )
    assert result.rows == sum(b.num_rows for b in reports[10:])
    assert result.problems == ()
    assert_same_state(live, restored)

    # without a snapshot (it was corrupt): the whole log, from the prior
    from_log = make_book()
    result = replay_log_tail(from_log, log_dir, IngestWatermarks())
    assert result.rows == sum(b.num_rows for b in reports)
    assert_same_state(live, from_log)


def test_learning_reports_together_equals_learning_them_one_by_one() -> None:
    """What the server does under load (ingest_many) learns what ingest would.

    Without forgetting (discount 1) the sufficient statistics are equal; with
    it, rows of one round are decayed together, as the steps of one report are.
    """
    from specctl.policy.thompson_config import SpecctlConfig

    params = {
        name: value
        for name, value in {"discount": 1.0, "cost_discount": 1.0, "max_rounds": 1e12}.items()
        if name in SpecctlConfig.__dataclass_fields__
    }
    one_by_one, together = make_book(**params), make_book(**params)
    for book in (one_by_one, together):
        book.offer(OFFERED)
    reports = batches(12) + batches(6, engine="engine-2", seed=5)
    for batch in reports:
        one_by_one.ingest(batch)
    for i in range(0, len(reports), 6):
        together.ingest_many(reports[i : i + 6])
    sa = one_by_one.policy.state_dict()
    sb = together.policy.state_dict()
    for key in ("acceptance_counts", "acceptance_rounds", "cost_xtx", "cost_xty", "load_steps"):
        np.testing.assert_allclose(sa[key], sb[key], rtol=1e-9, atol=1e-9, err_msg=key)
    assert set(one_by_one.classes) == set(together.classes)


def test_merged_batches_keep_every_row() -> None:
    from specctl.steps import merge_batches

    parts = batches(3) + batches(2, engine="engine-2", seed=3)
    merged = merge_batches(parts)

    def rows(b: StepBatch) -> list[tuple]:
        return sorted(
            (
                b.classes[b.class_index[i]],
                b.arms[b.arm_index[i]].name,
                int(b.drafted[i]),
                int(b.accepted[i]),
                int(b.step_index[b.request_step[i]]),
                float(b.step_time_s[b.request_step[i]]),
            )
            for i in range(b.num_rows)
        )

    assert rows(merged) == sorted(r for b in parts for r in rows(b))
    assert merged.num_steps == sum(b.num_steps for b in parts)
    assert np.array_equal(merged.arm_k, [a.k for a in np.array(merged.arms)[merged.arm_index]])


def test_decision_log_rows_of_many_reports_are_those_of_each() -> None:
    import pyarrow as pa

    from specctl.decisionlog.schema import batch_to_table, batches_to_table

    parts = batches(4) + batches(3, engine="engine-2", seed=9)
    together = batches_to_table(parts)
    one_by_one = pa.concat_tables([batch_to_table(b) for b in parts])
    assert together.schema == one_by_one.schema
    assert together.to_pylist() == one_by_one.to_pylist()


def test_a_state_the_configuration_cannot_take_does_not_stop_start_up(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from specctl.sidecar.config import StateConfig
    from specctl.sidecar.state import StateKeeper

    book = make_book()
    book.offer(OFFERED)  # two drafters
    for batch in batches(3):
        book.ingest(batch)
    write_snapshot(tmp_path / "state.snapshot", capture(book, IngestWatermarks()))
    # restarted with room for one drafter only
    small = make_book(max_drafters=1)
    registry = CollectorRegistry()
    keeper = StateKeeper(
        StateConfig(dir=str(tmp_path), decision_log=False),
        small,
        registry,
        lambda: make_policy("specctl", {"max_drafters": 1}),
    )
    keeper.open()
    assert registry.get_sample_value("specctl_snapshot_errors_total", {"reason": "policy_state"})
    keeper.close()
    assert read_snapshot(tmp_path / "state.snapshot") is not None
