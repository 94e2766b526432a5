"""The engine's compiled policy: sampling matches the pushed distribution."""

from __future__ import annotations

import numpy as np
import pytest

from specctl.api import pb
from specctl.arms import OFF, parse_arm
from specctl.engine.policy_view import PolicyError, compile_policy, fallback_view

OFFERED = {"ngram": 4}


def _policy(**kw: object) -> pb.Policy:
    base = dict(
        version=3,
        fallback_arm="ngram/k=4",
        load_bucket_bounds=[4, 16],
        default_class="default",
        entries=[
            pb.ClassPolicy(
                workload_class="chat",
                load_bucket=0,
                arms=["off", "ngram/k=2", "ngram/k=4"],
                probabilities=[0.1, 0.6, 0.3],
            ),
            pb.ClassPolicy(
                workload_class="default", load_bucket=0, arms=["off"], probabilities=[1.0]
            ),
        ],
    )
    base.update(kw)
    return pb.Policy(**base)  # type: ignore[arg-type]


def test_sampling_frequencies_and_propensities_match() -> None:
    view = compile_policy(_policy(), OFFERED)
    rng = np.random.default_rng(0)
    counts: dict[str, int] = {}
    for u in rng.random(20_000):
        choice = view.choose("chat", 0, float(u))
        counts[choice.arm.name] = counts.get(choice.arm.name, 0) + 1
        expected = {"off": 0.1, "ngram/k=2": 0.6, "ngram/k=4": 0.3}[choice.arm.name]
        assert choice.propensity == pytest.approx(expected)
    assert counts["ngram/k=2"] / 20_000 == pytest.approx(0.6, abs=0.02)
    assert counts["off"] / 20_000 == pytest.approx(0.1, abs=0.01)


def test_unknown_class_uses_default_then_fallback() -> None:
    view = compile_policy(_policy(), OFFERED)
    assert view.choose("never-seen", 0, 0.5).arm == OFF
    assert view.choose("never-seen", 2, 0.5).arm == parse_arm("ngram/k=4")
    assert view.choose("never-seen", 2, 0.5).propensity == 1.0


def test_load_buckets() -> None:
    view = compile_policy(_policy(), OFFERED)
    assert [view.load_bucket(b) for b in (1, 4, 5, 16, 17)] == [0, 0, 1, 1, 2]
    assert view.num_load_buckets == 3


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        (
            pb.ClassPolicy(workload_class="c", arms=["ngram/k=8"], probabilities=[1.0]),
            "not offered",
        ),
        (
            pb.ClassPolicy(workload_class="c", arms=["off", "ngram/k=1"], probabilities=[0.5, 0.6]),
            "not a distribution",
        ),
        (pb.ClassPolicy(workload_class="c", arms=["off"], probabilities=[]), "1 arms and 0"),
        (pb.ClassPolicy(workload_class="c", arms=["bogus"], probabilities=[1.0]), "'bogus'"),
    ],
)
def test_bad_policies_are_refused(entry: pb.ClassPolicy, needle: str) -> None:
    with pytest.raises(PolicyError, match=needle):
        compile_policy(_policy(entries=[entry]), OFFERED)


def test_fallback_view_runs_the_fallback_everywhere() -> None:
    view = fallback_view(parse_arm("ngram/k=4"), [8])
    assert view.version == 0
    assert view.choose("any", 1, 0.99).arm == parse_arm("ngram/k=4")


def test_one_uniform_draws_the_classes_k_together() -> None:
    # arms in any order: the engine orders them by K, so that the one uniform the scheduler
    # draws per step gives every class a short K together or a long K together
    policy = _policy(
        entries=[
            pb.ClassPolicy(
                workload_class="a",
                load_bucket=0,
                arms=["ngram/k=4", "off", "ngram/k=1"],
                probabilities=[0.5, 0.2, 0.3],
            ),
            pb.ClassPolicy(
                workload_class="b",
                load_bucket=0,
                arms=["ngram/k=3", "ngram/k=2", "off"],
                probabilities=[0.3, 0.3, 0.4],
            ),
        ]
    )
    view = compile_policy(policy, OFFERED)
    us = np.linspace(0.0, 0.999, 1000)
    ka = [view.choose("a", 0, float(u)).arm.k for u in us]
    kb = [view.choose("b", 0, float(u)).arm.k for u in us]
    assert ka == sorted(ka) and kb == sorted(kb)
    # each class keeps its own distribution, and its propensities
    assert np.mean(np.array(ka) == 0) == pytest.approx(0.2, abs=0.01)
    assert np.mean(np.array(kb) == 3) == pytest.approx(0.3, abs=0.01)
    assert view.choose("a", 0, 0.9).propensity == pytest.approx(0.5)
