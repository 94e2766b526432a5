"""The wire contract: generated code in sync, arms and step reports validated."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specctl.api import generate, pb
from specctl.arms import OFF, Arm, ArmError, arms_for, parse_arm
from specctl.protocol.reports import ReportError, decode_step_report, encode_step_report
from specctl.steps import StepRecord, load_bucket_of

OFFERED = {"ngram": 4}


def test_generated_code_matches_proto() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        generate.generate(pathlib.Path(tmp))
        fresh = pathlib.Path(tmp) / "specctl"
        committed = generate.PACKAGE_DIR / "specctl"
        fresh_files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        committed_files = sorted(
            p.relative_to(committed)
            for p in committed.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )
        assert fresh_files == committed_files
        for rel in fresh_files:
            assert (fresh / rel).read_text() == (committed / rel).read_text(), (
                f"{rel} drifted from proto/: run `make proto`"
            )


def test_generated_code_imports_with_installed_protobuf() -> None:
    import google.protobuf

    assert google.protobuf.__version__.split(".")[0] == "7"
    assert pb.StepReport(sequence=1).sequence == 1


@pytest.mark.parametrize("name", ["off", "ngram/k=1", "eagle3/k=4", "mtp/k=12"])
def test_arm_names_round_trip(name: str) -> None:
    assert parse_arm(name).name == name


@pytest.mark.parametrize(
    "name", ["", "on", "ngram", "ngram/k=0", "ngram/k=99", "NGRAM/k=2", "/k=2", "a b/k=1"]
)
def test_bad_arm_names_are_rejected(name: str) -> None:
    with pytest.raises(ArmError):
        parse_arm(name)


def test_arms_for_lists_off_first_then_every_k() -> None:
    assert [a.name for a in arms_for([("ngram", 2)])] == ["off", "ngram/k=1", "ngram/k=2"]


def _record(**overrides: object) -> StepRecord:
    base: dict[str, object] = dict(
        step_index=7,
        step_time_s=0.02,
        batch_size=3,
        num_scheduled_tokens=9,
        policy_version=2,
        load_bucket=0,
        step_end_unix_s=1.7e9,
        classes=["chat", "code", "chat"],
        arms=["ngram/k=4", "off", "ngram/k=2"],
        propensity=[0.5, 1.0, 0.25],
        drafted=[4, 0, 2],
        accepted=[3, 0, 0],
    )
    base.update(overrides)
    return StepRecord(**base)  # type: ignore[arg-type]


def _decode(report: pb.StepReport) -> object:
    return decode_step_report(report, engine_id="e1", offered=OFFERED, num_load_buckets=4)


def test_encode_decode_round_trip() -> None:
    report = encode_step_report(
        5,
        [
            _record(),
            _record(
                step_index=8,
                classes=["x"],
                arms=["off"],
                propensity=[1.0],
                drafted=[0],
                accepted=[0],
            ),
        ],
    )
    assert list(report.class_table) == ["chat", "code", "x"]
    batch = decode_step_report(report, engine_id="e1", offered=OFFERED, num_load_buckets=4)
    assert batch.num_steps == 2 and batch.num_rows == 4
    assert batch.request_step.tolist() == [0, 0, 0, 1]
    assert batch.arm_k.tolist() == [4, 0, 2, 0]
    assert [batch.classes[i] for i in batch.class_index] == ["chat", "code", "chat", "x"]
    np.testing.assert_allclose(batch.propensity, [0.5, 1.0, 0.25, 1.0])


@pytest.mark.parametrize(
    ("overrides", "reason", "needle"),
    [
        ({"accepted": [5, 0, 0]}, "accepted", "accepted[0]=5 exceeds drafted[0]=4"),
        ({"drafted": [4, 1, 2]}, "drafted", "drafted[1]=1 exceeds the K of its arm 'off'"),
        ({"arms": ["ngram/k=9", "off", "ngram/k=2"]}, "k_above_max", "max_k=4"),
        ({"arms": ["eagle3/k=2", "off", "ngram/k=2"]}, "unknown_arm", "'eagle3' was not offered"),
        ({"arms": ["turbo", "off", "ngram/k=2"]}, "unknown_arm", "arm_table[0]='turbo'"),
        ({"step_time_s": float("nan")}, "step_time", "step_time_s[0]=nan"),
        ({"step_time_s": -1.0}, "step_time", "step_time_s[0]=-1.0"),
        ({"propensity": [0.0, 1.0, 0.5]}, "propensity", "propensity[0]=0.0"),
        ({"propensity": [1.5, 1.0, 0.5]}, "propensity", "propensity[0]=1.5"),
        ({"load_bucket": 4}, "load_bucket", "load_bucket[0]=4"),
        ({"batch_size": 2}, "num_requests", "num_requests[0]=3 exceeds batch_size[0]=2"),
        ({"classes": ["", "code", ""]}, "class_name", "class_table[0]"),
    ],
)
def test_bad_reports_name_the_field(overrides: dict[str, object], reason: str, needle: str) -> None:
    report = encode_step_report(1, [_record(**overrides)])
    with pytest.raises(ReportError) as info:
        _decode(report)
    assert info.value.reason == reason
    assert needle in info.value.message


def test_negative_count_on_the_wire_is_rejected() -> None:
    # A negative int32 written into a uint32 field arrives as a huge count.
    report = encode_step_report(1, [_record()])
    raw = report.SerializeToString()
    tampered = pb.StepReport.FromString(raw)
    tampered.drafted[0] = 2**32 - 1
    with pytest.raises(ReportError) as info:
        _decode(tampered)
    assert info.value.reason == "drafted"


@pytest.mark.parametrize("column", ["step_index", "policy_version"])
@pytest.mark.parametrize("value", [2**63, 2**64 - 1])
def test_uint64_columns_past_int64_are_rejected(column: str, value: int) -> None:
    report = encode_step_report(1, [_record()])
    getattr(report, column)[0] = value
    with pytest.raises(ReportError) as info:
        _decode(report)
    assert info.value.reason == column
    assert info.value.message == f"{column}[0]={value} must be below 2**63"


def test_uint64_columns_up_to_int64_max_are_kept_exact() -> None:
    report = encode_step_report(1, [_record(step_index=2**63 - 1, policy_version=2**63 - 1)])
    batch = decode_step_report(report, engine_id="e1", offered=OFFERED, num_load_buckets=4)
    assert batch.step_index.tolist() == [2**63 - 1]
    assert batch.policy_version.tolist() == [2**63 - 1]


def test_column_length_mismatch() -> None:
    report = encode_step_report(1, [_record()])
    del report.accepted[-1]
    with pytest.raises(ReportError, match="accepted has 2 values"):
        _decode(report)
    report = encode_step_report(1, [_record()])
    report.batch_size.append(3)
    with pytest.raises(ReportError, match="batch_size has 2 values"):
        _decode(report)


def test_empty_report_is_rejected() -> None:
    with pytest.raises(ReportError, match="step_index is empty"):
        _decode(pb.StepReport(sequence=1))


@given(st.binary(max_size=512))
def test_random_bytes_never_escape_as_anything_but_report_error(data: bytes) -> None:
    try:
        report = pb.StepReport.FromString(data)
    except Exception:  # protobuf's DecodeError; the server maps it
        return
    try:
        _decode(report)
    except ReportError:
        pass


def test_load_buckets() -> None:
    bounds = [4, 16, 64]
    assert [load_bucket_of(b, bounds) for b in (1, 4, 5, 16, 64, 65, 999)] == [0, 0, 1, 1, 2, 3, 3]


def test_off_is_not_a_drafter_arm() -> None:
    assert OFF.is_off and OFF.name == "off"
    with pytest.raises(ArmError):
        Arm("ngram", 0)


def test_policies_and_replay_do_not_import_the_generated_code() -> None:
    # They work on StepBatch and Arm; only the protocol package and the gRPC edges
    # read and write protobuf messages.
    code = (
        "import importlib, pkgutil, sys\n"
        "import specctl.decisionlog, specctl.policy, specctl.replay\n"
        "for package in (specctl.policy, specctl.replay, specctl.decisionlog):\n"
        "    for m in pkgutil.iter_modules(package.__path__):\n"
        "        importlib.import_module(f'{package.__name__}.{m.name}')\n"
        "wire = ('specctl.api', 'google.protobuf')\n"
        "print(sorted(m for m in sys.modules if m.startswith(wire)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
