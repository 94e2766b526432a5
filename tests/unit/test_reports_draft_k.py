"""The batch drafter's K per step: encoded when every step has it, checked on decode."""

from __future__ import annotations

import pytest

from specctl.arms import parse_arm
from specctl.protocol.hello import HelloError, hello_message, validate_hello
from specctl.protocol.reports import ReportError, decode_step_report, encode_step_report
from specctl.steps import StepRecord, merge_batches

OFFERED = {"draft_model": 3, "ngram": 3}


def _record(step: int, draft_k: int) -> StepRecord:
    return StepRecord(
        step_index=step, step_time_s=0.05, batch_size=2, num_scheduled_tokens=4,
        policy_version=1, load_bucket=0, step_end_unix_s=1e9 + step,
        classes=["a", "b"], arms=["draft_model/k=1", "ngram/k=1"], propensity=[1.0, 1.0],
        drafted=[1, 1], accepted=[0, 1], draft_k=draft_k,
    )  # fmt: skip


def _decode(report: object, batch_drafter: str = "draft_model") -> object:
    return decode_step_report(
        report, engine_id="e", offered=OFFERED, num_load_buckets=1, batch_drafter=batch_drafter
    )  # type: ignore[arg-type]


def test_draft_k_round_trips_and_is_optional() -> None:
    batch = _decode(encode_step_report(1, [_record(1, 3), _record(2, 0)]))
    assert batch.batch_drafter == "draft_model" and batch.draft_k.tolist() == [3, 0]
    # a step without it: the column is left out, as by an engine that predates it
    batch = _decode(encode_step_report(2, [_record(3, 3), _record(4, -1)]))
    assert batch.draft_k is None and batch.batch_drafter == ""
    # no batch drafter named in the hello: the column is not read
    assert _decode(encode_step_report(3, [_record(5, 2)]), batch_drafter="").draft_k is None


def test_a_bad_draft_k_column_names_the_value() -> None:
    report = encode_step_report(1, [_record(1, 3), _record(2, 1)])
    del report.draft_k[1:]
    with pytest.raises(ReportError, match=r"draft_k has 1 values, step_index has 2") as info:
        _decode(report)
    assert info.value.reason == "column_length"
    report = encode_step_report(1, [_record(1, 3), _record(2, 1)])
    report.draft_k[1] = 9
    with pytest.raises(ReportError, match=r"draft_k\[1\]=9 exceeds the batch drafter's max_k=3"):
        _decode(report)


def test_merged_batches_keep_the_k_of_the_common_batch_drafter() -> None:
    first = _decode(encode_step_report(1, [_record(1, 3)]))
    second = _decode(encode_step_report(2, [_record(2, 2), _record(3, 1)]))
    unknown = _decode(encode_step_report(3, [_record(4, -1)]))
    merged = merge_batches([first, unknown, second])
    assert merged.batch_drafter == "draft_model"
    assert merged.draft_k.tolist() == [3, -1, 2, 1]


def test_the_hello_names_an_offered_batch_drafter() -> None:
    fallback = parse_arm("draft_model/k=3")
    validate_hello(hello_message("e", OFFERED, fallback, batch_drafter="draft_model"))
    with pytest.raises(HelloError, match="batch_drafter='eagle3' is not among the drafters"):
        validate_hello(hello_message("e", OFFERED, fallback, batch_drafter="eagle3"))
