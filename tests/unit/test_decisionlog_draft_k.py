"""The batch drafter's K per step through the decision log: a policy learned from the log
learns step cost as the live policy did, and a log written before the column still reads.

The reports come from an engine as vLLM runs one: each step verifies the drafts of the arms
chosen the step before (its rows name them) and drafts, for the whole batch, at the largest K
chosen now (its ``draft_k``), which is what its time holds. So ``draft_k`` differs from the
rows' arms' K whenever the chosen K changes between steps.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from specctl.decisionlog import DecisionLogConfig, DecisionLogWriter, read_decision_log
from specctl.decisionlog.files import file_name, write_table
from specctl.decisionlog.rows import LogRows, report_batches
from specctl.decisionlog.schema import VERSION_KEY, batches_to_table
from specctl.policy.registry import make_policy
from specctl.protocol.reports import decode_step_report, encode_step_report
from specctl.replay.data import prepare
from specctl.replay.rejection import _batches_of
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.snapshot import IngestWatermarks, replay_log_tail
from specctl.steps import StepBatch, StepRecord, load_bucket_of, merge_batches

DRAFTER = "draft_model"
OFFERED = {DRAFTER: 3}
BOUNDS = (2, 4, 8)
CLASSES = ("chat", "code")
# The columns of a version-1 log, as a writer of that version wrote them.
V1_COLUMNS = (
    "time_unix_s", "engine_id", "step_index", "workload_class", "load_bucket", "arm",
    "propensity", "drafted", "accepted", "step_time_s", "num_requests", "batch_size",
    "num_scheduled_tokens", "policy_version", "report_sequence",
)  # fmt: skip
COST_KEYS = ("cost_xtx", "cost_xty", "cost_yy", "cost_steps")


def lagged_reports(n: int, *, steps: int = 4, seed: int = 0) -> list[StepBatch]:
    """``n`` validated reports of ``steps`` steps from the lagged engine (module docstring)."""
    rng = np.random.default_rng(seed)
    chosen = dict.fromkeys(CLASSES, 0)  # the K each class chose in the previous step
    out = []
    t = 1.8e9
    for sequence in range(1, n + 1):
        records = []
        for j in range(steps):
            rows = {c: int(rng.integers(1, 4)) for c in CLASSES}
            now = {c: int(rng.integers(0, 4)) for c in CLASSES}  # K chosen now, 0: off
            draft_k = max(now.values())
            classes = [c for c in CLASSES for _ in range(rows[c])]
            ks = [chosen[c] for c in classes]
            drafted = [int(rng.integers(0, k + 1)) for k in ks]
            accepted = [int(rng.integers(0, d + 1)) for d in drafted]
            batch = len(classes)
            time_s = 0.02 + 0.001 * (batch + sum(drafted)) + 0.004 * batch * draft_k
            t += time_s
            records.append(
                StepRecord(
                    step_index=sequence * steps + j,
                    step_time_s=time_s * (1.0 + 0.05 * rng.standard_normal()),
                    batch_size=batch,
                    num_scheduled_tokens=batch + sum(drafted),
                    policy_version=1,
                    load_bucket=load_bucket_of(batch, BOUNDS),
                    step_end_unix_s=t,
                    classes=classes,
                    arms=["off" if k == 0 else f"{DRAFTER}/k={k}" for k in ks],
                    propensity=[0.25] * batch,
                    drafted=drafted,
                    accepted=accepted,
                    draft_k=draft_k,
                )
            )
            chosen = now
        out.append(
            decode_step_report(
                encode_step_report(sequence, records),
                engine_id="engine-1",
                offered=OFFERED,
                num_load_buckets=len(BOUNDS) + 1,
                batch_drafter=DRAFTER,
            )
        )
    return out


def without_draft_k(batch: StepBatch) -> StepBatch:
    """The batch as an engine that does not send ``draft_k`` reports it."""
    return dataclasses.replace(batch, batch_drafter="", draft_k=None)


def make_book() -> PolicyBook:
    return PolicyBook(
        make_policy("specctl", {"seed": 1, "num_samples": 64}), load_bucket_bounds=BOUNDS
    )


def live_book(reports: list[StepBatch], log_dir: Path | None = None) -> PolicyBook:
    """A book that learns ``reports`` as they arrive, logging them to ``log_dir`` if given."""
    book = make_book()
    book.offer(OFFERED)
    writer = None
    if log_dir is not None:
        writer = DecisionLogWriter(DecisionLogConfig(log_dir, flush_interval_s=3600.0))
        book.add_sink(writer)
    for batch in reports:
        book.ingest(batch)
    if writer is not None:
        writer.close()
    return book


def book_from_log(log_dir: Path) -> PolicyBook:
    """A book that starts with no snapshot and learns the whole log, as a restart does."""
    book = make_book()
    result = replay_log_tail(book, log_dir, IngestWatermarks())
    assert result.problems == ()
    assert result.skipped_rows == 0
    return book


def cost_evidence(book: PolicyBook) -> dict[str, np.ndarray]:
    state = book.policy.state_dict()
    return {key: np.asarray(state[key]) for key in COST_KEYS}


def assert_same_cost(a: PolicyBook, b: PolicyBook) -> None:
    ea, eb = cost_evidence(a), cost_evidence(b)
    for key in COST_KEYS:
        np.testing.assert_array_equal(ea[key], eb[key], err_msg=key)


def assert_cost_differs(a: PolicyBook, b: PolicyBook) -> None:
    assert not np.allclose(cost_evidence(a)["cost_xtx"], cost_evidence(b)["cost_xtx"])


def test_reports_draft_k_differs_from_the_rows_arms() -> None:
    """The premise of the tests below: the step's drafting K is not its rows' K."""
    batches = lagged_reports(20)
    differs = 0
    for b in batches:
        assert b.batch_drafter == DRAFTER and b.draft_k is not None
        rows_k = np.zeros(b.num_steps, dtype=np.int64)
        np.maximum.at(rows_k, b.request_step, b.arm_k)
        differs += int((rows_k != b.draft_k).sum())
    assert differs >= 0.5 * sum(b.num_steps for b in batches)


def test_a_policy_learned_from_the_log_has_the_live_policys_cost_evidence(
    tmp_path: Path,
) -> None:
    """Restart with no snapshot: the whole log's replay learns step cost against the
    reported draft_k, as the live policy did, to the bit; and the live policy's evidence
    is not what it would be without draft_k (so the log must carry it)."""
    reports = lagged_reports(40)
    log_dir = tmp_path / "decisions"
    live = live_book(reports, log_dir)

    log = read_decision_log([log_dir])
    assert log.num_rows == sum(b.num_rows for b in reports)
    logged = list(report_batches(LogRows.from_table(log.table)))
    assert [b.batch_drafter for b in logged] == [DRAFTER] * len(reports)
    for got, want in zip(logged, reports, strict=True):
        assert got.draft_k is not None and want.draft_k is not None
        np.testing.assert_array_equal(got.draft_k, want.draft_k)

    restored = book_from_log(log_dir)
    assert_same_cost(live, restored)
    # and everything else the policy learned, too
    live_state, restored_state = live.policy.state_dict(), restored.policy.state_dict()
    assert live_state.keys() == restored_state.keys()
    for key in live_state:
        np.testing.assert_array_equal(live_state[key], restored_state[key], err_msg=key)

    # the rows' arms alone (the log before schema 2) learn another cost
    assert_cost_differs(live, live_book([without_draft_k(b) for b in reports]))


def test_an_engine_without_draft_k_is_restored_as_it_was_learned(tmp_path: Path) -> None:
    """Reports without the column: logged as not reported, learned from the rows' arms."""
    reports = [without_draft_k(b) for b in lagged_reports(30, seed=3)]
    log_dir = tmp_path / "decisions"
    live = live_book(reports, log_dir)
    table = read_decision_log([log_dir]).table
    assert set(table.column("batch_drafter").to_pylist()) == {""}
    assert set(table.column("draft_k").to_pylist()) == {-1}
    assert all(b.draft_k is None for b in report_batches(LogRows.from_table(table)))
    assert_same_cost(live, book_from_log(log_dir))


def write_version_1(path: Path, reports: list[StepBatch]) -> None:
    """A log file as a writer of schema version 1 wrote it: no batch drafter, no draft_k."""
    table = batches_to_table(reports).select(list(V1_COLUMNS))
    metadata = dict(table.schema.metadata or {})
    metadata[VERSION_KEY] = b"1"
    write_table(table.replace_schema_metadata(metadata), path)


def test_a_version_1_log_still_reads_and_learns_the_old_attribution(tmp_path: Path) -> None:
    """A log written before the column: every row reads, with no batch drafter and no
    draft_k, and a policy learned from it equals a live one fed reports without draft_k."""
    reports = lagged_reports(30, seed=5)
    log_dir = tmp_path / "decisions"
    log_dir.mkdir()
    write_version_1(log_dir / file_name(1, 1), reports)

    log = read_decision_log([log_dir])
    assert log.problems == []
    assert log.num_rows == sum(b.num_rows for b in reports)
    assert set(log.table.column("batch_drafter").to_pylist()) == {""}
    assert set(log.table.column("draft_k").to_pylist()) == {-1}
    # the version-1 columns read as they were written
    written = batches_to_table(reports)
    for name in V1_COLUMNS:
        assert log.table.column(name).to_pylist() == written.column(name).to_pylist(), name
    batches = list(report_batches(LogRows.from_table(log.table)))
    assert [(b.batch_drafter, b.draft_k) for b in batches] == [("", None)] * len(reports)

    restored = book_from_log(log_dir)
    assert_same_cost(restored, live_book([without_draft_k(b) for b in reports]))
    assert_cost_differs(restored, live_book(reports))


def test_a_directory_of_both_versions_reads_each_file_as_written(tmp_path: Path) -> None:
    """A sidecar upgraded in place: its older files are version 1, its newer version 2."""
    reports = lagged_reports(20, seed=7)
    log_dir = tmp_path / "decisions"
    log_dir.mkdir()
    write_version_1(log_dir / file_name(1, 1), reports[:10])
    write_table(batches_to_table(reports[10:]), log_dir / file_name(2, 2))

    log = read_decision_log([log_dir])
    assert log.problems == []
    batches = list(report_batches(LogRows.from_table(log.table)))
    assert [b.draft_k is None for b in batches] == [True] * 10 + [False] * 10
    for got, want in zip(batches[10:], reports[10:], strict=True):
        assert got.batch_drafter == DRAFTER and got.draft_k is not None
        assert want.draft_k is not None
        np.testing.assert_array_equal(got.draft_k, want.draft_k)

    mixed = [without_draft_k(b) for b in reports[:10]] + reports[10:]
    assert_same_cost(book_from_log(log_dir), live_book(mixed))


@pytest.mark.parametrize(
    ("draft_k", "drafter", "message"),
    [(-2, DRAFTER, "draft_k=-2 is below -1"), (2, "", "draft_k=2 names no batch_drafter")],
)
def test_a_bad_draft_k_is_named_with_file_and_row(
    tmp_path: Path, draft_k: int, drafter: str, message: str
) -> None:
    table = batches_to_table(lagged_reports(2))
    values = table.column("draft_k").to_numpy().copy()
    values[5] = draft_k
    table = table.set_column(
        table.schema.get_field_index("draft_k"),
        table.schema.field("draft_k"),
        pa.array(values, pa.int32()),
    )
    if not drafter:
        names = table.column("batch_drafter").combine_chunks()
        codes = names.indices.to_numpy().copy()
        codes[5] = len(names.dictionary)
        column = pa.DictionaryArray.from_arrays(
            pa.array(codes, pa.int32()), pa.array([*names.dictionary.to_pylist(), ""])
        )
        table = table.set_column(
            table.schema.get_field_index("batch_drafter"),
            table.schema.field("batch_drafter"),
            column,
        )
    write_table(table, tmp_path / "x.parquet")
    log = read_decision_log([tmp_path / "x.parquet"], on_bad_input="skip")
    (problem,) = log.problems
    assert (problem.row, problem.rows, problem.reason) == (5, 1, "draft_k")
    assert message in problem.message
    assert log.num_rows == table.num_rows - 1


def test_replay_hands_a_learning_candidate_the_reported_draft_k(tmp_path: Path) -> None:
    """specctl replay's learning candidates get each step's draft_k: a policy learning
    every logged round as replay hands it over learns the live policy's step cost."""
    reports = lagged_reports(30, seed=11)
    log_dir = tmp_path / "decisions"
    live_book(reports, log_dir)
    data = prepare(read_decision_log([log_dir]).table)
    assert data.batch_drafters[int(data.step_batch_drafter[0])] == DRAFTER
    np.testing.assert_array_equal(
        data.step_draft_k, np.concatenate([b.draft_k for b in reports if b.draft_k is not None])
    )
    units = np.arange(data.num_units)
    (replayed,) = _batches_of(data, units, data.unit_propensity, 0)
    assert replayed.batch_drafter == DRAFTER
    assert replayed.draft_k is not None
    np.testing.assert_array_equal(replayed.draft_k, data.step_draft_k)

    def learned(batch: StepBatch) -> dict[str, np.ndarray]:
        policy = make_policy("specctl", {"seed": 1, "num_samples": 64})
        policy.set_arms(data.arms)
        policy.update_params(batch)
        state = policy.state_dict()
        return {key: np.asarray(state[key]) for key in COST_KEYS}

    # every row of each step, so the rows' shares of its time add up to the step's time
    from_replay, from_reports = learned(replayed), learned(merge_batches(reports))
    for key in COST_KEYS:
        np.testing.assert_allclose(from_replay[key], from_reports[key], rtol=1e-9, err_msg=key)
    lagged = learned(merge_batches([without_draft_k(b) for b in reports]))
    assert not np.allclose(from_replay["cost_xtx"], lagged["cost_xtx"])
