"""Hypothesis strategies for engine messages, for the fuzz tests and the fuzz benchmark.

``step_reports`` draws reports that are mostly well formed with a few fields
broken (wrong lengths, NaN, huge integers, unknown arms, bad class names), so
the validator is exercised past its first checks; ``engine_messages`` mixes
hellos, reports, statuses and empty messages; ``garbage`` is random bytes
or a valid message with bytes flipped.
"""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import strategies as st

from specctl.api import pb
from specctl.protocol.hello import HelloError, validate_hello
from specctl.protocol.reports import ROW_COLUMNS, STEP_COLUMNS
from specctl.sidecar.config import load_config
from specctl.sidecar.server import Sidecar
from specctl.sidecar.sessions import Session
from specctl.testing.sidecar_thread import SidecarThread

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
SMALL = st.integers(0, 6)
F64 = st.one_of(
    st.floats(0.0001, 1.0), st.floats(allow_nan=True, allow_infinity=True), st.just(-0.0)
)
F32 = st.one_of(st.floats(0.25, 1.0, width=32), st.floats(width=32))
NAMES = st.one_of(
    st.sampled_from(["chat", "code", "default", "a" * 64, "a" * 65, "-x", "", " ", "ü"]),
    st.text(max_size=70),
)
ARMS = st.one_of(
    st.sampled_from(["off", "ngram/k=1", "ngram/k=4", "ngram/k=5", "eagle3/k=2", "ngram/k=0"]),
    st.text(max_size=30),
)


GOOD_CLASSES = st.lists(
    st.sampled_from(["chat", "code", "math", "default"]), min_size=1, max_size=3
)
GOOD_ARMS = st.lists(
    st.sampled_from(["off", "ngram/k=1", "ngram/k=2", "ngram/k=4", "eagle3/k=2"]),
    min_size=1,
    max_size=4,
)


@st.composite
def step_reports(draw: st.DrawFn) -> pb.StepReport:
    """A report with at most one field broken (wrong length, or any value of its type)."""
    broken = draw(st.one_of(st.none(), st.sampled_from(_FIELDS)))  # half are well formed
    wrong_length = draw(st.booleans())

    def column(name: str, n: int, values: st.SearchStrategy, good: st.SearchStrategy) -> list:
        if name != broken:
            return draw(st.lists(good, min_size=n, max_size=n))
        if wrong_length:
            return draw(st.lists(values, max_size=n + 2))
        return draw(st.lists(values, min_size=n, max_size=n))

    s = draw(st.integers(1, 4))
    num_requests = column("num_requests", s, U32, st.integers(1, 4))
    r = sum(num_requests) if len(num_requests) == s and sum(num_requests) < 64 else 0
    classes = draw(st.lists(NAMES, max_size=3) if broken == "class_table" else GOOD_CLASSES)
    arms = draw(st.lists(ARMS, max_size=4) if broken == "arm_table" else GOOD_ARMS)
    n_cls, n_arms = max(len(classes), 1), max(len(arms), 1)
    return pb.StepReport(
        sequence=draw(U64),
        step_index=column("step_index", s, U64, st.integers(0, 10**6)),
        step_time_s=column("step_time_s", s, F64, st.floats(0.001, 0.5)),
        batch_size=column("batch_size", s, U32, st.integers(16, 64)),
        num_scheduled_tokens=column("num_scheduled_tokens", s, U32, st.integers(0, 512)),
        policy_version=column("policy_version", s, U64, st.integers(0, 5)),
        load_bucket=column("load_bucket", s, U32, st.integers(0, 3)),
        num_requests=num_requests,
        step_end_unix_s=column("step_end_unix_s", s, F64, st.floats(1.6e9, 1.9e9)),
        class_table=classes,
        arm_table=arms,
        class_index=column("class_index", r, U32, st.integers(0, n_cls - 1)),
        arm_index=column("arm_index", r, U32, st.integers(0, n_arms - 1)),
        propensity=column("propensity", r, F32, st.floats(0.125, 1.0, width=32)),
        drafted=column("drafted", r, U32, st.integers(0, 1)),
        accepted=column("accepted", r, U32, st.integers(0, 1)),
    )


_FIELDS = [*STEP_COLUMNS, "class_table", "arm_table", *ROW_COLUMNS]


@st.composite
def hellos(draw: st.DrawFn) -> pb.Hello:
    return pb.Hello(
        engine_id=draw(st.one_of(st.just("engine-fuzz"), st.text(max_size=140))),
        model=draw(st.text(max_size=300)),
        vllm_version=draw(st.text(max_size=20)),
        drafters=[
            pb.Drafter(method=m, max_k=k)
            for m, k in draw(
                st.lists(
                    st.tuples(st.one_of(st.just("ngram"), st.text(max_size=40)), U32), max_size=3
                )
            )
        ],
        max_batch_size=draw(U32),
        fallback_arm=draw(ARMS),
        specctl_version=draw(st.text(max_size=20)),
    )


@st.composite
def statuses(draw: st.DrawFn) -> pb.EngineStatus:
    return pb.EngineStatus(
        in_fallback=draw(st.booleans()),
        fallback_reason=draw(st.text(max_size=300)),
        reports_dropped_total=draw(U64),
        policy_age_s=draw(F64),
        policy_version=draw(U64),
    )


def engine_messages() -> st.SearchStrategy[pb.EngineMessage]:
    return st.one_of(
        step_reports().map(lambda r: pb.EngineMessage(report=r)),
        statuses().map(lambda s: pb.EngineMessage(status=s)),
        hellos().map(lambda h: pb.EngineMessage(hello=h)),
        st.just(pb.EngineMessage()),
    )


@st.composite
def garbage(draw: st.DrawFn) -> bytes:
    """Random bytes, or a real report's bytes with some flipped or cut."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=512))
    data = bytearray(pb.EngineMessage(report=draw(step_reports())).SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        if data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


def fuzz_sidecar(policy: str = "specctl") -> tuple[Sidecar, Session]:
    """A sidecar (not serving) and one engine's session, to feed messages in-process."""
    # no rate limit: every message is validated, not throttled
    config = load_config(env={}, overrides={"policy.name": policy, "server.max_reports_per_s": 1e6})
    sidecar = Sidecar(config)
    hello = pb.Hello(
        engine_id="engine-fuzz",
        drafters=[pb.Drafter(method="ngram", max_k=4), pb.Drafter(method="eagle3", max_k=2)],
        fallback_arm="off",
    )
    session = sidecar.admission.open_session(hello, peer="fuzz")
    sidecar.sessions.add(session)
    sidecar.publisher.welcome(session)
    return sidecar, session


def feed(sidecar: Sidecar, session: Session, message: pb.EngineMessage) -> str:
    """What the server does with one message on an open stream; returns the outcome.

    Bad input must come back as a rejection (or a HelloError for a hello), never
    as any other exception.
    """
    kind = message.WhichOneof("kind")
    if kind == "report":
        session.outbox.rejections.clear()
        session.last_sequence = None  # any sequence is fresh: validate the rest
        sidecar.learner.submit(session, message.report, time.perf_counter())
        session.outbox.policy = None
        return "rejected" if session.outbox.rejections else "learned"
    if kind == "status":
        sidecar.sessions.handle_status(session, message.status)
        return "status"
    if kind == "hello":
        try:
            validate_hello(message.hello)
        except HelloError:
            return "bad_hello"
        return "hello"
    return "empty"


def start_fuzz_sidecar(directory: Path) -> SidecarThread:
    """An in-process sidecar to fuzz, listening in ``directory``: the specctl policy, no
    report rate limit (fuzzed reports come as fast as they are made), errors-only logs."""
    overrides = {
        "server.listen": f"unix://{directory}/fuzz.sock",
        "server.metrics_listen": "127.0.0.1:0",
        "server.grace_period_s": 0.5,
        "server.max_reports_per_s": 1e6,
        "policy.name": "specctl",
        "log.format": "json",
        "log.level": "error",
    }
    return SidecarThread(load_config(env={}, overrides=overrides), flag_overrides=overrides).start()
