"""Fuzz the protocol: structured messages and random bytes, in-process and on a live server.

Bad input must end as a rejection (or, for a stream, an error status on that
stream only); never an unhandled exception, and the sidecar keeps serving the
other engines. benchmarks/fuzz_protocol.py runs the same at >= 100,000 cases.
"""

from __future__ import annotations

import threading

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specctl.api import pb, pb_grpc
from specctl.protocol.hello import HelloError, validate_hello
from specctl.protocol.reports import ReportError, decode_step_report
from specctl.testing.fuzz import (
    engine_messages,
    feed,
    fuzz_sidecar,
    garbage,
    hellos,
    start_fuzz_sidecar,
    step_reports,
)
from specctl.testing.scripted_engine import ScriptedEngine, hello, report, scrape, wait_for

FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
# One message in sixteen or so is a valid report: enough of them to count both outcomes.
MIXED = settings(FUZZ, max_examples=1000)
LIVE = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
SIDECAR, SESSION = fuzz_sidecar()


@FUZZ
@given(step_reports())
def test_decode_step_report_only_raises_report_error(message: pb.StepReport) -> None:
    try:
        batch = decode_step_report(
            message, engine_id="e", offered={"ngram": 4, "eagle3": 2}, num_load_buckets=4
        )
    except ReportError as exc:
        assert exc.reason and exc.message
        return
    assert batch.num_rows == int(batch.num_requests.sum())


@FUZZ
@given(hellos())
def test_validate_hello_only_raises_hello_error(message: pb.Hello) -> None:
    try:
        validate_hello(message)
    except HelloError as exc:
        assert str(exc).startswith("hello.")


@FUZZ
@given(engine_messages())
def test_every_engine_message_is_learned_or_rejected(message: pb.EngineMessage) -> None:
    feed(SIDECAR, SESSION, message)


def test_the_fuzzer_reaches_both_outcomes() -> None:
    # a fuzzer that never produced a valid report would test only the first check; the
    # test counts its own draws on its own sidecar, so it holds alone and in any order
    sidecar, session = fuzz_sidecar()
    outcomes: dict[str, int] = {}

    @MIXED
    @given(engine_messages())
    def count(message: pb.EngineMessage) -> None:
        outcome = feed(sidecar, session, message)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    count()
    assert outcomes.get("learned", 0) > 20 and outcomes.get("rejected", 0) > 20, outcomes


@FUZZ
@given(garbage())
def test_random_bytes_fail_to_parse_or_are_handled(data: bytes) -> None:
    try:
        message = pb.EngineMessage.FromString(data)
    except DecodeError:
        return
    feed(SIDECAR, SESSION, message)


# ---------------------------------------------------------------- a live server


@pytest.fixture(scope="module")
def live():
    import tempfile
    from pathlib import Path

    tmp = Path(tempfile.mkdtemp(prefix="specctl-"))
    sc = start_fuzz_sidecar(tmp)
    # a well-behaved engine that must be unaffected by the fuzzing
    good = ScriptedEngine(sc.address)
    good.send(hello("engine-good"))
    good.recv_policy()
    yield sc, good
    good.close()
    sc.stop()


def _raw_connect(address: str, frames: list[bytes]) -> grpc.StatusCode:
    """Send raw bytes as Connect messages; the status the stream ended with."""
    with grpc.insecure_channel(address) as channel:
        connect = channel.stream_stream(
            "/specctl.v1.SpecController/Connect",
            request_serializer=None,
            response_deserializer=None,
        )
        call = connect(iter(frames), timeout=10)
        try:
            for _ in call:
                pass
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK


@LIVE
@given(frames=st.lists(garbage(), min_size=1, max_size=4), with_hello=st.booleans())
def test_live_server_survives_garbage_streams(live, frames: list[bytes], with_hello: bool) -> None:
    sc, _ = live
    if with_hello:
        frames = [hello("engine-fuzz").SerializeToString(), *frames]
    code = _raw_connect(sc.address, frames)
    # the stream ends: cleanly, or with an error status for that stream only
    assert code in {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }, code


@LIVE
@given(messages=st.lists(engine_messages(), min_size=1, max_size=6))
def test_live_server_survives_structured_streams(live, messages) -> None:
    sc, _ = live
    frames = [hello("engine-fuzz").SerializeToString()]
    frames += [m.SerializeToString() for m in messages]
    code = _raw_connect(sc.address, frames)
    # a second hello or an empty message is a protocol violation; reports never end it
    violation = any(m.WhichOneof("kind") in (None, "hello") for m in messages)
    assert code == (grpc.StatusCode.INVALID_ARGUMENT if violation else grpc.StatusCode.OK)


def test_after_fuzzing_the_server_serves_and_holds_no_sessions(live) -> None:
    sc, good = live
    good.send(report(1))
    with grpc.insecure_channel(sc.address) as channel:
        policy = pb_grpc.SpecControllerStub(channel).GetPolicy(pb.GetPolicyRequest(), timeout=5)
    assert policy.version >= 1
    # every fuzz stream has ended: only the good engine is left
    wait_for(lambda: scrape(sc.metrics_url)["specctl_engines_connected"] == 1)
    assert sc.run(lambda: len(sc.sidecar.sessions)) == 1
    assert good.error is None
    assert threading.active_count() < 100


def test_an_engine_that_never_reads_holds_a_bounded_outbox(live) -> None:
    """4000 rejected reports to an engine that reads nothing: at most 64 wait for it."""
    from specctl.sidecar.sessions import MAX_PENDING_REJECTIONS

    sc, good = live
    bad = report(1, drafted=(4, 0), accepted=(5, 0))  # accepted above drafted: rejected
    start = scrape(sc.metrics_url)["specctl_reports_received_total"]
    frames = [hello("engine-deaf").SerializeToString()]
    for seq in range(1, 4001):
        bad.sequence = seq
        frames.append(pb.EngineMessage(report=bad).SerializeToString())
    # a receive window that does not grow: what the engine does not read stays at the sidecar
    with grpc.insecure_channel(sc.address, options=[("grpc.http2.bdp_probe", 0)]) as channel:
        connect = channel.stream_stream(
            "/specctl.v1.SpecController/Connect",
            request_serializer=None,
            response_deserializer=None,
        )
        done = threading.Event()

        def requests():  # sends everything, then keeps the stream open until the end
            yield from frames
            done.wait(60)

        call = connect(requests(), timeout=60)  # responses are never read
        wait_for(
            lambda: scrape(sc.metrics_url)["specctl_reports_received_total"] >= start + 4000,
            timeout=60,
        )

        def waiting() -> list[int]:
            return [
                len(s.outbox.rejections)
                for s in sc.sidecar.sessions
                if s.engine_id == "engine-deaf"
            ]

        pending = sc.run(waiting)
        # the stream is still open, its writes blocked by flow control: the backlog is capped
        assert len(pending) == 1 and 0 < pending[0] <= MAX_PENDING_REJECTIONS, pending
        done.set()
        call.cancel()
    wait_for(lambda: scrape(sc.metrics_url)["specctl_engines_connected"] == 1)
    assert good.error is None
