"""PolicyBook without a server: versions, class folding, overrides, per-engine views, metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specctl.arms import OFF, Arm, parse_arm
from specctl.policy.base import ArmEstimate, Decision, Evidence, Policy
from specctl.policy.registry import make_policy
from specctl.policy.state import PolicyState, StateReader, StateValue, state_header
from specctl.protocol.policy_messages import evidence_message, policy_message
from specctl.protocol.reports import decode_step_report, encode_step_report
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.metrics import SidecarMetrics
from specctl.steps import StepBatch, StepRecord

OFFERED = {"ngram": 4}


class SettablePolicy(Policy):
    """A policy whose distribution the test sets, recording what it learned from."""

    policy_name = "settable"

    def __init__(self) -> None:
        self.distribution: dict[str, float] = {"off": 1.0}
        self.seen: list[StepBatch] = []

    def set_arms(self, arms: Sequence[Arm]) -> None:
        self.arms = list(arms)

    def update_params(self, batch: StepBatch) -> None:
        self.seen.append(batch)

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        arms = tuple(parse_arm(a) for a in self.distribution)
        return Decision(arms, np.array(list(self.distribution.values())), "set by the test")

    def evidence(self, workload_class: str, load_bucket: int) -> Evidence:
        estimates = tuple(
            ArmEstimate(parse_arm(a), 1.0, 0.01, 100.0 * (i + 1), 90.0, 110.0, p)
            for i, (a, p) in enumerate(self.distribution.items())
        )
        return Evidence(workload_class, load_bucket, estimates, rounds=42.0)

    def state_dict(self) -> PolicyState:
        return state_header(self.policy_name, self.state_version)

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        StateReader(state, self.policy_name, self.state_version)


def _batch(rows: Sequence[tuple[str, str, int, int]], bucket: int = 0, seq: int = 1) -> StepBatch:
    """rows: (class, arm, drafted, accepted), all in one step."""
    step = StepRecord(
        step_index=seq,
        step_time_s=0.01,
        batch_size=max(1, len(rows)),
        num_scheduled_tokens=10,
        policy_version=1,
        load_bucket=bucket,
        step_end_unix_s=1.0,
        classes=[r[0] for r in rows],
        arms=[r[1] for r in rows],
        propensity=[1.0] * len(rows),
        drafted=[r[2] for r in rows],
        accepted=[r[3] for r in rows],
    )
    return decode_step_report(
        encode_step_report(seq, [step]), engine_id="e", offered=OFFERED, num_load_buckets=4
    )


def _value(book: PolicyBook, name: str, **labels: str) -> float:
    """A sample the sidecar's exporter makes of the book's stats."""
    metrics = SidecarMetrics()
    metrics.watch(book)
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_version_moves_only_on_material_change() -> None:
    policy = SettablePolicy()
    book = PolicyBook(policy, push_threshold=0.05)
    book.offer(OFFERED)
    v = book.version
    assert book.ingest(_batch([("default", "off", 0, 0)])) is False
    policy.distribution = {"off": 0.97, "ngram/k=2": 0.03}  # total variation 0.03
    assert book.ingest(_batch([("default", "off", 0, 0)])) is False
    assert book.version == v
    assert book.decision("default", 0).arms == (OFF,)
    policy.distribution = {"off": 0.9, "ngram/k=2": 0.1}  # 0.1 from what was published
    assert book.ingest(_batch([("default", "off", 0, 0)])) is True
    assert book.version == v + 1
    assert book.decision("default", 0).probability_of(parse_arm("ngram/k=2")) == 0.1
    assert book.ingest(_batch([("chat", "off", 0, 0)])) is True  # a new class
    assert book.version == v + 2
    assert _value(book, "specctl_policy_version") == v + 2


def test_a_switched_off_contexts_probes_are_published_when_they_halve_or_double() -> None:
    """Probes are a few percent of a switched-off context's rounds: a move from 4% to 1% is
    under the push threshold in total variation, but is four times the speculation where
    every speculative arm loses; it is published. Smaller moves, and moves of a context
    that is not off, are left to total variation."""
    policy = SettablePolicy()
    book = PolicyBook(policy, push_threshold=0.05)
    book.offer(OFFERED)
    probe = parse_arm("ngram/k=2")
    published = []
    for dist in (
        {"off": 0.9, "ngram/k=2": 0.1},  # total variation 0.1 from off: published
        {"off": 0.96, "ngram/k=2": 0.04},  # 0.06: published
        {"off": 0.98, "ngram/k=2": 0.02},  # half the probes: not more than halved
        {"off": 0.99, "ngram/k=2": 0.01},  # a quarter of the published probes
        {"off": 0.985, "ngram/k=2": 0.015},
        {"off": 0.97, "ngram/k=2": 0.03},  # three times the published probes
        {"ngram/k=2": 0.99, "ngram/k=4": 0.01},  # on: total variation 0.98
        {"ngram/k=2": 0.995, "ngram/k=4": 0.005},  # not off: a 0.005 move is no news
    ):
        policy.distribution = dist
        book.ingest(_batch([("default", "off", 0, 0)]))
        published.append(book.decision("default", 0).probability_of(probe))
    assert published == [0.1, 0.04, 0.04, 0.01, 0.01, 0.03, 0.99, 0.99]


def test_classes_beyond_the_limit_fold_into_the_default_class() -> None:
    policy = SettablePolicy()
    book = PolicyBook(policy, max_classes=3)
    rows = [(f"c{i}", "ngram/k=4", 4, 2) for i in range(5)]
    book.ingest(_batch(rows))
    assert book.classes == ("default", "c0", "c1")
    seen = policy.seen[-1]
    assert set(seen.classes) == {"c0", "c1", "default"}
    assert sorted(seen.classes[i] for i in seen.class_index) == [
        "c0",
        "c1",
        "default",
        "default",
        "default",
    ]
    assert _value(book, "specctl_class_overflow_total") == 3
    assert _value(book, "specctl_classes") == 3
    assert (
        _value(book, "specctl_request_rounds_total", workload_class="default", drafter="ngram") == 3
    )


def test_override_wins_and_is_explained() -> None:
    policy = SettablePolicy()
    policy.distribution = {"ngram/k=4": 1.0}
    book = PolicyBook(policy)
    book.offer(OFFERED)
    v = book.set_override("chat", OFF)
    assert book.decision("chat", 2).arms == (OFF,)
    assert book.decision("chat", 2).explanation == "pinned by operator: off"
    assert _value(book, "specctl_switch_offs_total", workload_class="chat") == 0  # new class
    book.ingest(_batch([("chat", "ngram/k=4", 4, 4), ("chat", "off", 0, 0)], bucket=2))
    assert book.decision("chat", 2).arms == (OFF,)
    assert _value(book, "specctl_probe_rounds_total", workload_class="chat") == 1
    assert book.set_override("chat", None) > v
    assert book.decision("chat", 2).arms == (parse_arm("ngram/k=4"),)
    book.set_override("chat", OFF)
    assert _value(book, "specctl_switch_offs_total", workload_class="chat") == 4  # every bucket
    evidence = evidence_message(book.evidence("chat"))
    assert {c.override_arm for c in evidence.classes} == {"off"}


def test_policy_for_restricts_to_the_engines_arms_and_renormalises() -> None:
    policy = SettablePolicy()
    policy.distribution = {"off": 0.2, "ngram/k=2": 0.3, "ngram/k=4": 0.5}
    book = PolicyBook(policy, fallback_arm=None)
    book.offer(OFFERED)
    full = policy_message(book.full_policy(), 0.0)
    assert dict(zip(full.entries[0].arms, full.entries[0].probabilities, strict=True)) == {
        "off": 0.2,
        "ngram/k=2": 0.3,
        "ngram/k=4": 0.5,
    }
    small = policy_message(book.policy_for({"ngram": 2}, parse_arm("ngram/k=2")), 0.0)
    got = dict(zip(small.entries[0].arms, small.entries[0].probabilities, strict=True))
    assert got == {"off": 0.4, "ngram/k=2": 0.6}
    assert small.fallback_arm == "ngram/k=2"
    assert "restricted" in small.entries[0].explanation
    policy.distribution = {"ngram/k=4": 1.0}
    book.replace_policy(policy)
    none = book.policy_for({}, OFF)
    assert [list(e.arms) for e in none.entries] == [[OFF]] * 4
    assert book.policy_for({}, OFF) is none  # cached per version and offer


def test_sink_failures_are_counted_as_internal_errors_and_do_not_stop_ingest() -> None:
    book = PolicyBook(make_policy("static", {"arm": "off"}))
    got: list[StepBatch] = []

    def broken(batch: StepBatch) -> None:
        raise RuntimeError("disk full")

    book.add_sink(broken)
    book.add_sink(got.append)
    book.ingest(_batch([("chat", "off", 0, 0)]))
    assert len(got) == 1 and got[0].classes == ("chat",)
    assert _value(book, "specctl_internal_errors_total", where="sink") == 1
    # the report was not rejected: its rows reached the policy and the working sink
    assert _value(book, "specctl_reports_rejected_total", reason="sink_error") == 0


def test_evidence_and_goodput_gauges_come_from_the_policy() -> None:
    policy = SettablePolicy()
    policy.distribution = {"off": 0.25, "ngram/k=2": 0.75}
    book = PolicyBook(policy)
    book.offer(OFFERED)
    book.ingest(_batch([("chat", "ngram/k=2", 2, 1)], bucket=1))
    book.refresh_estimates(now=1e9)
    assert (
        _value(
            book,
            "specctl_chosen_arm_goodput_tokens_per_second",
            workload_class="chat",
            load_bucket="1",
        )
        == 200.0
    )
    assert (
        _value(
            book,
            "specctl_no_spec_goodput_tokens_per_second",
            workload_class="chat",
            load_bucket="1",
        )
        == 100.0
    )
    ev = evidence_message(book.evidence("chat"))
    assert len(ev.classes) == 4
    arms = {a.arm: a for a in ev.classes[1].arms}
    assert arms["ngram/k=2"].probability == 0.75 and arms["ngram/k=2"].goodput == 200.0
    assert ev.classes[1].rounds == 42.0


rows_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["off", "ngram/k=1", "ngram/k=3", "ngram/k=4"]),
        st.integers(0, 4),
        st.integers(0, 4),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=40, deadline=None)
@given(rows_strategy)
def test_vectorised_counters_match_a_row_by_row_count(raw) -> None:
    rows = []
    for cls, arm, d, a in raw:
        k = parse_arm(arm).k
        drafted = min(d, k)
        rows.append((cls, arm, drafted, min(a, drafted)))
    book = PolicyBook(make_policy("static", {"arm": "off"}))
    book.ingest(_batch(rows))
    expect: Counter[tuple[str, ...]] = Counter()
    for cls, arm, drafted, accepted in rows:
        expect[("arm_rounds", cls, arm)] += 1
        if arm != "off":
            expect[("rounds", cls)] += 1
            expect[("drafted", cls)] += drafted
            expect[("accepted", cls)] += accepted
            for p in range(1, accepted + 1):
                expect[("pos", cls, str(p))] += 1
    for cls in "abc":
        lab = {"workload_class": cls, "drafter": "ngram"}
        assert _value(book, "specctl_request_rounds_total", **lab) == expect[("rounds", cls)]
        assert _value(book, "specctl_draft_tokens_total", **lab) == expect[("drafted", cls)]
        assert _value(book, "specctl_accepted_tokens_total", **lab) == expect[("accepted", cls)]
        for p in "1234":
            got = _value(book, "specctl_accepted_tokens_per_position_total", position=p, **lab)
            assert got == expect[("pos", cls, p)]
        for arm in ("off", "ngram/k=1", "ngram/k=3", "ngram/k=4"):
            got = _value(book, "specctl_arm_rounds_total", workload_class=cls, arm=arm)
            assert got == expect[("arm_rounds", cls, arm)]


def test_fallback_change_is_a_new_version_for_every_engine() -> None:
    book = PolicyBook(make_policy("static", {"arm": "off"}))
    book.offer(OFFERED)
    before = book.policy_for(OFFERED, OFF)
    assert before.fallback_arm == OFF
    v = book.set_fallback_arm(parse_arm("ngram/k=2"))
    assert v == before.version + 1
    assert book.policy_for(OFFERED, OFF).fallback_arm == parse_arm("ngram/k=2")
    assert book.policy_for({}, OFF).fallback_arm == OFF  # not runnable there
    assert book.set_fallback_arm(parse_arm("ngram/k=2")) == v  # unchanged: same version


class BrokenPolicy(SettablePolicy):
    """Fails on demand, as a policy with a bug would."""

    fail = False

    def update_params(self, batch: StepBatch) -> None:
        if self.fail:
            raise RuntimeError("bug in update")
        super().update_params(batch)

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        if self.fail:
            raise RuntimeError("bug in select")
        return super().select_action(workload_class, load_bucket)


def test_a_failing_policy_is_contained_and_counted_as_internal_errors() -> None:
    policy = BrokenPolicy()
    policy.distribution = {"ngram/k=2": 1.0}
    book = PolicyBook(policy)
    book.offer(OFFERED)
    got: list[StepBatch] = []
    book.add_sink(got.append)
    v = book.version
    policy.fail = True
    assert book.ingest(_batch([("default", "off", 0, 0)])) is False
    assert book.version == v
    assert book.decision("default", 0).arms == (parse_arm("ngram/k=2"),)  # kept
    assert len(got) == 1  # the sink still saw the report
    assert _value(book, "specctl_internal_errors_total", where="policy_update") == 1
    # deciding failed in every context the report could change: default in each bucket
    assert _value(book, "specctl_internal_errors_total", where="policy_select") == 4
    assert _value(book, "specctl_reports_rejected_total", reason="policy_error") == 0
    book.ingest(_batch([("fresh", "off", 0, 0)]))  # a new class while failing: off
    assert book.decision("fresh", 0).arms == (OFF,)
    assert book.decision("fresh", 0).explanation == "policy failed: off"


class PerBucketCostPolicy(SettablePolicy):
    """Speculates in the load buckets whose steps it saw run fast, for every class there,
    as a step-cost model learned per load bucket does."""

    def __init__(self) -> None:
        super().__init__()
        self.fast_buckets: set[int] = set()

    def update_params(self, batch: StepBatch) -> None:
        super().update_params(batch)
        for bucket, step_time in zip(batch.load_bucket, batch.step_time_s, strict=True):
            if step_time < 0.005:
                self.fast_buckets.add(int(bucket))

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        arm = parse_arm("ngram/k=4") if load_bucket in self.fast_buckets else OFF
        return Decision.point(arm, "per-bucket cost")


def _timed_batch(workload_class: str, bucket: int, step_time_s: float, seq: int) -> StepBatch:
    step = StepRecord(
        step_index=seq,
        step_time_s=step_time_s,
        batch_size=1,
        num_scheduled_tokens=5,
        policy_version=1,
        load_bucket=bucket,
        step_end_unix_s=1.0,
        classes=[workload_class],
        arms=["ngram/k=4"],
        propensity=[1.0],
        drafted=[4],
        accepted=[2],
    )
    return decode_step_report(
        encode_step_report(seq, [step]), engine_id="e", offered=OFFERED, num_load_buckets=4
    )


def test_a_report_republishes_every_class_of_its_load_bucket() -> None:
    book = PolicyBook(PerBucketCostPolicy())
    book.offer(OFFERED)
    book.ingest(_timed_batch("code", bucket=1, step_time_s=0.05, seq=1))
    assert book.decision("code", 1).arms == (OFF,)
    version = book.version
    # chat's fast steps in bucket 1 teach the policy that speculation pays there
    assert book.ingest(_timed_batch("chat", bucket=1, step_time_s=0.001, seq=2)) is True
    assert book.version > version
    ngram = parse_arm("ngram/k=4")
    for cls in ("chat", "code", "default"):
        assert book.decision(cls, 1).arms == (ngram,), cls
        assert book.decision(cls, 0).arms == (OFF,), cls  # no step in bucket 0
    pushed = {
        (e.workload_class, e.load_bucket): e.arms for e in book.policy_for(OFFERED, OFF).entries
    }
    assert pushed[("code", 1)] == (ngram,)


class PerClassAcceptancePolicy(SettablePolicy):
    """Speculates for the classes whose drafts it saw accepted, at every load, as an
    acceptance model learned per class does."""

    def __init__(self) -> None:
        super().__init__()
        self.accepting: set[str] = set()

    def update_params(self, batch: StepBatch) -> None:
        super().update_params(batch)
        for c, accepted in zip(batch.class_index, batch.accepted, strict=True):
            if accepted > 0:
                self.accepting.add(batch.classes[int(c)])

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        arm = parse_arm("ngram/k=4") if workload_class in self.accepting else OFF
        return Decision.point(arm, "per-class acceptance")


def test_a_report_republishes_its_classes_in_every_load_bucket() -> None:
    book = PolicyBook(PerClassAcceptancePolicy())
    book.offer(OFFERED)
    book.ingest(_batch([("chat", "off", 0, 0)], bucket=0))
    assert book.decision("chat", 3).arms == (OFF,)
    # accepted drafts in bucket 0 speak for chat's drafts at any load
    assert book.ingest(_batch([("chat", "ngram/k=4", 4, 3)], bucket=0, seq=2)) is True
    ngram = parse_arm("ngram/k=4")
    assert [book.decision("chat", b).arms for b in range(4)] == [(ngram,)] * 4
    assert [book.decision("default", b).arms for b in range(4)] == [(OFF,)] * 4
