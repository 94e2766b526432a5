"""Decision stability: TV movement and mode flips per context, in the book, on /metrics,
through GetEvidence and in `specctl evidence`."""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence

import grpc
import numpy as np
import pytest

from specctl.api import pb, pb_grpc
from specctl.arms import OFF, Arm, parse_arm
from specctl.cli import main
from specctl.policy.base import Decision, Policy
from specctl.policy.registry import make_policy
from specctl.policy.state import PolicyState, StateReader, StateValue, state_header
from specctl.protocol.policy_messages import (
    evidence_message,
    fill_stability,
    stability_by_context,
    stability_stats,
)
from specctl.protocol.reports import decode_step_report, encode_step_report
from specctl.sidecar.book import PolicyBook, UnknownClassError
from specctl.sidecar.config import load_config
from specctl.sidecar.metrics import SidecarMetrics
from specctl.sidecar.stability import DecisionStability, total_variation
from specctl.steps import StepBatch, StepRecord
from specctl.testing.scripted_engine import (
    ScriptedEngine,
    hello,
    report,
    reports_learned,
    scrape,
    wait_for,
)
from specctl.testing.sidecar_thread import SidecarThread

OFFERED = {"ngram": 4}
NGRAM = parse_arm("ngram/k=4")


def _d(probabilities: dict[str, float]) -> Decision:
    return Decision(
        tuple(parse_arm(a) for a in probabilities), np.array(list(probabilities.values()))
    )


def _state(tracker: DecisionStability) -> dict[str, object]:
    """Everything a tracker holds, for checking that reads leave it alone."""
    return {name: copy.copy(getattr(tracker, name)) for name in DecisionStability.__slots__}


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------- the tracker


def test_a_steady_distribution_never_flips_and_barely_moves() -> None:
    tracker = DecisionStability(_d({"off": 0.2, "ngram/k=4": 0.8}), 0.0)
    rng = np.random.default_rng(0)
    for i in range(1, 200):
        p = 0.8 + float(rng.uniform(-0.02, 0.02))
        assert not tracker.observe(_d({"off": 1 - p, "ngram/k=4": p}), float(i))
    stats = tracker.stats(200.0)
    assert stats.mode == NGRAM and stats.mode_flips_total == 0 and stats.mode_flips_recent == 0
    assert stats.mode_dwell_s == 200.0
    assert stats.changes_total == 199
    assert 0.0 < stats.change_tv_total / stats.changes_total <= 0.04
    assert stats.change_tv_per_second <= 0.04


def test_the_same_distribution_again_is_no_change() -> None:
    tracker = DecisionStability(_d({"off": 0.5, "ngram/k=4": 0.5}), 0.0)
    for i in range(10):
        tracker.observe(_d({"off": 0.5, "ngram/k=4": 0.5}), float(i))
    stats = tracker.stats(10.0)
    assert (stats.changes_total, stats.change_tv_total, stats.mode_flips_total) == (0, 0.0, 0)


def test_alternating_modes_are_counted_exactly() -> None:
    a, b = _d({"off": 0.9, "ngram/k=4": 0.1}), _d({"off": 0.1, "ngram/k=4": 0.9})
    tracker = DecisionStability(a, 0.0)
    flips = [tracker.observe(b if i % 2 else a, 10.0 * i) for i in range(1, 8)]
    assert flips == [True] * 7
    stats = tracker.stats(75.0)
    assert stats.mode_flips_total == stats.mode_flips_recent == 7
    assert stats.changes_total == stats.changes_recent == 7
    assert stats.change_tv_total == pytest.approx(7 * 0.8)
    assert stats.mode == NGRAM  # the 7th decision is b
    assert stats.mode_since == 70.0 and stats.mode_dwell_s == 5.0
    assert stats.window_s == 75.0
    assert stats.mode_flips_per_minute == pytest.approx(7 / 75 * 60)
    assert stats.change_tv_per_second == pytest.approx(7 * 0.8 / 75)


def test_arms_trading_places_around_a_tie_do_not_flip() -> None:
    tracker = DecisionStability(_d({"off": 0.48, "ngram/k=4": 0.52}), 0.0, flip_margin=0.1)
    for i in range(1, 20):
        p = 0.47 if i % 2 else 0.53  # the argmax changes every time, by 0.06
        assert not tracker.observe(_d({"off": 1 - p, "ngram/k=4": p}), float(i))
    assert tracker.mode == NGRAM and tracker.mode_flips_total == 0
    assert tracker.changes_total == 19
    # a clear win takes over
    assert tracker.observe(_d({"off": 0.56, "ngram/k=4": 0.44}), 20.0)
    assert tracker.mode == OFF
    # with no margin, the raw argmax is the mode
    raw = DecisionStability(_d({"off": 0.48, "ngram/k=4": 0.52}), 0.0, flip_margin=0.0)
    assert raw.observe(_d({"off": 0.53, "ngram/k=4": 0.47}), 1.0)


def test_a_mode_that_leaves_the_distribution_is_replaced() -> None:
    k2 = parse_arm("ngram/k=2")
    tracker = DecisionStability(Decision.point(NGRAM), 0.0)
    # twelve arms, none near the margin above the (absent) mode
    arms = (OFF, *(Arm("eagle3", k) for k in range(1, 12)))
    spread = np.full(12, 1 / 12)
    assert tracker.observe(Decision(arms, spread), 1.0)
    assert tracker.mode == OFF  # argmax, first of the ties
    assert tracker.observe(Decision.point(k2), 2.0)
    assert total_variation(Decision.point(k2), Decision.point(NGRAM)) == 1.0


def test_the_recent_window_slides_and_totals_stay() -> None:
    a, b = _d({"off": 1.0}), _d({"ngram/k=4": 1.0})
    tracker = DecisionStability(a, 0.0, window_s=600.0, window_slots=10)
    tracker.observe(b, 30.0)
    tracker.observe(a, 90.0)
    tracker.observe(b, 400.0)
    at = tracker.stats(599.0)
    assert at.mode_flips_recent == 3 and at.window_s == 599.0
    # at 650 s the window starts at 60 s (slots of a minute): the flip at 30 s has left it
    later = tracker.stats(650.0)
    assert later.mode_flips_recent == 2 and later.window_s == 590.0
    assert later.change_tv_recent == 2.0
    # long after, nothing is recent; totals and the mode stay
    quiet = tracker.stats(5000.0)
    assert (quiet.mode_flips_recent, quiet.changes_recent, quiet.change_tv_recent) == (0, 0, 0.0)
    assert quiet.mode_flips_per_minute == 0.0
    assert quiet.mode_flips_total == 3 and quiet.mode == NGRAM and quiet.mode_dwell_s == 4600.0
    # a slot reused an interval later starts empty
    tracker.observe(a, 5000.0)
    assert tracker.stats(5001.0).mode_flips_recent == 1


def test_a_young_context_reports_rates_over_at_least_one_slot() -> None:
    tracker = DecisionStability(_d({"off": 1.0}), 100.0)
    tracker.observe(_d({"ngram/k=4": 1.0}), 100.5)
    stats = tracker.stats(101.0)
    assert stats.window_s == 1.0
    assert stats.mode_flips_per_minute == 1.0  # one flip over a minute, not over a second


def test_reading_stats_changes_nothing() -> None:
    tracker = DecisionStability(_d({"off": 1.0}), 0.0)
    tracker.observe(_d({"ngram/k=4": 1.0}), 100.0)
    before = _state(tracker)
    # reads at times that would reuse ring slots if a read wrote them
    first = [tracker.stats(t) for t in (100.0, 700.0, 10_000.0)]
    assert _state(tracker) == before
    assert [tracker.stats(t) for t in (100.0, 700.0, 10_000.0)] == first


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="flip_margin"):
        DecisionStability(_d({"off": 1.0}), 0.0, flip_margin=1.5)
    with pytest.raises(ValueError, match="window_s"):
        DecisionStability(_d({"off": 1.0}), 0.0, window_s=0.0)


def test_stats_round_trip_through_the_proto() -> None:
    tracker = DecisionStability(_d({"off": 1.0}), 10.0)
    tracker.observe(_d({"off": 0.2, "ngram/k=4": 0.8}), 20.0)
    stats = tracker.stats(30.0)
    message = pb.DecisionStability()
    fill_stability(message, stats)
    assert stability_stats(message) == stats


# ---------------------------------------------------------------------- in the book


class SettablePolicy(Policy):
    """The test's distribution in one context (chat at load bucket 0); off elsewhere."""

    policy_name = "settable"

    def __init__(self) -> None:
        self.distribution: dict[str, float] = {"off": 1.0}

    def set_arms(self, arms: Sequence[Arm]) -> None:
        pass

    def update_params(self, batch: StepBatch) -> None:
        pass

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        if (workload_class, load_bucket) != ("chat", 0):
            return _d({"off": 1.0})
        return _d(self.distribution)

    def state_dict(self) -> PolicyState:
        return state_header(self.policy_name, self.state_version)

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        StateReader(state, self.policy_name, self.state_version)


def _batch(workload_class: str = "chat", seq: int = 1, accepted: int = 3) -> StepBatch:
    step = StepRecord(
        step_index=seq,
        step_time_s=0.02,
        batch_size=2,
        num_scheduled_tokens=6,
        policy_version=1,
        load_bucket=0,
        step_end_unix_s=1.0,
        classes=[workload_class] * 2,
        arms=["ngram/k=4", "off"],
        propensity=[1.0, 1.0],
        drafted=[4, 0],
        accepted=[accepted, 0],
    )
    return decode_step_report(
        encode_step_report(seq, [step]), engine_id="e", offered=OFFERED, num_load_buckets=4
    )


def _sample(book: PolicyBook, name: str, cls: str = "chat", bucket: str = "0") -> float | None:
    metrics = SidecarMetrics()
    metrics.watch(book)
    return metrics.registry.get_sample_value(name, {"workload_class": cls, "load_bucket": bucket})


def test_the_book_tracks_what_it_publishes_and_exports_it() -> None:
    clock = Clock()
    policy = SettablePolicy()
    book = PolicyBook(policy, clock=clock, push_threshold=0.05)
    book.offer(OFFERED)
    book.ingest(_batch(seq=1))  # class chat appears, off everywhere
    for seq in range(2, 9):
        clock.now += 30.0
        on = seq % 2 == 0
        policy.distribution = (
            {"off": 0.1, "ngram/k=4": 0.9} if on else {"off": 0.9, "ngram/k=4": 0.1}
        )
        book.ingest(_batch(seq=seq))
    # a move under push_threshold is not published, so it is not movement either
    clock.now += 30.0
    policy.distribution = {"off": 0.12, "ngram/k=4": 0.88}
    book.ingest(_batch(seq=9))
    stats = book.stability("chat", 0)
    assert stats.mode_flips_total == 7 and stats.mode_flips_recent == 7
    assert stats.changes_total == 7
    # from off=1 to 0.1/0.9 is 0.9, then six moves of 0.8
    assert stats.change_tv_total == pytest.approx(0.9 + 6 * 0.8)
    assert stats.mode == NGRAM and stats.mode_dwell_s == 30.0  # the 8th report speculated
    # the trackers are per context: the contexts whose decision never changed never moved
    assert book.stability("chat", 1).changes_total == 0
    assert book.stability("default", 0).mode_flips_total == 0
    assert set(book.stability_by_context()) == {
        (c, b) for c in ("default", "chat") for b in range(4)
    }
    with pytest.raises(UnknownClassError):
        book.stability("nope", 0)

    assert _sample(book, "specctl_decision_mode_flips_total") == 7
    assert _sample(book, "specctl_decision_changes_total") == 7
    assert _sample(book, "specctl_decision_change_tv_total") == pytest.approx(5.7)
    assert _sample(book, "specctl_decision_mode_dwell_seconds") == 30.0
    assert _sample(book, "specctl_decision_mode_flips_total", "default", "3") == 0
    clock.now += 10.0
    assert _sample(book, "specctl_decision_mode_dwell_seconds") == 40.0


def test_evidence_carries_stability_and_changes_nothing() -> None:
    clock = Clock()
    policy = SettablePolicy()
    book = PolicyBook(policy, clock=clock)
    book.offer(OFFERED)
    book.ingest(_batch(seq=1))
    clock.now += 5.0
    policy.distribution = {"off": 0.3, "ngram/k=4": 0.7}
    book.ingest(_batch(seq=2))
    clock.now += 20.0
    before = {ctx: _state(t) for ctx, t in book._stability.items()}
    version = book.version
    first = evidence_message(book.evidence())
    assert evidence_message(book.evidence()) == first
    assert {ctx: _state(t) for ctx, t in book._stability.items()} == before
    assert book.version == version
    chat0 = next(c for c in first.classes if (c.workload_class, c.load_bucket) == ("chat", 0))
    s = chat0.stability
    assert (s.mode_arm, s.mode_dwell_s, s.mode_flips_total, s.mode_flips_recent) == (
        "ngram/k=4",
        20.0,
        1,
        1,
    )
    assert s.changes_recent == 1 and s.change_tv_recent == pytest.approx(0.7)
    assert s.window_s == 25.0
    assert stability_by_context(first)[("chat", 0)] == book.stability("chat", 0)


def test_an_override_is_a_flip_and_restart_stability_forgets_the_past() -> None:
    clock = Clock()
    book = PolicyBook(SettablePolicy(), clock=clock)
    book.offer(OFFERED)
    book.ingest(_batch(seq=1))
    clock.now += 1.0
    book.set_override("chat", NGRAM)
    assert [book.stability("chat", b).mode_flips_total for b in range(4)] == [1] * 4
    clock.now += 1.0
    book.restart_stability()
    after = book.stability("chat", 0)
    assert (after.mode, after.mode_flips_total, after.changes_total, after.mode_dwell_s) == (
        NGRAM,
        0,
        0,
        0.0,
    )
    assert _sample(book, "specctl_decision_mode_flips_total") == 0


def test_the_specctl_policy_on_steady_traffic_settles_without_flips() -> None:
    """The production policy, fed a class whose drafter keeps accepting 80% of its drafts."""
    rng = np.random.default_rng(1)
    clock = Clock()
    book = PolicyBook(make_policy("specctl"), clock=clock)
    book.offer(OFFERED)
    for seq in range(1, 601):
        decision = book.decision("chat", 0)
        chosen = rng.choice(len(decision.arms), size=8, p=decision.probabilities)
        arms = [decision.arms[i] for i in chosen]
        drafted = [a.k for a in arms]
        accepted = [int(np.argmin(np.append(rng.random(a.k) < 0.8, False))) for a in arms]
        step = StepRecord(
            step_index=seq,
            step_time_s=0.02 + 0.002 * max(drafted),
            batch_size=8,
            num_scheduled_tokens=8 + sum(drafted),
            policy_version=book.version,
            load_bucket=0,
            step_end_unix_s=clock.now,
            classes=["chat"] * 8,
            arms=[a.name for a in arms],
            propensity=[float(decision.probabilities[i]) for i in chosen],
            drafted=drafted,
            accepted=accepted,
        )
        book.ingest(
            decode_step_report(
                encode_step_report(seq, [step]), engine_id="e", offered=OFFERED, num_load_buckets=4
            )
        )
        clock.now += 0.05
    stats = book.stability("chat", 0)
    assert stats.mode_flips_total == 0, stats
    assert not stats.mode.is_off
    assert stats.mode_dwell_s == pytest.approx(30.0)
    # the distribution moved while it learned, then stayed put
    assert stats.change_tv_total < 1.5, stats


# ---------------------------------------------------------------------- a real sidecar


class FollowsLastReport(Policy):
    """For chat at load bucket 0, speculates after a report with accepted drafts, not after
    one without; off elsewhere."""

    policy_name = "follows-last-report"

    def __init__(self) -> None:
        self.speculate = False

    def set_arms(self, arms: Sequence[Arm]) -> None:
        pass

    def update_params(self, batch: StepBatch) -> None:
        self.speculate = bool(batch.accepted.sum() > 0)

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        if (workload_class, load_bucket) != ("chat", 0):
            return _d({"off": 1.0})
        if self.speculate:
            return _d({"off": 0.1, "ngram/k=4": 0.9})
        return _d({"off": 0.9, "ngram/k=4": 0.1})

    def state_dict(self) -> PolicyState:
        return {
            **state_header(self.policy_name, self.state_version),
            "speculate": float(self.speculate),
        }

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        self.speculate = bool(
            StateReader(state, self.policy_name, self.state_version).number("speculate")
        )


@pytest.fixture
def following_sidecar() -> Iterator[SidecarThread]:
    # unix socket paths are limited to ~100 bytes: not under pytest's deep tmp_path
    socket_dir = tempfile.mkdtemp(prefix="specctl-")
    config = load_config(
        None,
        env={},
        overrides={
            "server.listen": f"unix://{socket_dir}/s.sock",
            "server.metrics_listen": "127.0.0.1:0",
            "server.grace_period_s": 1.0,
            "log.format": "json",
        },
    )
    with SidecarThread(config, policy=FollowsLastReport()) as sc:
        yield sc
    shutil.rmtree(socket_dir, ignore_errors=True)


def _chat0(address: str) -> pb.ClassEvidence:
    with grpc.insecure_channel(address) as channel:
        ev = pb_grpc.SpecControllerStub(channel).GetEvidence(
            pb.GetEvidenceRequest(workload_class="chat"), timeout=5
        )
    return next(c for c in ev.classes if c.load_bucket == 0)


def _chat0_changes(address: str) -> int:
    """The ``chat`` class's decision changes so far; -1 before the sidecar knows the class
    (its first report not yet learned)."""
    try:
        return _chat0(address).stability.changes_total
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return -1
        raise


def test_alternating_evidence_over_grpc(following_sidecar, capsys) -> None:
    sc = following_sidecar
    engine = ScriptedEngine(sc.address)
    try:
        engine.send(hello())
        engine.recv_policy()
        # reports alternate between accepted drafts and none; each one is learned before the next
        for seq in range(1, 10):
            engine.send(report(seq, accepted=(3 if seq % 2 else 0, 0)))
            wait_for(lambda seq=seq: _chat0_changes(sc.address) == seq)
    finally:
        engine.close()
    s = _chat0(sc.address).stability
    assert s.mode_flips_total == 9 and s.mode_flips_recent == 9
    assert s.mode_arm == "ngram/k=4"  # the 9th report had accepted drafts
    assert s.change_tv_total == pytest.approx(9 * 0.8)
    assert 0.0 <= s.mode_dwell_s < 10.0 and s.mode_flips_per_minute == pytest.approx(9.0)

    m = scrape(sc.metrics_url)
    labels = 'load_bucket="0",workload_class="chat"'
    assert m[f"specctl_decision_mode_flips_total{{{labels}}}"] == 9
    assert m[f"specctl_decision_changes_total{{{labels}}}"] == 9
    assert m[f"specctl_decision_change_tv_total{{{labels}}}"] == pytest.approx(7.2)
    assert m[f"specctl_decision_mode_dwell_seconds{{{labels}}}"] < 10.0
    assert m['specctl_decision_mode_flips_total{load_bucket="1",workload_class="chat"}'] == 0
    assert m['specctl_decision_mode_flips_total{load_bucket="0",workload_class="default"}'] == 0

    assert main(["evidence", "--address", sc.address, "--class", "chat"]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index("decision stability (FLIPS, CHANGES and TV over the last WINDOW)")
    header = out[start + 1].split()
    assert header == [
        "CLASS",
        "BUCKET",
        "MODE",
        "DWELL",
        "WINDOW",
        "FLIPS",
        "FLIPS/MIN",
        "CHANGES",
        "TV",
        "TV/S",
    ]
    rows = {tuple(line.split()[:2]): line.split() for line in out[start + 2 :]}
    chat0 = dict(zip(header, rows[("chat", "0")], strict=True))
    assert chat0["MODE"] == "ngram/k=4"
    assert chat0["FLIPS"] == "9" and chat0["CHANGES"] == "9" and chat0["TV"] == "7.200"
    assert chat0["FLIPS/MIN"] == "9.00"
    assert chat0["DWELL"].endswith("s")
    chat1 = dict(zip(header, rows[("chat", "1")], strict=True))
    assert (chat1["MODE"], chat1["FLIPS"], chat1["TV"]) == ("off", "0", "0.000")

    assert main(["evidence", "--address", sc.address, "--class", "chat", "--json"]) == 0
    assert '"mode_flips_recent": 9' in capsys.readouterr().out


def test_a_restarted_sidecar_does_not_count_restoring_as_flips(sidecar_factory, tmp_path) -> None:
    state = tmp_path / "state"
    settings = {"policy_name": "specctl", "state_dir": str(state), "state_snapshot_interval_s": 0.2}
    sc = sidecar_factory(**settings)
    engine = ScriptedEngine(sc.address)
    engine.send(hello())
    engine.recv_policy()
    for seq in range(1, 41):
        engine.send(report(seq))
    wait_for(lambda: reports_learned(sc.metrics_url) == 40)
    # what it learned moved chat's distribution away from the prior: restoring it moves it again
    assert sc.run(lambda: sc.sidecar.book.stability("chat", 0)).changes_total > 0
    engine.close()
    sc.stop()
    again = sidecar_factory(**settings)
    for ce in again.run(lambda: evidence_message(again.sidecar.book.evidence())).classes:
        assert ce.stability.mode_flips_total == 0 and ce.stability.changes_total == 0, ce


def test_default_sidecar_metrics_list_the_stability_families() -> None:
    names = {f.name for f in SidecarMetrics().registry.collect()}
    assert {
        "specctl_decision_mode_flips",
        "specctl_decision_changes",
        "specctl_decision_change_tv",
        "specctl_decision_mode_dwell_seconds",
    } <= names
