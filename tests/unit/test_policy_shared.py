"""Shared evidence: what a replica gives its fleet, and how it merges the others'.

The policy keeps its own evidence and the fleet's apart: its own is decayed,
capped, tested for change and shared; the fleet's is replaced whole at every
merge and weighed into the posterior. So merging never leaks into what a
replica shares, merging again never counts twice, a change seen here first
sets the fleet's evidence aside until the fleet agrees, and the fleet fills in
only what the replica's own memory would hold.
"""

from __future__ import annotations

import numpy as np
import pytest
from policy_env import SyntheticEnv

from specctl.arms import arms_for, parse_arm
from specctl.policy.acceptance import ARM_STATS
from specctl.policy.cost import BASE_FEATURES, FEATURES_PER_DRAFTER, num_features
from specctl.policy.registry import make_policy
from specctl.policy.shared import (
    SharedAcceptance,
    SharedCost,
    SharedEvidence,
    SharedEvidenceError,
    sum_acceptance,
    sum_cost,
)
from specctl.policy.thompson import SpecctlPolicy
from specctl.sidecar.book import PolicyBook

NGRAM = {"ngram": 6}
K6 = parse_arm("ngram/k=6")


def specctl(**params: object) -> SpecctlPolicy:
    policy = make_policy("specctl", params)
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for(NGRAM.items()))
    return policy


def learn(policy: SpecctlPolicy, cls: str, acceptance: float, steps: int, **env: object) -> None:
    bucket = int(env.pop("bucket", 0))  # type: ignore[call-overload]
    world = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": acceptance}, **env)  # type: ignore[arg-type]
    for _ in range(steps):
        world.run_step(policy, cls, bucket, 8)


def replay(policy: SpecctlPolicy, batches: list) -> None:
    for batch in batches:
        policy.update_params(batch)


def same_contribution(a: SharedEvidence, b: SharedEvidence) -> None:
    assert (a.acceptance is None) == (b.acceptance is None)
    if a.acceptance is not None and b.acceptance is not None:
        assert sorted(a.acceptance.classes) == sorted(b.acceptance.classes)
        order = [a.acceptance.classes.index(c) for c in b.acceptance.classes]
        for name in ("counts", "arm_stats", "rounds"):
            np.testing.assert_array_equal(
                getattr(a.acceptance, name)[order], getattr(b.acceptance, name)
            )
    assert (a.cost is None) == (b.cost is None)
    if a.cost is not None and b.cost is not None:
        # the columns by name: two replicas slot their classes in the order they met them
        keys = a.cost.feature_keys()
        assert sorted(keys) == sorted(b.cost.feature_keys())
        order = np.array([keys.index(k) for k in b.cost.feature_keys()])
        np.testing.assert_array_equal(a.cost.xtx[:, order[:, None], order], b.cost.xtx)
        np.testing.assert_array_equal(a.cost.xty[:, order], b.cost.xty)
        for name in ("yy", "steps", "load_steps", "load_batch_sum"):
            np.testing.assert_array_equal(getattr(a.cost, name), getattr(b.cost, name))


def test_a_cold_replica_decides_from_a_peers_evidence() -> None:
    peer, cold = specctl(), specctl()
    learn(peer, "chat", 0.9, 200)
    assert peer.select_action("chat", 0).mode == K6
    assert cold.select_action("chat", 0).probability_of(K6) < 0.5
    cold.merge_shared(peer.contribution())
    # the same evidence, so the same posterior and the same decision
    np.testing.assert_allclose(
        cold.select_action("chat", 0).probabilities,
        peer.select_action("chat", 0).probabilities,
        atol=0.05,
    )
    assert cold.evidence("chat", 0).rounds == pytest.approx(peer.evidence("chat", 0).rounds)
    # what the cold replica shares is still only its own: nothing
    assert cold.contribution() == SharedEvidence(None, None)


def test_merging_never_leaks_into_what_a_replica_shares_nor_counts_twice() -> None:
    peer = specctl()
    learn(peer, "chat", 0.9, 150)
    shared = peer.contribution()
    alone, merged = specctl(), specctl()
    world = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.5}, seed=3)
    for _ in range(50):
        # chat too: the class the fleet's evidence is about, in another load bucket
        world.run_step(alone, "code", 1, 8)
        world.run_step(alone, "chat", 1, 8)
    merged.merge_shared(shared)
    replay(merged, world.batches)
    # its own statistics are exactly those of the replica that never merged
    same_contribution(merged.contribution(), alone.contribution())
    # merging the same evidence again changes nothing: it replaces, it does not add
    before = merged.evidence("chat", 0)
    merged.merge_shared(shared)
    merged.merge_shared(shared)
    assert merged.evidence("chat", 0) == before
    # and without the fleet it decides as the replica alone does
    merged.merge_shared(None)
    for cls, bucket in (("code", 1), ("chat", 1), ("chat", 0)):
        np.testing.assert_array_equal(
            merged.select_action(cls, bucket).probabilities,
            alone.select_action(cls, bucket).probabilities,
        )


MAX_ROUNDS = 2000.0


def rounds_after_a_merge(fleet_max_rounds: float) -> tuple[float, float, float]:
    """A busy replica (``max_rounds`` 2,000) merges a peer's long run of one class: its
    own rounds, the fleet's, and the rounds its posterior holds at the first position."""
    peer = specctl(max_rounds=MAX_ROUNDS)
    busy = specctl(max_rounds=MAX_ROUNDS, fleet_max_rounds=fleet_max_rounds)
    learn(peer, "chat", 0.9, 400)
    learn(busy, "chat", 0.9, 150, seed=2)
    busy.merge_shared(peer.contribution())
    acc = busy.learned.acceptance
    slot = busy.learned.class_slot["chat"]
    d = busy.learned.drafter_slot["ngram"]
    alpha, beta = acc.posterior(slot, np.array([d]), 1)
    merged = float(alpha[0, 0] + beta[0, 0]) - acc.prior_success - acc.prior_failure
    own = float(acc.counts[slot, d, :, 0].sum())
    return own, float(acc.shared_counts[slot, d, :, 0].sum()), merged


def test_the_fleet_fills_in_only_what_the_fleet_cap_would_hold() -> None:
    own, fleet, merged = rounds_after_a_merge(fleet_max_rounds=MAX_ROUNDS)
    assert own < MAX_ROUNDS < own + fleet
    assert merged == pytest.approx(MAX_ROUNDS)


def test_a_fleet_cap_lets_the_fleet_hold_more_than_one_replicas_memory() -> None:
    """``fleet_max_rounds`` caps this replica's and the fleet's rounds together: above
    ``max_rounds`` the fleet's evidence is merged whole where one replica's memory would
    have held part of it (the test above), and the replica's own counts keep their cap."""
    max_rounds = MAX_ROUNDS
    own, fleet, merged = rounds_after_a_merge(fleet_max_rounds=10 * max_rounds)
    assert own <= max_rounds < own + fleet < 10 * max_rounds
    assert merged == pytest.approx(own + fleet)
    # a fleet cap below this replica's own counts as its own
    assert (
        specctl(max_rounds=max_rounds, fleet_max_rounds=10.0).learned.acceptance.fleet_max_rounds
        == max_rounds
    )


def test_a_change_seen_here_first_sets_the_fleets_acceptance_aside_until_it_agrees() -> None:
    peer, here = specctl(), specctl()
    learn(peer, "chat", 0.9, 300)
    here.merge_shared(peer.contribution())
    assert here.select_action("chat", 0).mode == K6
    # chat's drafts stop being accepted here: the fleet's 0.9 must not outvote it
    learn(here, "chat", 0.1, 60, seed=5)
    slot = here.learned.class_slot["chat"]
    assert (here.learned.acceptance.shared_weight[slot] == 0.0).all()
    assert here.select_action("chat", 0).probability_of(K6) < 0.1
    # the peer sees the same change: once its evidence agrees, it is merged again
    learn(peer, "chat", 0.1, 200, seed=6)
    here.merge_shared(peer.contribution())
    d = here.learned.drafter_slot["ngram"]
    assert here.learned.acceptance.shared_weight[slot, d] > 0.0


def test_a_change_in_cost_here_holds_the_fleets_cost_until_the_fleet_agrees() -> None:
    # step times with a wall clock's jitter (2 ms on 20-40 ms steps)
    peer, here = specctl(), specctl()
    learn(peer, "chat", 0.6, 300, base_s=0.02, noise_s=0.002)
    here.merge_shared(peer.contribution())
    cost = here.learned.cost
    assert cost.shared_weight[0] > 0.0
    # this engine's steps take twice as long: its CUSUM fires, the fleet's cost waits
    learn(here, "chat", 0.6, 150, base_s=0.04, noise_s=0.002, seed=7)
    assert cost.changes[0] >= 1 and cost.shared_held[0] and cost.shared_weight[0] == 0.0
    assert cost.mean_step_s(0) > 0.035
    here.merge_shared(peer.contribution())
    assert cost.shared_held[0]
    # the peer's steps slow down too: the fits agree, and the fleet's cost is merged again
    learn(peer, "chat", 0.6, 1000, base_s=0.04, noise_s=0.002, seed=8)
    here.merge_shared(peer.contribution())
    assert not cost.shared_held[0] and cost.shared_weight[0] > 0.0


def test_fleet_classes_take_free_slots_only_and_are_evicted_first() -> None:
    peer, here = specctl(max_classes=3), specctl(max_classes=3)
    for cls in ("a", "b", "c"):
        learn(peer, cls, 0.7, 20)
    learn(here, "mine", 0.7, 20)
    report = here.merge_shared(peer.contribution())
    assert report.classes_without_slot == 1
    assert set(here.learned.class_slot) == {"mine", "a", "b"}
    learn(here, "new", 0.7, 5, seed=9)
    # a slot held only for the fleet made room; this replica's own class stayed
    assert "mine" in here.learned.class_slot and "new" in here.learned.class_slot
    assert len({"a", "b"} & set(here.learned.class_slot)) == 1


def test_contributions_sum_by_name_whatever_their_order() -> None:
    def acceptance(classes: tuple[str, ...], drafters: tuple[str, ...], k: int, value: float):
        c, d = len(classes), len(drafters)
        return SharedAcceptance(
            classes,
            drafters,
            np.full((c, d, 2, k), value),
            np.full((c, d, ARM_STATS, k + 1), value),
            np.full(c, value),
        )

    total = sum_acceptance(
        [acceptance(("x", "y"), ("ngram",), 2, 1.0), acceptance(("y",), ("eagle", "ngram"), 3, 2.0)]
    )
    assert total is not None
    assert total.classes == ("x", "y") and total.drafters == ("ngram", "eagle")
    assert total.counts.shape == (2, 2, 2, 3)
    assert total.counts[1, 0, 0].tolist() == [3.0, 3.0, 2.0]  # y/ngram: 1 + 2, then 2 alone
    assert total.counts[0, 1].sum() == 0.0  # x never ran eagle
    assert total.rounds.tolist() == [1.0, 3.0]

    def cost(drafters: tuple[str, ...], seed: int) -> SharedCost:
        rng = np.random.default_rng(seed)
        x = rng.random((4, 30, num_features(len(drafters))))
        return SharedCost(
            (8, 32, 128),
            drafters,
            np.einsum("bsi,bsj->bij", x, x),
            x.sum(axis=1),
            *(np.ones(4) for _ in range(5)),
        )

    one, two = cost(("ngram", "eagle"), 1), cost(("eagle",), 2)
    summed = sum_cost([one, two])
    assert summed is not None and summed.drafters == ("ngram", "eagle")
    f = BASE_FEATURES
    eagle = [0, 1, 2, *range(f + FEATURES_PER_DRAFTER, f + 2 * FEATURES_PER_DRAFTER)]  # eagle's
    expected = one.xtx[:, eagle][:, :, eagle] + two.xtx
    np.testing.assert_allclose(summed.xtx[:, eagle][:, :, eagle], expected)
    with pytest.raises(ValueError, match="load buckets differ"):
        sum_cost([one, SharedCost((8,), ("eagle",), *_zero_cost(2, 1))])


def test_the_cost_sum_aligns_arm_and_class_columns_by_name() -> None:
    def cost(arms: tuple[str, ...], pairs: tuple[tuple[str, str], ...], seed: int) -> SharedCost:
        rng = np.random.default_rng(seed)
        x = rng.random((1, 30, num_features(1) + len(arms) + len(pairs)))
        return SharedCost(
            (),
            ("ngram",),
            np.einsum("bsi,bsj->bij", x, x),
            x.sum(axis=1),
            *(np.ones(1) for _ in range(5)),
            arm_columns=arms,
            class_columns=pairs,
        )

    one = cost(("ngram/k=2", "ngram/k=1"), (("chat", "ngram"),), 1)
    two = cost(("ngram/k=1",), (("code", "ngram"), ("chat", "ngram")), 2)
    summed = sum_cost([one, two])
    assert summed is not None
    assert summed.arm_columns == ("ngram/k=2", "ngram/k=1")
    assert summed.class_columns == (("chat", "ngram"), ("code", "ngram"))
    keys = summed.feature_keys()
    for key in (("arm", "ngram/k=1"), ("class", "chat", "ngram")):
        both = [part.feature_keys().index(key) for part in (one, two)]
        at = keys.index(key)
        assert summed.xtx[0, at, at] == pytest.approx(
            one.xtx[0, both[0], both[0]] + two.xtx[0, both[1], both[1]]
        )
    # a column one part has alone holds that part's sums
    at, mine = (
        keys.index(("class", "code", "ngram")),
        two.feature_keys().index(("class", "code", "ngram")),
    )
    assert summed.xty[0, at] == two.xty[0, mine]


def _zero_cost(buckets: int, drafters: int) -> tuple[np.ndarray, ...]:
    f = num_features(drafters)
    return (
        np.zeros((buckets, f, f)),
        np.zeros((buckets, f)),
        *(np.zeros(buckets) for _ in range(5)),
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.update(counts=-a["counts"] - 1.0), "counts has negative values"),
        (lambda a: a.update(rounds=np.array([np.nan])), "rounds has values that are not finite"),
        (lambda a: a.update(arm_stats=np.zeros((1, 1, 3, 2))), "arm_stats has shape"),
        (lambda a: a.update(classes=("bad name",)), "classes: workload class"),
        (lambda a: a.update(drafters=("ngram", "ngram")), "drafters repeats a name"),
    ],
)
def test_a_malformed_acceptance_contribution_is_refused_by_name(change, message) -> None:
    fields: dict = {
        "classes": ("chat",),
        "drafters": ("ngram",),
        "counts": np.ones((1, 1, 2, 3)),
        "arm_stats": np.ones((1, 1, ARM_STATS, 4)),
        "rounds": np.ones(1),
    }
    change(fields)
    with pytest.raises(SharedEvidenceError, match=message):
        SharedAcceptance(**fields)


def test_a_cost_contribution_must_be_a_sum_of_squares() -> None:
    xtx, xty, *rest = _zero_cost(1, 1)
    xtx[0, 0, 0] = -1.0
    with pytest.raises(SharedEvidenceError, match="not positive semi-definite"):
        SharedCost((), ("ngram",), xtx, xty, *rest)
    xtx[0, 0, 0], xtx[0, 0, 1] = 1.0, 0.5
    with pytest.raises(SharedEvidenceError, match="not symmetric"):
        SharedCost((), ("ngram",), xtx, xty, *rest)


def test_the_book_publishes_the_fleets_classes_while_it_has_room() -> None:
    peer = specctl()
    for cls in ("chat", "code", "math"):
        learn(peer, cls, 0.9, 60)
    book = PolicyBook(specctl(), max_classes=3)
    book.offer(NGRAM)
    version = book.version
    changed, _ = book.merge_shared(peer.contribution())
    assert changed and book.version > version
    # the default class and two of the fleet's: max_classes holds
    assert book.classes == ("default", "chat", "code")
    assert book.decision("chat", 0).probability_of(K6) > 0.5
    # what it shares is still its own: nothing
    assert book.contribution() == SharedEvidence(None, None)
    # a policy that keeps nothing to share gives nothing and merges nothing
    static = PolicyBook(make_policy("static", {"arm": "off"}))
    assert static.contribution() is None
    assert static.merge_shared(peer.contribution())[0] is False
