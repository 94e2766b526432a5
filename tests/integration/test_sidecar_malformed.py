"""Malformed input: each answered with an error naming the field, counted, and nothing else lost."""

from __future__ import annotations

import itertools
import time

import grpc
import pytest

from specctl.api import pb
from specctl.testing.scripted_engine import ScriptedEngine, hello, report, scrape, wait_for

_classes = itertools.count()


def _still_served(engine: ScriptedEngine, sequence: int, version: int) -> int:
    """A healthy engine's report is learned from: a new class brings a new version."""
    engine.send(report(sequence, workload_class=f"other-{next(_classes)}"))
    return engine.recv_policy(min_version=version + 1).version


def _bad(field: str, value: object) -> pb.StepReport:
    message = report(2)
    if isinstance(getattr(message, field), float | int):
        setattr(message, field, value)
    else:
        getattr(message, field)[:] = value
    return message


BAD_REPORTS = [
    # (name, report, reason, text the message must contain)
    ("accepted_above_drafted", report(2, accepted=(5, 0)), "accepted", "accepted[0]=5"),
    ("huge_count", report(2, drafted=(2**32 - 1, 0)), "drafted", "drafted[0]=4294967295"),
    (
        "k_above_max",
        report(2, arms=("ngram/k=9", "off"), drafted=(0, 0), accepted=(0, 0)),
        "k_above_max",
        "k=9 exceeds the drafter's max_k=4",
    ),
    (
        "unknown_drafter",
        report(2, arms=("eagle3/k=2", "off"), drafted=(2, 0), accepted=(1, 0)),
        "unknown_arm",
        "drafter 'eagle3' was not offered",
    ),
    (
        "unknown_arm",
        report(2, arms=("bogus", "off"), drafted=(0, 0), accepted=(0, 0)),
        "unknown_arm",
        "arm_table[0]='bogus'",
    ),
    ("nan_step_time", report(2, step_time_s=float("nan")), "step_time", "step_time_s[0]=nan"),
    ("negative_step_time", report(2, step_time_s=-0.5), "step_time", "step_time_s[0]=-0.5"),
    ("negative_propensity", _bad("propensity", [-0.5, 1.0]), "propensity", "propensity[0]=-0.5"),
    ("load_bucket", report(2, load_bucket=7), "load_bucket", "load_bucket[0]=7"),
    ("short_column", _bad("accepted", [1]), "column_length", "accepted has 1 values"),
    ("sequence_back", report(1), "sequence", "sequence=1 does not follow"),
    # uint64 on the wire: values past int64 must not wrap to negative numbers
    (
        "step_index_2**63",
        _bad("step_index", [2**63]),
        "step_index",
        "step_index[0]=9223372036854775808 must be below 2**63",
    ),
    (
        "policy_version_2**64-1",
        _bad("policy_version", [2**64 - 1]),
        "policy_version",
        "policy_version[0]=18446744073709551615 must be below 2**63",
    ),
]


@pytest.mark.parametrize(
    ("bad", "reason", "text"),
    [case[1:] for case in BAD_REPORTS],
    ids=[case[0] for case in BAD_REPORTS],
)
def test_bad_report_is_rejected_naming_the_field(sidecar_factory, bad, reason, text) -> None:
    sc = sidecar_factory(policy_name="static", policy_params={"arm": "ngram/k=4"})
    engine, other = ScriptedEngine(sc.address), ScriptedEngine(sc.address)
    try:
        engine.send(hello("engine-a"))
        other.send(hello("engine-b"))
        engine.recv_policy()
        version = other.recv_policy().version
        engine.send(report(1))  # a good one first
        engine.send(bad)
        rejected = engine.recv_rejection()
        assert rejected.sequence == bad.sequence
        assert rejected.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert text in rejected.message
        wait_for(
            lambda: (
                scrape(sc.metrics_url).get(f'specctl_reports_rejected_total{{reason="{reason}"}}')
                == 1
            )
        )
        # the stream carries on, and the other engine is served throughout
        engine.send(report(3, workload_class="after"))
        # the first report's policy can still be on its way: wait for the one with "after"
        deadline = time.monotonic() + 10.0
        policy = engine.recv_policy(min_version=version + 1)
        while "after" not in {e.workload_class for e in policy.entries}:
            assert time.monotonic() < deadline, "no policy ever named the class 'after'"
            policy = engine.recv_policy(
                timeout=max(0.01, deadline - time.monotonic()), min_version=policy.version + 1
            )
        _still_served(other, 1, policy.version)
        assert scrape(sc.metrics_url)["specctl_reports_received_total"] == 4
    finally:
        engine.close()
        other.close()


def test_report_before_hello_ends_the_stream(sidecar) -> None:
    engine, other = ScriptedEngine(sidecar.address), ScriptedEngine(sidecar.address)
    try:
        other.send(hello("engine-b"))
        version = other.recv_policy().version
        engine.send(report(1))
        error = engine.wait_closed()
        assert error is not None
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "first message must be a hello, got report"
        assert scrape(sidecar.metrics_url)['specctl_reports_rejected_total{reason="no_hello"}'] == 1
        _still_served(other, 1, version)
    finally:
        engine.close()
        other.close()


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (hello(engine_id=""), "hello.engine_id=''"),
        (hello(engine_id="has space"), "hello.engine_id='has space'"),
        (hello(engine_id="x" * 200), "must be 1-128 printable"),
        (hello(drafters=[("ngram", 0)]), "hello.drafters[0].max_k=0 must be in 1..64"),
        (hello(drafters=[("ngram", 65)]), "hello.drafters[0].max_k=65"),
        (
            hello(drafters=[("ngram", 2), ("ngram", 4)]),
            "hello.drafters[1].method='ngram' is listed",
        ),
        (hello(drafters=[("Bad Name", 2)]), "hello.drafters[0].method='Bad Name'"),
        (hello(fallback_arm="eagle3/k=2"), "hello.fallback_arm='eagle3/k=2' is not among"),
        (hello(fallback_arm="sometimes"), "hello.fallback_arm: arm 'sometimes'"),
    ],
)
def test_bad_hello_ends_the_stream_naming_the_field(sidecar, message, text) -> None:
    engine = ScriptedEngine(sidecar.address)
    try:
        engine.send(message)
        error = engine.wait_closed()
        assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert text in (error.details() or "")
        assert scrape(sidecar.metrics_url)['specctl_reports_rejected_total{reason="hello"}'] == 1
        assert sidecar.run(lambda: len(sidecar.sidecar.sessions)) == 0
    finally:
        engine.close()


def test_second_hello_ends_the_stream(sidecar) -> None:
    engine = ScriptedEngine(sidecar.address)
    try:
        engine.send(hello())
        engine.recv_policy()
        engine.send(hello())
        error = engine.wait_closed()
        assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "hello after the hello" in (error.details() or "")
    finally:
        engine.close()


def test_oversized_message_is_refused_and_others_are_served(sidecar_factory) -> None:
    sc = sidecar_factory(server_max_message_bytes=64 * 1024)
    big, other = ScriptedEngine(sc.address), ScriptedEngine(sc.address)
    try:
        big.send(hello("big"))
        other.send(hello("other"))
        big.recv_policy()
        version = other.recv_policy().version
        n = 20_000  # well over 64 KiB on the wire, under gRPC's own cap of 4x that
        big.send(report(1, arms=["off"] * n, drafted=[0] * n, accepted=[0] * n))
        rejected = big.recv_rejection()
        assert rejected.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "over server.max_message_bytes=65536" in rejected.message
        wait_for(
            lambda: (
                scrape(sc.metrics_url).get(
                    'specctl_reports_rejected_total{reason="oversized"}', 0.0
                )
                == 1.0
            )
        )
        # The stream carries on: a normal report is learned without a rejection.
        big.send(report(2))
        wait_for(lambda: scrape(sc.metrics_url)["specctl_reports_received_total"] == 2.0)
        rejected_total = sum(
            v
            for k, v in scrape(sc.metrics_url).items()
            if k.startswith("specctl_reports_rejected_total")
        )
        assert rejected_total == 1.0
        n = 100_000  # beyond gRPC's cap: the transport ends the stream
        big.send(report(3, arms=["off"] * n, drafted=[0] * n, accepted=[0] * n))
        error = big.wait_closed()
        assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        _still_served(other, 1, version)
        wait_for(lambda: scrape(sc.metrics_url)["specctl_engines_connected"] == 1)
    finally:
        big.close()
        other.close()
