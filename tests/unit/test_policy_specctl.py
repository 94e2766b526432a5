"""specctl's policy: censored acceptance, measured cost, Thompson decisions, switch-off."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_env import SyntheticEnv

from specctl.api import pb
from specctl.arms import OFF, Arm, arms_for, parse_arm
from specctl.engine.policy_view import compile_policy
from specctl.policy.acceptance import AcceptanceModel, expected_tokens
from specctl.policy.cost import drafter_feature
from specctl.policy.joint import JointChoice
from specctl.policy.registry import make_policy
from specctl.policy.thompson import SpecctlPolicy, tracking_bound_steps
from specctl.policy.thompson_config import SpecctlConfig
from specctl.policy.truncated import nonnegative_draws
from specctl.protocol.reports import decode_step_report, encode_step_report
from specctl.steps import StepRecord

NGRAM = {"ngram": 6}


def specctl(**params: object) -> SpecctlPolicy:
    policy = make_policy("specctl", params)
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for(NGRAM.items()))
    return policy


def mode_k(policy: SpecctlPolicy, workload_class: str, bucket: int) -> int:
    return policy.select_action(workload_class, bucket).mode.k


# -- acceptance model ---------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 1)),
        min_size=1,
        max_size=40,
    )
)
def test_censoring_matches_a_per_round_count(rows: list[tuple[int, int, int]]) -> None:
    """Position j counts a success iff accepted >= j, a failure iff accepted = j-1 < K."""
    k = np.array([r[0] for r in rows])
    accepted = np.array([min(r[1], r[0]) for r in rows])
    drafter = np.array([r[2] for r in rows])  # 0: off (untracked), 1: ngram
    k = np.where(drafter == 0, 0, k)
    accepted = np.minimum(accepted, k)
    model = AcceptanceModel(2, 1, discount=1.0, prior_mean=0.5, prior_strength=1.0, max_rounds=1e9)
    model.update(
        np.array([1]),
        np.array([-1, 0]),
        np.zeros(len(rows), dtype=np.int64),
        drafter,
        k,
        accepted,
        np.zeros(len(rows), dtype=np.int64),
    )
    want_s = np.zeros(6)
    want_f = np.zeros(6)
    for kk, a, d in zip(k, accepted, drafter, strict=True):
        if d == 0:
            continue
        for j in range(1, kk + 1):
            if a >= j:
                want_s[j - 1] += 1
            elif a == j - 1:
                want_f[j - 1] += 1
    np.testing.assert_array_equal(model.success[1, 0, :6], want_s)
    np.testing.assert_array_equal(model.failure[1, 0, :6], want_f)
    assert model.rounds[1] == len(rows)


def test_a_k2_round_is_never_a_rejection_at_position_3() -> None:
    model = AcceptanceModel(1, 1, discount=1.0, prior_mean=0.5, prior_strength=1.0, max_rounds=1e9)
    one = np.zeros(1, dtype=np.int64)
    # K=2, both accepted; K=2, first rejected
    model.update(
        one,
        np.array([0]),
        np.zeros(2, dtype=np.int64),
        np.zeros(2, dtype=np.int64),
        np.array([2, 2]),
        np.array([2, 0]),
        np.zeros(2, dtype=np.int64),
    )
    assert model.success[0, 0, :3].tolist() == [1.0, 1.0, 0.0]
    assert model.failure[0, 0, :3].tolist() == [1.0, 0.0, 0.0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12))
def test_expected_tokens_never_decrease_with_k(rates: list[float]) -> None:
    tokens = expected_tokens(np.array(rates))
    assert tokens[0] >= 1.0
    assert np.all(np.diff(tokens) >= 0.0)


# -- decisions ----------------------------------------------------------------

drafter_sets = st.dictionaries(
    st.sampled_from(["ngram", "eagle3", "mtp"]), st.integers(1, 6), min_size=0, max_size=3
)


@settings(max_examples=25, deadline=None)
@given(
    offered=drafter_sets,
    rate=st.floats(0.0, 1.0),
    batch_size=st.integers(1, 200),
    bucket=st.integers(0, 3),
    steps=st.integers(0, 4),
)
def test_distribution_sums_to_one_over_offered_arms_only(
    offered: dict[str, int], rate: float, batch_size: int, bucket: int, steps: int
) -> None:
    policy = make_policy("specctl", {"prior_arm": "ngram/k=3"})
    arms = arms_for(offered.items())
    policy.set_arms(arms)
    env = SyntheticEnv(drafters=offered, acceptance=dict.fromkeys(offered, rate))
    for _ in range(steps):
        env.run_step(policy, "chat", bucket, batch_size)
    for workload_class in ("chat", "never-seen"):
        decision = policy.select_action(workload_class, bucket)
        assert set(decision.arms) <= set(arms)
        assert OFF in decision.arms
        assert decision.probabilities.sum() == pytest.approx(1.0)
        assert np.all(decision.probabilities >= 0.0)
        evidence = policy.evidence(workload_class, bucket)
        assert evidence.explanation == decision.explanation


def test_engine_propensities_match_the_distribution() -> None:
    policy = specctl()
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.6})
    for _ in range(30):
        env.run_step(policy, "chat", 1, 16)
    decision = policy.select_action("chat", 1)
    assert np.count_nonzero(decision.probabilities) >= 2, decision
    message = pb.Policy(
        version=7,
        fallback_arm="off",
        load_bucket_bounds=[8, 32, 128],
        default_class="default",
        entries=[
            pb.ClassPolicy(
                workload_class="chat",
                load_bucket=1,
                arms=[a.name for a in decision.arms],
                probabilities=decision.probabilities.tolist(),
            )
        ],
    )
    view = compile_policy(message, NGRAM)
    rng = np.random.default_rng(3)
    n = 20000
    counts: dict[str, int] = {}
    for u in rng.random(n):
        choice = view.choose("chat", 1, float(u))
        assert choice.propensity == pytest.approx(decision.probability_of(choice.arm))
        counts[choice.arm.name] = counts.get(choice.arm.name, 0) + 1
    for arm, p in zip(decision.arms, decision.probabilities, strict=True):
        sd = np.sqrt(n * p * (1 - p)) + 1.0
        assert abs(counts.get(arm.name, 0) - n * p) < 6 * sd, (arm, counts, p)


def test_expected_tokens_and_step_time_are_monotone_in_k_in_the_evidence() -> None:
    policy = specctl()
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.7})
    for _ in range(40):
        env.run_step(policy, "chat", 2, 64)
    evidence = policy.evidence("chat", 2)
    spec = [a for a in evidence.arms if not a.arm.is_off]
    assert [a.arm.k for a in spec] == [1, 2, 3, 4, 5, 6]
    tokens = [a.expected_tokens for a in spec]
    times = [a.expected_step_time_s for a in spec]
    assert all(b >= a for a, b in itertools.pairwise(tokens))
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert sum(a.prob_best for a in evidence.arms) == pytest.approx(1.0)
    for a in evidence.arms:
        assert a.goodput_low <= a.goodput <= a.goodput_high
    rates, observations = evidence.acceptance["ngram"]
    assert len(rates) == 6
    assert rates[0] == pytest.approx(0.7, abs=0.1)
    assert observations[0] > 100
    assert evidence.rounds > 1000


def test_cold_start_runs_the_prior_arm_then_learns() -> None:
    policy = specctl(prior_arm="ngram/k=4", cold_start_rounds=200.0)
    first = policy.select_action("new-class", 0)
    assert first.mode == parse_arm("ngram/k=4")
    assert first.probability_of(parse_arm("ngram/k=4")) == pytest.approx(1.0)
    assert first.explanation.startswith("cold start: ngram/k=4 at 100%")
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.6})
    for _ in range(10):
        env.run_step(policy, "new-class", 0, 8)
    later = policy.select_action("new-class", 0)
    assert later.explanation.startswith("cold start"), later.explanation
    assert later.probability_of(parse_arm("ngram/k=4")) < 0.9
    for _ in range(30):
        env.run_step(policy, "new-class", 0, 8)
    assert policy.select_action("new-class", 0).explanation.startswith("thompson")


def test_cold_start_holds_the_prior_arm_in_a_class_switched_off() -> None:
    """Speculation loses here and the class switches off; while it is young it still runs
    the prior arm at the cold start's weight, whichever way the rest was decided."""
    policy = specctl(prior_arm="ngram/k=4", cold_start_rounds=1e9)
    env = SyntheticEnv(
        drafters=NGRAM, acceptance={"ngram": 0.05}, base_s=0.02, token_s=1e-4, pass_s=5e-4
    )
    for _ in range(3000):
        env.run_step(policy, "chat", 2, 64)
        if ("chat", 2) in policy.switch_off.contexts:
            break
    decision = policy.select_action("chat", 2)
    assert "; off: P(spec loses)=" in decision.explanation, decision.explanation
    assert decision.explanation.startswith("cold start: ngram/k=4 at 100%"), decision
    assert decision.probability_of(parse_arm("ngram/k=4")) >= 0.99, decision


def test_prior_arm_longer_than_offered_uses_the_longest_offered() -> None:
    policy = specctl(prior_arm="ngram/k=9")
    assert policy.select_action("chat", 0).mode == parse_arm("ngram/k=6")


def test_heavy_load_moves_to_short_k_light_load_keeps_long_k() -> None:
    """Same acceptance at both loads: only the measured step cost differs."""
    policy = specctl()
    env = SyntheticEnv(
        drafters=NGRAM, acceptance={"ngram": 0.8}, base_s=0.02, token_s=2e-4, pass_s=5e-4
    )
    for _ in range(150):
        env.run_step(policy, "chat", 0, 4)
        env.run_step(policy, "chat", 3, 256)
    light, heavy = mode_k(policy, "chat", 0), mode_k(policy, "chat", 3)
    assert light >= 4, policy.select_action("chat", 0)
    assert heavy <= 2, policy.select_action("chat", 3)


def test_switch_off_within_bound_probes_within_budget_and_recovers() -> None:
    budget = 0.02
    policy = specctl(prior_arm="ngram/k=4", probe_budget=budget)
    env = SyntheticEnv(
        drafters=NGRAM, acceptance={"ngram": 0.05}, base_s=0.02, token_s=1e-4, pass_s=5e-4
    )
    bound = int(tracking_bound_steps(SpecctlConfig().recent_discount))
    switched_at = None
    for step in range(bound):
        env.run_step(policy, "chat", 2, 64)
        if policy.select_action("chat", 2).explanation.startswith("off"):
            switched_at = step
            break
    assert switched_at is not None, policy.select_action("chat", 2)

    # switched off, it stays off (hysteresis); speculation runs only in probes, at least
    # the budget, and spread over K (a probe fixed at K=1 never measures longer drafts)
    probes = rows = 0
    probed_k: set[int] = set()
    for _ in range(300):
        _batch, decision, arms = env.run_step(policy, "chat", 2, 64)
        assert decision.explanation.startswith("off: P(spec loses)="), decision.explanation
        p_off = decision.probability_of(OFF)
        assert 0.8 - 1e-9 <= p_off <= 1.0 - budget + 1e-9, decision
        probed_k |= {a.k for a in decision.arms if not a.is_off and decision.probability_of(a)}
        probes += sum(not a.is_off for a in arms)
        rows += len(arms)
    assert budget * 0.5 <= probes / rows <= 0.1, probes / rows
    assert len(probed_k) >= 2, probed_k

    # speculation pays again: the probes find it, off is not permanent
    env.acceptance["ngram"] = 0.9
    recovered = None
    for step in range(bound):
        env.run_step(policy, "chat", 2, 64)
        if not policy.select_action("chat", 2).explanation.startswith("off"):
            recovered = step
            break
    assert recovered is not None, policy.evidence("chat", 2)
    for _ in range(bound):
        env.run_step(policy, "chat", 2, 64)
    assert mode_k(policy, "chat", 2) >= 3, policy.select_action("chat", 2)


def test_a_context_long_off_probes_less_but_never_stops() -> None:
    """Each step a context stays off is more evidence that speculation loses there: after
    its first steps off at the budget its probes shrink toward the floor, never below it,
    and a change detected in the class's acceptance puts them back at the budget."""
    budget, floor, decay = 0.02, 0.005, 100.0
    policy = specctl(
        prior_arm="ngram/k=4", probe_budget=budget, probe_floor=floor, probe_decay_steps=decay
    )
    env = SyntheticEnv(
        drafters=NGRAM, acceptance={"ngram": 0.05}, base_s=0.02, token_s=1e-4, pass_s=5e-4
    )
    for _ in range(300):
        env.run_step(policy, "chat", 2, 64)
        if policy.select_action("chat", 2).explanation.startswith("off"):
            break
    assert policy.select_action("chat", 2).explanation.startswith("off"), policy.evidence("chat", 2)
    shares = []
    for _ in range(1000):
        _batch, decision, _arms = env.run_step(policy, "chat", 2, 64)
        assert decision.explanation.startswith("off"), decision.explanation
        shares.append(1.0 - decision.probability_of(OFF))
    assert min(shares) >= floor - 1e-9
    # the budget for the first 100 steps off, half of it by 200, the floor from 400 on
    assert min(shares[:90]) >= budget - 1e-9, shares[:90]
    assert float(np.mean(shares[-200:])) <= 1.5 * floor, shares[-200:]

    # speculation pays again: the probes at the floor see it, the change is detected, and
    # the context probes at the budget again or leaves off
    env.acceptance["ngram"] = 0.9
    slot = policy.learned.class_slot["chat"]
    changes = int(policy.learned.acceptance.changes[slot])
    for _ in range(1000):
        env.run_step(policy, "chat", 2, 64)
        if policy.learned.acceptance.changes[slot] > changes:
            break
    assert policy.learned.acceptance.changes[slot] > changes, policy.evidence("chat", 2)
    decision = policy.select_action("chat", 2)
    assert 1.0 - decision.probability_of(OFF) >= budget - 1e-9, decision


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_small_class_long_off_keeps_enough_probes_to_see_a_change(seed: int) -> None:
    """A class of 24 requests a step, long off. At the 0.5% floor its recent window (about
    100 of its steps) would hold some 12 probe rounds, under the 20 a change needs, and
    with its acceptance kept until it changes it would come back only once its probes
    outweighed its past (in 7 of 10 seeds, not within 250 steps of acceptance returning).
    Its floor keeps twice the 20 probes in the window (0.4 / 24 of its rounds): the change
    is seen, or the probes bring the class back, within 250 steps (10 of 10 seeds)."""
    policy = specctl(prior_arm="ngram/k=4", probe_decay_steps=100.0)
    env = SyntheticEnv(
        drafters=NGRAM, acceptance={"ngram": 0.05}, base_s=0.02, token_s=1e-4, pass_s=3e-3,
        seed=seed,
    )  # fmt: skip
    for _ in range(800):
        env.run_step(policy, "chat", 1, 24)
    decision = policy.select_action("chat", 1)
    assert decision.explanation.startswith("off"), decision.explanation
    # 800 steps off at a decay of 100 would be at the floor; the window needs more
    assert 1.0 - decision.probability_of(OFF) == pytest.approx(0.4 / 24, rel=0.1), decision

    env.acceptance["ngram"] = 0.9
    slot = policy.learned.class_slot["chat"]
    changes = int(policy.learned.acceptance.changes[slot])
    for _ in range(250):
        env.run_step(policy, "chat", 1, 24)
        changed = policy.learned.acceptance.changes[slot] > changes
        if changed or not policy.select_action("chat", 1).explanation.startswith("off"):
            break
    else:
        raise AssertionError(policy.evidence("chat", 1))


def test_zero_acceptance_with_noisy_step_times_stays_off() -> None:
    """Speculation that accepts nothing and costs a little more is not handed half the draws.

    Step times jitter by 10% (a loaded machine) while K=1 costs 4% more than off: the
    extra cost stays uncertain around small values, and a draw that says it is zero
    must not let the hair of extra tokens the acceptance prior promises beat off.
    """
    policy = specctl()
    env = SyntheticEnv(
        drafters=NGRAM,
        acceptance={"ngram": 0.0},
        base_s=0.04,
        token_s=1e-4,
        pass_s=2e-4,
        noise_s=0.004,
    )
    p_off, expected_k = [], []
    for step in range(1200):
        _batch, decision, _arms = env.run_step(policy, "chat", 1, 16)
        if step >= 800:
            p_off.append(decision.probability_of(OFF))
            expected_k.append(sum(a.k * decision.probability_of(a) for a in decision.arms))
    assert float(np.mean(p_off)) >= 0.85, (np.mean(p_off), policy.evidence("chat", 1))
    assert float(np.mean(expected_k)) <= 0.3, np.mean(expected_k)


def test_a_round_commits_at_least_one_token_and_at_most_k_plus_one_in_every_draw() -> None:
    """An arm measured at nearly zero accepted drafts has its own measurement's normal
    draws below 0 as often as above: each draw keeps the round between its one verified
    token and its K drafts plus one."""
    policy = specctl()
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.0}, base_s=0.04, token_s=1e-4)
    for _ in range(300):
        env.run_step(policy, "chat", 1, 16)
    slot = policy.learned.class_slot["chat"]
    tokens = policy._samples(slot, 1).tokens
    ks = np.array([e.arm.k for e in policy.evidence("chat", 1).arms])
    assert tokens.min() >= 1.0
    assert (tokens <= 1.0 + ks[None, :]).all()
    assert all(e.expected_tokens >= 1.0 for e in policy.evidence("chat", 1).arms)


@pytest.mark.parametrize(("mean", "sd"), [(0.0, 1.0), (1.0, 1.0), (-2.0, 0.5), (-8.0, 1.0)])
def test_nonnegative_draws_follow_the_truncated_normal(mean: float, sd: float) -> None:
    z = np.random.default_rng(0).standard_normal(200_000)
    draws = nonnegative_draws(np.array(mean), np.array(sd), z)
    assert draws.min() >= 0.0
    # the same quantile: larger z, larger draw
    order = np.argsort(z)
    assert (np.diff(draws[order]) >= 0.0).all()
    a = mean / sd
    density = math.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi)
    expected = mean + sd * density / (0.5 * math.erfc(-a / math.sqrt(2.0)))
    assert float(draws.mean()) == pytest.approx(expected, rel=0.02)


def test_step_change_in_acceptance_is_followed_within_the_documented_bound() -> None:
    """The long memory keeps thousands of rounds; a change is detected, not waited out."""
    config = SpecctlConfig()
    bound = int(tracking_bound_steps(config.recent_discount))
    assert bound == 230
    assert tracking_bound_steps(config.discount) > 2000  # what waiting it out would take
    policy = specctl()
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.9}, token_s=5e-5)
    for _ in range(300):
        env.run_step(policy, "chat", 1, 24)
    assert mode_k(policy, "chat", 1) >= 4, policy.select_action("chat", 1)

    env.acceptance["ngram"] = 0.3
    followed = None
    for step in range(bound):
        env.run_step(policy, "chat", 1, 24)
        if mode_k(policy, "chat", 1) <= 2:
            followed = step + 1
            break
    assert followed is not None, policy.evidence("chat", 1)
    assert policy.learned.acceptance.changes[policy.learned.class_slot["chat"]] >= 1


def test_decisions_are_cached_until_their_inputs_change() -> None:
    policy = specctl()
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.6})
    env.run_step(policy, "chat", 0, 8)
    first = policy.select_action("chat", 0)
    assert policy.select_action("chat", 0) is first
    env.run_step(policy, "chat", 0, 8)
    assert policy.select_action("chat", 0) is not first


def test_switching_off_follows_what_is_learned_not_how_often_it_is_read() -> None:
    """Deciding and explaining are reads. A policy asked for its decisions and evidence
    after every report, and one never asked, learn the same state from the same reports,
    switched-off contexts included, and the reads leave every byte of the state as it was."""
    asked, never_asked = specctl(num_samples=64), specctl(num_samples=64)
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.05})
    for _ in range(60):
        batch, _decision, _arms = env.run_step(asked, "chat", 2, 64)
        never_asked.update_params(batch)
        before = asked.state_dict()
        for bucket in range(4):
            asked.select_action("chat", bucket)
            asked.evidence("chat", bucket)
        after = asked.state_dict()
        for key, value in before.items():
            assert np.asarray(after[key]).tobytes() == np.asarray(value).tobytes(), key
    assert asked.select_action("chat", 2).explanation.startswith("off"), "never switched off"
    learned = never_asked.state_dict()
    for key, value in asked.state_dict().items():
        np.testing.assert_array_equal(learned[key], value, err_msg=key)


def test_reset_class_forgets_and_the_class_cap_evicts_least_recent() -> None:
    policy = specctl(prior_arm="ngram/k=2", max_classes=2)
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.6})
    for name in ("a", "b"):
        for _ in range(20):
            env.run_step(policy, name, 0, 16)
    assert policy.evidence("a", 0).rounds > 200
    policy.reset_class("a")
    assert policy.evidence("a", 0).rounds == 0.0
    assert policy.select_action("a", 0).explanation.startswith("cold start: ngram/k=2 at 100%")

    env.run_step(policy, "a", 0, 16)
    env.run_step(policy, "c", 0, 16)  # third class: "b" was updated least recently
    assert policy.learned.classes_evicted == 1
    assert policy.evidence("b", 0).rounds == 0.0
    assert policy.evidence("a", 0).rounds > 0.0
    assert policy.evidence("c", 0).rounds > 0.0


def test_state_dict_round_trips_through_an_npz_file(tmp_path: object) -> None:
    policy = specctl(prior_arm="ngram/k=3")
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.7})
    for i in range(40):
        env.run_step(policy, ("chat", "code")[i % 2], i % 4, 32)
    path = f"{tmp_path}/state.npz"
    np.savez(path, **policy.state_dict())  # type: ignore[arg-type]
    with np.load(path, allow_pickle=False) as saved:
        state = {k: saved[k] for k in saved.files}
    state["policy_name"] = str(state["policy_name"])
    state["classes_evicted"] = float(state["classes_evicted"])

    restored = specctl(prior_arm="ngram/k=3")
    restored.load_state_dict(state)
    for name in ("chat", "code", "unknown"):
        for bucket in range(4):
            a = policy.select_action(name, bucket)
            b = restored.select_action(name, bucket)
            assert a.arms == b.arms and a.explanation == b.explanation
            np.testing.assert_allclose(a.probabilities, b.probabilities)
    env.run_step(restored, "chat", 0, 32)  # keeps learning after a restore

    with pytest.raises(ValueError, match="max_classes"):
        specctl(max_classes=3).load_state_dict(state)


def test_a_restored_policy_weighs_the_next_slow_step_as_the_saved_one_does() -> None:
    """The step-cost fit that residuals are weighed against and the change detector are
    learned too: restored, the policy treats the next preempted step exactly as before."""
    policy = specctl()
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.7}, noise_s=0.001)
    for _ in range(60):
        env.run_step(policy, "chat", 0, 16)
    restored = specctl()
    restored.load_state_dict(policy.state_dict())
    last = env.batches[-1]
    preempted = dataclasses.replace(last, step_time_s=last.step_time_s * 5.0)
    for p in (policy, restored):
        p.update_params(preempted)
    assert policy.learned.cost.outliers[0] >= 1.0
    after = restored.state_dict()
    for key, value in policy.state_dict().items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_a_state_saved_before_states_had_versions_still_loads() -> None:
    """Without ``state_version``, the keys added with it keep their prior: decisions, which
    rest on the counts and the cost statistics, come back the same."""
    policy = specctl()
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.7})
    for i in range(40):
        env.run_step(policy, ("chat", "code")[i % 2], i % 4, 32)
    added = {
        *("state_version", "rows_untracked", "class_update_clock", "acceptance_changes"),
        *("cost_fit", "cost_fit_factor", "cost_fitted", "cost_cusum", "cost_changes"),
        "cost_outliers",
    }
    old = {k: v for k, v in policy.state_dict().items() if k not in added}
    restored = specctl()
    restored.load_state_dict(old)
    for name, bucket in itertools.product(("chat", "code"), range(4)):
        a, b = policy.select_action(name, bucket), restored.select_action(name, bucket)
        np.testing.assert_array_equal(a.probabilities, b.probabilities)
    assert not restored.learned.cost.fitted.any()
    with pytest.raises(ValueError, match="'acceptance_changes' is missing"):
        restored.load_state_dict({**old, "state_version": SpecctlPolicy.state_version})
    # a state of an older layout is refused whole, with the version it was saved at
    version = SpecctlPolicy.state_version
    with pytest.raises(ValueError, match=f"state_version=1; this policy reads version {version}"):
        restored.load_state_dict({**policy.state_dict(), "state_version": 1})


def test_parameters_are_validated_with_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"specctl policy: unknown parameters \['discont'\]"):
        make_policy("specctl", {"discont": 0.99})
    with pytest.raises(ValueError, match=r"specctl policy: discount=2 must be in \(0.5, 1\]"):
        make_policy("specctl", {"discount": 2})
    with pytest.raises(ValueError, match="probe_budget"):
        make_policy("specctl", {"probe_budget": 0.9})
    with pytest.raises(ValueError, match="prior_arm"):
        make_policy("specctl", {"prior_arm": "ngram/k=x"})
    with pytest.raises(ValueError, match="strictly increasing"):
        make_policy("specctl", {"load_bucket_bounds": [8, 8]})
    with pytest.raises(ValueError, match="must not exceed switch_off_confidence"):
        make_policy("specctl", {"switch_on_confidence": 0.99})
    policy = make_policy(
        "specctl", {"discount": 0.995, "probe_budget": 0.02, "prior_arm": "ngram/k=4"}
    )
    with pytest.raises(ValueError, match=r"load_bucket=4 must be in 0\.\.3"):
        policy.select_action("chat", 4)


def test_drafters_beyond_capacity_are_refused_or_counted() -> None:
    policy = specctl(max_drafters=1)
    with pytest.raises(ValueError, match="drafter 'eagle3' exceeds max_drafters=1"):
        policy.set_arms(arms_for([("ngram", 2), ("eagle3", 2)]))
    # a report from an engine running a drafter the policy does not track: learned from
    # as rounds, counted, and nothing else lost
    both = {"ngram": 2, "eagle3": 2}
    env = SyntheticEnv(drafters=both, acceptance={"ngram": 0.5, "eagle3": 0.5})
    other = make_policy("static", {"arm": "eagle3/k=2"})
    other.set_arms(arms_for(both.items()))
    batch, _, _ = env.run_step(other, "chat", 0, 8)
    policy.update_params(batch)
    assert policy.learned.rows_untracked == 8
    assert policy.evidence("chat", 0).rounds == 8.0


# -- classes sharing a batch ----------------------------------------------------


def _shared_batch_env() -> SyntheticEnv:
    # a drafter pass costs 5 ms for the whole batch at the batch's deepest K, a verified
    # token 0.1 ms, a step 10 ms: a class accepting 0.8 per position gains from K=1..2
    # when it is the whole batch (off 1.38 tokens/ms; K=1 1.58, K=2 1.57), but next to an
    # equal number of requests that accept nothing, its K=1 lengthens their step too and
    # the batch commits fewer tokens per ms than with speculation off (1.29 against 1.38)
    return SyntheticEnv(
        drafters={"ngram": 4}, acceptance={}, base_s=0.01, token_s=1e-4, pass_s=5e-3, seed=4
    )


def _off_share(policy: SpecctlPolicy, name: str, bucket: int) -> float:
    return policy.select_action(name, bucket).probability_of(OFF)


def test_a_class_alone_speculates_where_it_gains() -> None:
    policy = make_policy("specctl", {})
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for({"ngram": 4}.items()))
    env = _shared_batch_env()
    for _ in range(600):
        env.run_mixed_step(policy, {"copy": (16, 0.8)}, 2)
    assert _off_share(policy, "copy", 2) < 0.2
    assert policy.select_action("copy", 2).mode.k in (1, 2)


def test_classes_sharing_a_batch_are_decided_for_the_batch() -> None:
    policy = make_policy("specctl", {})
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for({"ngram": 4}.items()))
    env = _shared_batch_env()
    chosen: list[dict[str, Arm]] = []
    for _ in range(600):
        chosen.append(env.run_mixed_step(policy, {"copy": (8, 0.8), "free": (8, 0.0)}, 2))
    # the class that gains alone is switched off for the batch's sake, and both stay off
    assert _off_share(policy, "free", 2) > 0.9
    assert _off_share(policy, "copy", 2) > 0.8
    late = chosen[-200:]
    assert sum(c["copy"].is_off for c in late) >= 0.8 * len(late)
    # the evidence speaks in the batch's goodput: copy's off beats its K=1
    evidence = {a.arm.name: a for a in policy.evidence("copy", 2).arms}
    assert evidence["off"].goodput > evidence["ngram/k=1"].goodput


def test_classes_taking_turns_in_a_bucket_are_decided_alone() -> None:
    # the same two classes as above, in the same bucket, but never in one step (each
    # arrives in bursts, one batch after another): the batch-wide cost of copy's drafts is
    # paid by copy's requests alone, so copy speculates as it does alone
    policy = make_policy("specctl", {})
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for({"ngram": 4}.items()))
    env = _shared_batch_env()
    chosen: list[Arm] = []
    for i in range(1200):
        if (i // 20) % 2:
            env.run_mixed_step(policy, {"free": (16, 0.0)}, 2)
        else:
            chosen.append(env.run_mixed_step(policy, {"copy": (16, 0.8)}, 2)["copy"])
    assert _off_share(policy, "copy", 2) < 0.2
    assert _off_share(policy, "free", 2) > 0.8
    late = chosen[-200:]
    assert sum(c.is_off for c in late) <= 0.2 * len(late)


@pytest.mark.parametrize("seed", range(5))
def test_without_batch_wide_costs_each_class_of_a_batch_gets_its_own_best_arm(seed: int) -> None:
    """A class's slots last as long as its tokens take: where drafting costs nothing for the
    whole batch, the choice that serves the classes' work fastest gives each class the arm
    best for its own goodput, however much more the other classes commit per round (at
    the batch's mix of the moment, a class accepting less than the others looked better
    off for the batch than at its own best arm)."""
    rng = np.random.default_rng(seed)
    draws, arms, classes = 64, 9, 4
    off = rng.uniform(0.02, 0.04, draws)
    batch = 32.0
    # per-request extra time of each arm, growing with K; tokens per round, each class its own
    per_request = np.cumsum(rng.uniform(0.0, 0.001, (draws, arms)), axis=1)
    per_request[:, 0] = 0.0
    tokens = []
    for c in range(classes):
        gain = np.cumsum(rng.uniform(0.0, 0.4 + 0.5 * c, (draws, arms)), axis=1)
        gain[:, 0] = 0.0
        tokens.append(1.0 + gain)
    step = off[:, None] + batch * per_request
    game = JointChoice(
        off,
        [per_request] * classes,
        np.zeros((draws, arms)),
        np.r_[-1, np.zeros(arms - 1, dtype=np.int64)],
        1,
        batch,
        rng.uniform(0.5, 2.0, classes),
        tokens,
        step,
    )
    best = game.best(tokens)
    own = np.stack([np.argmax(t / step, axis=1) for t in tokens], axis=1)
    np.testing.assert_array_equal(best, own)


def test_a_free_first_draft_token_is_found_from_long_drafts() -> None:
    # A draft model's first token rides on the pass that keeps its cache in step (it runs
    # at off too), its second costs a pass of its own: K=1 is next to free, K=2 a jump.
    # Starting at the engine's K=4, a line through K fitted on long steps says K=1 costs
    # what the line says; the policy must try the short draft and keep it.
    policy = make_policy("specctl", {"prior_arm": "draft_model/k=4"})
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for({"draft_model": 4}.items()))
    env = SyntheticEnv(
        drafters={"draft_model": 4},
        acceptance={},
        base_s=0.055,
        token_s=5e-4,
        pass_s=0.008,
        second_pass_s=0.017,
        noise_s=0.006,
        seed=0,
    )
    classes = {"greedy": (1, 0.72), "warm": (1, 0.45), "hot": (1, 0.0)}
    depth = [max(a.k for a in env.run_mixed_step(policy, classes, 0).values()) for _ in range(600)]
    # the batch's best: K=1 for the classes that accept, off (or the free K=1) for the other
    late = depth[-200:]
    assert sum(k <= 1 for k in late) >= 0.9 * len(late), late
    for name in ("greedy", "warm"):
        assert policy.select_action(name, 0).mode.k == 1


# -- the step's own drafting -------------------------------------------------------------------


def _lagged_policy(
    report_draft_k: bool,
    seed: int = 0,
    ks: tuple[int, ...] = (1, 3),
    verify_jump_s: float = 0.0,
) -> SpecctlPolicy:
    """An engine as vLLM runs it: a step verifies the drafts of the arm chosen one step
    before, and drafts at the K chosen now, for the whole batch; its time is
    ``base + verification + passes at this step's K``. The K changes from step to step.
    ``verify_jump_s`` is what a request verifying two drafts or more adds to the target's
    pass beyond the line through tokens (the testbed's CPU attention)."""
    policy = make_policy("specctl", {})
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for([("draft_model", 3)]))
    rng = np.random.default_rng(seed)
    previous = 1
    for step in range(600):
        k = int(rng.choice(ks))  # this step's arm: its drafts are verified next step
        drafted = [previous] * 4
        accepted = [int(min(rng.geometric(0.4) - 1, previous)) for _ in drafted]
        time_s = 0.05 + 0.0005 * (4 + sum(drafted)) + 0.03 * (k >= 2) + 0.01 * k
        time_s += verify_jump_s * 4 * (previous >= 2)
        record = StepRecord(
            step_index=step + 1, step_time_s=time_s * (1 + 0.02 * rng.standard_normal()),
            batch_size=4, num_scheduled_tokens=4 + sum(drafted), policy_version=1,
            load_bucket=0, step_end_unix_s=1e9 + step, classes=["chat"] * 4,
            arms=[f"draft_model/k={previous}"] * 4, propensity=[0.5] * 4, drafted=drafted,
            accepted=accepted, draft_k=k if report_draft_k else -1,
        )  # fmt: skip
        batch = decode_step_report(
            encode_step_report(step + 1, [record]), engine_id="e", offered={"draft_model": 3},
            num_load_buckets=4, batch_drafter="draft_model",
        )  # fmt: skip
        policy.update_params(batch)
        previous = k
    return policy


def _step_time_gap(policy: SpecctlPolicy, long_k: int = 3) -> float:
    times = {a.arm.k: a.expected_step_time_s for a in policy.evidence("chat", 0).arms}
    return times[long_k] - times[1]


def test_the_steps_own_drafting_k_is_what_its_time_is_learned_against() -> None:
    """K=3 costs 50 ms more than K=1 (a second pass and two draft tokens). Read from the
    rows' arms, which lag the drafting by a step, the gap all but vanishes."""
    assert _step_time_gap(_lagged_policy(report_draft_k=True)) == pytest.approx(0.05, rel=0.3)
    assert _step_time_gap(_lagged_policy(report_draft_k=False)) < 0.02


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_target_pass_that_jumps_at_two_drafts_is_learned_apart_from_the_drafting(
    seed: int,
) -> None:
    """Verifying two drafts costs a request 5 ms more than the line through tokens says,
    on top of the drafter's second pass. K varies from step to step, so a step's drafted
    and verified K differ: with the jump on the drafting side only, the fit splits it
    over features that cannot hold it, and K=2 looks cheaper than it is. K=2 costs
    30 + 10 + 2 (tokens) + 20 (the jump, 4 requests) = 62 ms more than K=1."""
    policy = _lagged_policy(True, seed, ks=(1, 2, 3), verify_jump_s=0.005)
    assert _step_time_gap(policy, long_k=2) == pytest.approx(0.062, rel=0.15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steps_without_speculation_are_kept_where_every_class_speculates(seed: int) -> None:
    """Speculation doubles this class's goodput, so it all but never runs off; a step with
    any drafts costs 6 ms more than one without, whatever K. Without steps free of
    speculation that 6 ms cannot be told from the step's base cost: the fit splits it and
    off looks 12% dearer than it is. Off as control, at the share the fixed count of such
    steps asks (``control_z`` so large that the decision always needs it), keeps such steps
    in the bucket's memory and the cost of off measured."""
    true_off_s = 0.02 + 1e-4 * 8

    def learned_off(control_share: float) -> float:
        policy = specctl(control_share=control_share, control_z=1e6)
        env = SyntheticEnv(
            drafters=NGRAM, acceptance={"ngram": 0.9}, base_s=0.02, token_s=1e-4,
            pass_s=0.002, spec_fixed_s=0.006, noise_s=1e-3, seed=seed,
        )  # fmt: skip
        for _ in range(800):
            env.run_mixed_step(policy, {"chat": (8, 0.9)}, 0)
        assert policy.select_action("chat", 0).probability_of(OFF) <= 0.05
        times = {a.arm: a.expected_step_time_s for a in policy.evidence("chat", 0).arms}
        return times[OFF]

    assert learned_off(0.05) == pytest.approx(true_off_s, rel=0.04)
    assert learned_off(0.0) > 1.08 * true_off_s


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_off_as_control_is_kept_only_while_the_decision_needs_it(seed: int) -> None:
    """The same class, with speculation twice off's goodput: the posterior of the chosen
    arm's extra step time over off, 6 ms give or take a few, cannot make off the better
    arm, so the decision needs no steps without speculation and the control fades. Held
    at the fixed count of such steps in the bucket's memory instead, off runs on 1-3% of
    the rounds for as long as the class runs."""

    def late_off_share(**params: float) -> float:
        policy = specctl(**params)
        env = SyntheticEnv(
            drafters=NGRAM, acceptance={"ngram": 0.9}, base_s=0.02, token_s=1e-4,
            pass_s=0.002, spec_fixed_s=0.006, noise_s=1e-3, seed=seed,
        )  # fmt: skip
        late = 0
        for step in range(800):
            chosen = env.run_mixed_step(policy, {"chat": (8, 0.9)}, 0)
            late += step >= 400 and chosen["chat"] == OFF
        assert policy.select_action("chat", 0).probability_of(OFF) <= 0.05
        return late / 400

    assert late_off_share() <= 0.005
    assert late_off_share(control_z=1e6) >= 0.01


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_ngram_arm_is_charged_for_the_drafts_it_proposes(seed: int) -> None:
    """An n-gram lookup finds a match in 30% of a copying class's rounds and proposes
    nothing in the rest; a match is accepted 90% a position. A step costs 2 ms per token
    verified, so n-gram arms gain 19-26% over off (off 222 tokens/s, ngram/k=2 265,
    k=4 280). Charged as if every round verified K drafts, every n-gram arm looks
    slower than off (k=2: 178) and the class runs off."""
    policy = specctl()
    env = SyntheticEnv(
        drafters=NGRAM, acceptance={"ngram": 0.9}, match_rate={"ngram": 0.3},
        base_s=0.02, token_s=2e-3, pass_s=0.0, noise_s=1e-3, seed=seed,
    )  # fmt: skip
    for _ in range(600):
        env.run_step(policy, "copy", 0, 8)
    decision = policy.select_action("copy", 0)
    assert decision.probability_of(OFF) < 0.1, decision.explanation


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_ngram_k_the_class_has_not_run_is_charged_at_its_match_rate(seed: int) -> None:
    """The same copying class (a match in 30% of its rounds) has run n-gram drafts at K=4
    and K=1 only. Whether a round finds a match does not depend on K, so K=2 verifies
    what the class's matches propose, 0.6 drafts a round: its step is 8 requests x 1.6
    tokens x 2 ms over the 20 ms base, 45.6 ms, cheaper than K=4's 55.2. Charged as if
    K=2's rounds proposed both drafts until the class runs it, K=2 costs 68 ms, more than
    K=4, and Thompson sampling, which ranks it behind K=4, never finds out."""
    policy = specctl()
    env = SyntheticEnv(
        drafters=NGRAM, acceptance={}, match_rate={"ngram": 0.3},
        base_s=0.02, token_s=2e-3, pass_s=0.0, noise_s=1e-3, seed=seed,
    )  # fmt: skip
    for step in range(400):
        k = 4 if step % 4 else (0 if step % 8 else 1)
        arm = OFF if k == 0 else Arm("ngram", k)
        ks = np.where(env.rng.random(8) < 0.3, k, 0)
        env._learn(
            policy, 0, ks, np.full(8, 0.9), classes=["copy"] * 8, arms=[arm.name] * 8,
            propensity=[1.0] * 8,
        )  # fmt: skip
    times = {a.arm: a.expected_step_time_s for a in policy.evidence("copy", 0).arms}
    assert times[Arm("ngram", 2)] == pytest.approx(0.02 + 8 * 1.6 * 2e-3, rel=0.08)
    assert times[Arm("ngram", 2)] < times[Arm("ngram", 4)]


def test_only_the_engines_batch_drafter_has_batch_wide_cost() -> None:
    """A model drafter the engine runs for the whole batch, and n-gram lookups the
    scheduler runs per request beside it. The n-gram drafter's batch-wide features stay
    empty, its draws carry no batch-wide cost, and a class whose n-gram drafts pay at a
    batch of 32 runs them: off on few of its rounds."""
    policy = specctl(prior_arm="draft_model/k=2")
    offered = {"draft_model": 4, "ngram": 4}
    policy.set_arms(arms_for(offered.items()))
    env = SyntheticEnv(
        drafters=offered, acceptance={}, batch_drafter="draft_model",
        base_s=0.05, token_s=1e-3, pass_s=0.004, second_pass_s=0.01, noise_s=0.004, seed=2,
    )  # fmt: skip
    classes = {"chat": (16, 0.2), "copy": (16, 0.85)}
    copy_arms = [env.run_mixed_step(policy, classes, 2)["copy"] for _ in range(500)]
    cost = policy.learned.cost
    model, ngram = (policy.learned.drafter_slot[d] for d in ("draft_model", "ngram"))
    assert cost.batch_wide[model] and not cost.batch_wide[ngram]
    for offset in (2, 3):
        column = int(drafter_feature(ngram, offset))
        assert not cost.xtx[:, column, :].any(), offset
        assert cost.xtx[2, int(drafter_feature(model, offset)), 0] > 0.0
    late = copy_arms[-200:]
    assert sum(a.drafter == "ngram" for a in late) >= 0.9 * len(late), late


def _feed_ngram_step(
    policy: SpecctlPolicy,
    rng: np.random.Generator,
    step: int,
    classes: list[str],
    drafted: list[int],
    time_s: float,
) -> None:
    """One one-step report of a batch of 8 on n-gram drafts: each request at its own K
    (``drafted``), accepting geometrically, the step's time before a 2% noise."""
    _feed_step(policy, rng, step, classes, [f"ngram/k={k}" for k in drafted], time_s, NGRAM)


def _feed_step(
    policy: SpecctlPolicy,
    rng: np.random.Generator,
    step: int,
    classes: list[str],
    arms: list[str],
    time_s: float,
    offered: dict[str, int],
) -> None:
    """One one-step report of a batch of 8, each request at its own arm, accepting
    geometrically, the step's time before a 2% noise."""
    drafted = [parse_arm(a).k for a in arms]
    accepted = [int(min(rng.geometric(0.4) - 1, k)) for k in drafted]
    record = StepRecord(
        step_index=step + 1, step_time_s=time_s * (1 + 0.02 * rng.standard_normal()),
        batch_size=8, num_scheduled_tokens=8 + sum(drafted), policy_version=1,
        load_bucket=0, step_end_unix_s=1e9 + step, classes=classes,
        arms=arms, propensity=[0.2] * 8, drafted=drafted,
        accepted=accepted,
    )  # fmt: skip
    batch = decode_step_report(
        encode_step_report(step + 1, [record]), engine_id="e", offered=offered,
        num_load_buckets=4,
    )  # fmt: skip
    policy.update_params(batch)


def _ngram_policy(
    params: dict[str, int],
    steps: int,
    seed: int,
    batch_of: Callable[[np.random.Generator, int], tuple[list[str], float]],
) -> SpecctlPolicy:
    """A policy fed ``steps`` one-step reports of a batch of 8 on n-gram drafts, each step
    at one K drawn at random; ``batch_of(rng, k)`` gives the step's classes and its time
    before a 2% noise."""
    policy = make_policy("specctl", {**params, "seed": seed})
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for(NGRAM.items()))
    rng = np.random.default_rng(seed)
    for step in range(steps):
        k = int(rng.integers(1, 7))
        classes, time_s = batch_of(rng, k)
        _feed_ngram_step(policy, rng, step, classes, [k] * 8, time_s)
    return policy


def _kinked_policy(k_columns: int, steps: int, seed: int = 0) -> SpecctlPolicy:
    """A drafter whose step cost is a line in K with a step up from K=4 on (3 ms a request
    more, as a kernel tile or a captured graph size makes on a GPU). Each step runs one K
    for its batch of 8, at random."""

    def batch_of(rng: np.random.Generator, k: int) -> tuple[list[str], float]:
        return ["chat"] * 8, 0.02 + 0.001 * 8 * k + 0.003 * 8 * (k >= 4)

    params = {"cost_k_columns": k_columns, "cost_pair_columns": 0}
    return _ngram_policy(params, steps, seed, batch_of)


def _step_times(policy: SpecctlPolicy) -> dict[int, float]:
    return {a.arm.k: a.expected_step_time_s for a in policy.evidence("chat", 0).arms}


@pytest.mark.parametrize("seed", [0, 1])
def test_a_step_in_cost_between_two_k_is_learned_by_the_arms_own_columns(seed: int) -> None:
    """K=3 to 4 costs 8 + 24 = 32 ms, K=2 to 3 only 8. The line through K alone spreads
    the step over every K; with a column per K the jump is where it is."""
    times = _step_times(_kinked_policy(16, 600, seed))
    assert times[4] - times[3] == pytest.approx(0.032, rel=0.25)
    assert times[3] - times[2] == pytest.approx(0.008, abs=0.006)
    line = _step_times(_kinked_policy(0, 600, seed))
    assert line[4] - line[3] < 0.02


def test_an_arms_own_column_counts_nothing_until_its_steps_show_it() -> None:
    """Soft thresholding: with a handful of steps the columns are exactly 0, the line's
    price; the arms' columns never add to what is explored."""
    policy = _kinked_policy(16, 6)
    cost = policy.learned.cost
    mean, factor = cost.posterior(0, policy.learned.typical_features(0))
    assert not mean[cost.arm_start :].any()
    assert not factor[cost.arm_start :].any() and not factor[:, cost.arm_start :].any()


def _two_class_policy(class_columns: int, steps: int, seed: int = 0) -> SpecctlPolicy:
    """Classes ``short`` and ``long`` that accept alike, where a speculating request of
    ``long`` costs 4 ms more at every K (a longer context to verify against). Each step
    runs one K for its batch of 8, whose mix of the two classes varies."""

    def batch_of(rng: np.random.Generator, k: int) -> tuple[list[str], float]:
        n_long = int(rng.binomial(8, 0.5))
        classes = ["long"] * n_long + ["short"] * (8 - n_long)
        return classes, 0.02 + 0.001 * 8 * k + 0.004 * n_long

    return _ngram_policy({"cost_class_columns": class_columns}, steps, seed, batch_of)


def _class_prices(policy: SpecctlPolicy) -> dict[str, float]:
    learned = policy.learned
    slot = learned.drafter_slot["ngram"]
    out = {}
    for name in ("long", "short"):
        price = learned.cost.class_price(0, learned.class_slot[name])
        out[name] = 0.0 if price is None else float(price[slot])
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_a_class_whose_rounds_cost_more_gets_its_own_price(seed: int) -> None:
    """The line prices the mix's average request; the classes' own columns tell that a
    request of ``long`` costs more than one of ``short`` at every K. The price is
    soft-thresholded where the split between a class's column and the line is uncertain
    too, so it moves toward the truth (4 ms) and never past it."""
    prices = _class_prices(_two_class_policy(16, 1500, seed))
    assert prices["long"] > 0.0 > prices["short"]
    assert 0.0006 < prices["long"] - prices["short"] < 0.004
    assert _class_prices(_two_class_policy(0, 200, seed)) == {"long": 0.0, "short": 0.0}


def _class_shaped_policy(pair_columns: int, steps: int, seed: int) -> SpecctlPolicy:
    """Classes ``long`` and ``short`` on n-gram drafts, each request of a step at its
    class's own K drawn at random, where a ``long`` request costs 4 ms more from K=4 on
    and a ``short`` one does not: the step in cost over K is the class's own."""
    policy = make_policy("specctl", {"cost_pair_columns": pair_columns, "seed": seed})
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for(NGRAM.items()))
    rng = np.random.default_rng(seed)
    for step in range(steps):
        k_long, k_short = (int(k) for k in rng.integers(1, 7, size=2))
        classes = ["long"] * 4 + ["short"] * 4
        drafted = [k_long] * 4 + [k_short] * 4
        time_s = 0.02 + 0.001 * sum(drafted) + 0.004 * 4 * (k_long >= 4)
        _feed_ngram_step(policy, rng, step, classes, drafted, time_s)
    return policy


def _kink(policy: SpecctlPolicy, name: str) -> float:
    """What a step pays from the class's K=3 to K=4 beyond K=2 to K=3, as believed (the
    class's half of the batch moving, the other half at its own choice)."""
    t = {a.arm.k: a.expected_step_time_s for a in policy.evidence(name, 0).arms}
    return (t[4] - t[3]) - (t[3] - t[2])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_class_whose_cost_steps_up_at_a_k_of_its_own_is_priced_so(seed: int) -> None:
    """``long`` pays 4 ms a request more from K=4 on, ``short`` nothing: 16 ms a step for
    its four requests against 0. The arms' columns price the mix's step, the same for
    every class; the pairs' deviations put it on the class that pays it (soft-thresholded,
    so short of the truth, never past it)."""
    shaped = _class_shaped_policy(64, 2000, seed)
    assert 0.008 < _kink(shaped, "long") < 0.017
    assert abs(_kink(shaped, "short")) < 0.004
    mixed = _class_shaped_policy(0, 2000, seed)
    assert abs(_kink(mixed, "long") - _kink(mixed, "short")) < 0.002


TWO_DRAFTERS = {"ngram": 4, "eagle3": 4}


def _drafter_priced_policy(centring: str, steps: int, seed: int) -> SpecctlPolicy:
    """Classes ``dear`` and ``plain``, four requests each a step, each class at a drafter
    and K of its own drawn at random, where a ``dear`` request drafting with EAGLE-3
    costs 4 ms more and a ``plain`` one does not: the class's context makes one drafter
    dearer than the mix says. The class's own price per drafter is left out
    (``cost_class_columns`` 0), so what prices it is the pairs'."""
    policy = make_policy(
        "specctl",
        {"cost_class_columns": 0, "cost_pair_centring": centring, "seed": seed},
    )
    assert isinstance(policy, SpecctlPolicy)
    policy.set_arms(arms_for(TWO_DRAFTERS.items()))
    rng = np.random.default_rng(seed)
    for step in range(steps):
        drafters = [str(d) for d in rng.choice(["ngram", "eagle3"], size=2)]
        ks = [int(k) for k in rng.integers(1, 5, size=2)]
        arms = [f"{drafters[0]}/k={ks[0]}"] * 4 + [f"{drafters[1]}/k={ks[1]}"] * 4
        time_s = (
            0.02 + 0.001 * 4 * sum(ks) + 0.002 * 4 * drafters.count("eagle3")
            + 0.004 * 4 * (drafters[0] == "eagle3")
        )  # fmt: skip
        _feed_step(policy, rng, step, ["dear"] * 4 + ["plain"] * 4, arms, time_s, TWO_DRAFTERS)
    return policy


def _drafter_gap(policy: SpecctlPolicy, name: str) -> float:
    """What a step pays for the class's half of the batch drafting with EAGLE-3 rather
    than n-grams, at K=2, as believed."""
    t = {a.arm.name: a.expected_step_time_s for a in policy.evidence(name, 0).arms}
    return t["eagle3/k=2"] - t["ngram/k=2"]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_class_whose_one_drafter_costs_more_than_the_mix_says_is_priced_so(
    seed: int,
) -> None:
    """A half batch on EAGLE-3 rather than n-grams costs ``plain`` 8 ms a step and
    ``dear`` 24 ms; the mix's drafter terms price both at their average. Centred per
    class, the pairs move each class most of the way to its own (soft-thresholded, so
    ``dear`` short of the truth); centred per class and drafter they read only each
    drafter's shape over K, and both classes keep the mix's price."""
    by_class = _drafter_priced_policy("class", 3000, seed)
    dear, plain = _drafter_gap(by_class, "dear"), _drafter_gap(by_class, "plain")
    assert 0.016 < dear < 0.024
    assert plain < 0.009
    assert dear - plain > 0.010
    by_drafter = _drafter_priced_policy("class-drafter", 3000, seed)
    assert abs(_drafter_gap(by_drafter, "dear") - _drafter_gap(by_drafter, "plain")) < 0.002
    with pytest.raises(ValueError, match="cost_pair_centring='drafter' must be one of class"):
        make_policy("specctl", {"cost_pair_centring": "drafter"})


def test_a_class_slot_given_to_another_class_drops_its_pairs() -> None:
    """A pair's deviation is the class's: the slot's next class starts at the cost
    model's price, and the other class keeps its own."""
    policy = _class_shaped_policy(64, 600, 0)
    pairs = policy.learned.cost.pairs
    assert pairs is not None
    slot = policy.learned.class_slot["long"]
    assert (pairs.pair[0, :, 0] == slot).any()
    other = (pairs.pair[0, :, 0] >= 0) & (pairs.pair[0, :, 0] != slot)
    kept = pairs.pair[0, other].copy()
    policy.learned.forget("long")
    assert not (pairs.pair[:, :, 0] == slot).any()
    assert (pairs.column[:, slot] == -1).all()
    np.testing.assert_array_equal(pairs.pair[0, other], kept)


def test_a_class_price_and_an_arms_column_reach_a_cold_replica_through_the_fleet() -> None:
    """What one replica learned of a class's own price and of an arm's own column is
    shared by name: a cold replica that slots its classes in another order merges it
    into its own columns and prices the classes and the arms as the peer does."""
    for peer, prices in (
        (_two_class_policy(16, 1500), True),
        (_kinked_policy(16, 600), False),
    ):
        cold = make_policy("specctl", {})
        assert isinstance(cold, SpecctlPolicy)
        cold.set_arms(arms_for(NGRAM.items()))
        cold.learned.slot_of_class("met-first")  # its classes sit in other slots
        cold.merge_shared(peer.contribution())
        if prices:
            mine, theirs = _class_prices(cold), _class_prices(peer)
            assert theirs["long"] > 0.0 > theirs["short"], theirs
            assert cold.learned.class_slot["long"] != peer.learned.class_slot["long"]
            for name in ("long", "short"):
                assert mine[name] == pytest.approx(theirs[name], rel=0.2), (mine, theirs)
        else:
            mine_t, theirs_t = _step_times(cold), _step_times(peer)
            assert theirs_t[4] - theirs_t[3] > 0.02, theirs_t
            assert mine_t[4] - mine_t[3] == pytest.approx(theirs_t[4] - theirs_t[3], rel=0.2)


def test_a_class_price_counts_nothing_until_the_steps_show_it_and_goes_with_its_slot() -> None:
    """With a handful of steps a class costs the mix's price; a class slot handed to
    another class drops the price the slot had learned."""
    assert _class_prices(_two_class_policy(16, 8)) == {"long": 0.0, "short": 0.0}
    policy = _two_class_policy(16, 1500)
    learned = policy.learned
    slot = learned.class_slot["long"]
    assert learned.cost.class_price(0, slot) is not None
    learned.forget("long")
    assert learned.cost.class_price(0, slot) is None
    cols = slice(learned.cost.class_start + slot * learned.cost.num_drafters, None)
    assert not learned.cost.xtx[:, cols][:, : learned.cost.num_drafters].any()


def test_tempered_draws_concentrate_the_speculative_arms_and_leave_off_alone() -> None:
    """``posterior_scale`` below 1 tempers the choice among the speculative arms only: on
    the same reports the distribution holds more on its most likely arm, and ``off`` keeps
    exactly its posterior probability of being best."""
    wide, narrow = specctl(), specctl(posterior_scale=0.5)
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.7}, seed=5)
    for _ in range(40):
        env.run_step(wide, "chat", 0, 8)
    for batch in env.batches:
        narrow.update_params(batch)
    w, n = wide.select_action("chat", 0), narrow.select_action("chat", 0)
    assert w.explanation.startswith("thompson") and n.explanation.startswith("thompson")
    assert n.probability_of(n.mode) > w.probability_of(w.mode) + 0.05, (w, n)
    assert n.probability_of(OFF) == pytest.approx(w.probability_of(OFF), abs=1e-12), (w, n)
    with pytest.raises(ValueError, match="posterior_scale"):
        make_policy("specctl", {"posterior_scale": 0.0})


def test_tempered_draws_switch_off_on_the_same_evidence() -> None:
    """The switch-off reads the untempered posterior: on the same reports a class where
    speculation loses switches off at the same step however narrow the choice among the
    speculative arms."""
    wide, narrow = specctl(), specctl(posterior_scale=0.3)
    env = SyntheticEnv(
        drafters=NGRAM, acceptance={"ngram": 0.05}, base_s=0.02, token_s=1e-4, pass_s=5e-4
    )
    for step in range(3000):
        env.run_step(wide, "chat", 2, 64)
        narrow.update_params(env.batches[-1])
        assert narrow.switch_off.contexts == wide.switch_off.contexts, step
        if ("chat", 2) in wide.switch_off.contexts:
            break
    assert ("chat", 2) in narrow.switch_off.contexts
    w, n = wide.select_action("chat", 2), narrow.select_action("chat", 2)
    assert n.probability_of(OFF) == pytest.approx(w.probability_of(OFF), abs=1e-12), (w, n)
