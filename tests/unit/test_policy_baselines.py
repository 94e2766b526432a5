"""The peers' rules behind the policy interface: each does what its original does."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_env import SyntheticEnv

from specctl.arms import OFF, arms_for, parse_arm
from specctl.policy.base import Policy
from specctl.policy.registry import DEFAULT_POLICY, POLICIES, make_policy
from specctl.policy.vllm_table import parse_table, table_k

NGRAM = {"ngram": 8}
LEARNING = sorted(name for name, cls in POLICIES.items() if not cls.stationary)
BUCKETED = sorted(name for name, cls in POLICIES.items() if cls.uses_load_buckets)


def offered(
    policy_name: str, params: dict[str, object] | None = None, drafters: dict[str, int] = NGRAM
) -> Policy:
    policy = make_policy(policy_name, params or {})
    policy.set_arms(arms_for(drafters.items()))
    return policy


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from(LEARNING),
    drafters=st.dictionaries(
        st.sampled_from(["ngram", "eagle3"]), st.integers(1, 6), min_size=0, max_size=2
    ),
    rate=st.floats(0.0, 1.0),
    bucket=st.integers(0, 3),
)
def test_every_policy_decides_over_offered_arms_only(
    name: str, drafters: dict[str, int], rate: float, bucket: int
) -> None:
    policy = make_policy(name, {})
    arms = arms_for(drafters.items())
    policy.set_arms(arms)
    env = SyntheticEnv(drafters=drafters, acceptance=dict.fromkeys(drafters, rate))
    for _ in range(12):
        env.run_step(policy, "chat", bucket, 16)
    decision = policy.select_action("chat", bucket)
    assert set(decision.arms) <= set(arms)
    assert decision.probabilities.sum() == pytest.approx(1.0)
    assert policy.evidence("chat", bucket).explanation == decision.explanation


def test_registry_has_every_policy_and_specctl_is_the_default() -> None:
    assert DEFAULT_POLICY == "specctl"
    assert {
        "static",
        "specctl",
        "vllm-batch-table",
        "sglang-ema",
        "banditspec-ucb",
        "trtllm-threshold",
        "epsilon-greedy",
    } <= set(POLICIES)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")


@pytest.mark.parametrize("name", BUCKETED)
def test_the_callers_load_buckets_reach_every_bucketed_policy(name: str) -> None:
    policy = make_policy(name, {}, load_bucket_bounds=[4, 16, 64, 256])
    policy.set_arms(arms_for(NGRAM.items()))
    assert policy.select_action("chat", 4).probabilities.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"load_bucket_bounds=\[8\] differs from"):
        make_policy(name, {"load_bucket_bounds": [8]}, load_bucket_bounds=[4, 16])
    static = make_policy("static", {"arm": "off"}, load_bucket_bounds=[4, 16])
    assert static.select_action("chat", 2).mode == OFF


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("vllm-batch-table", {"table": {"2": 4}}, "first range must start at 1"),
        ("vllm-batch-table", {"table": [[1, 8, 4], [4, 16, 2]]}, "overlap at batch size 4"),
        ("vllm-batch-table", {"tabel": {}}, r"unknown parameters \['tabel'\]"),
        ("sglang-ema", {"candidate_steps": [3]}, "2 distinct values"),
        ("sglang-ema", {"ema_alpha": 0}, r"ema_alpha=0 must be in \(0, 1\]"),
        ("banditspec-ucb", {"exploration": -1}, "exploration=-1"),
        ("trtllm-threshold", {"arm": "off"}, "nothing to switch off"),
        ("trtllm-threshold", {"acceptance_window": 0}, "acceptance_window=0"),
        ("epsilon-greedy", {"epsilon": 1.5}, r"epsilon=1.5 must be in \[0, 1\]"),
        ("epsilon-greedy", {"load_bucket_bounds": [32, 8]}, "strictly increasing"),
    ],
)
def test_bad_parameters_name_the_policy_and_the_parameter(
    name: str, params: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{name} policy: .*{message}"):
        make_policy(name, params)


# -- vLLM batch-size table ----------------------------------------------------


def test_vllm_table_forms_follow_vllm_lookup_rules() -> None:
    table = parse_table([[1, 4, 4], [16, 32, 2], [64, 128, 0]])
    # in range, carried across the gap 5..15, and past the end
    assert [table_k(table, b) for b in (1, 4, 5, 15, 16, 40, 64, 500)] == [4, 4, 4, 4, 2, 2, 0, 0]
    mapping = parse_table({"1": 4, "16": 2, "64": 0})
    assert [table_k(mapping, b) for b in (1, 15, 16, 63, 64)] == [4, 4, 2, 2, 0]


def test_vllm_table_uses_each_buckets_batch_size_and_caps_k() -> None:
    policy = offered("vllm-batch-table", {"table": {"1": 6, "16": 2, "64": 0}}, {"ngram": 5})
    assert policy.select_action("chat", 0).mode == parse_arm("ngram/k=5")  # 6 capped at 5
    env = SyntheticEnv(drafters={"ngram": 5}, acceptance={"ngram": 0.9})
    for _ in range(50):
        env.run_step(policy, "chat", 1, 20)
        env.run_step(policy, "chat", 2, 100)
    assert policy.select_action("chat", 1).mode == parse_arm("ngram/k=2")
    assert policy.select_action("chat", 2).mode == OFF
    assert "batch size 100 -> K=0" in policy.select_action("chat", 2).explanation


# -- SGLang EMA ---------------------------------------------------------------


def test_sglang_ema_steps_up_with_high_acceptance_and_down_with_low() -> None:
    policy = offered("sglang-ema", {"drafter": "ngram", "warmup_batches": 10})
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.97})
    assert policy.select_action("chat", 0).mode == parse_arm("ngram/k=3")
    for _ in range(10):  # warm-up: no change yet
        env.run_step(policy, "chat", 0, 8)
    assert policy.select_action("chat", 0).mode == parse_arm("ngram/k=3")
    for _ in range(60):
        env.run_step(policy, "chat", 0, 8)
    assert policy.select_action("chat", 0).mode == parse_arm("ngram/k=7")
    env.acceptance["ngram"] = 0.05
    for _ in range(80):
        env.run_step(policy, "chat", 0, 8)
    decision = policy.select_action("chat", 0)
    assert decision.mode == parse_arm("ngram/k=1")  # never off
    assert decision.explanation.startswith("sglang ema: accept length 0.")


# -- BanditSpec UCB -------------------------------------------------------------


def test_ucb_tries_every_arm_once_then_exploits_the_best_goodput() -> None:
    drafters = {"ngram": 4}
    policy = offered("banditspec-ucb", {}, drafters)
    env = SyntheticEnv(drafters=drafters, acceptance={"ngram": 0.9}, token_s=2e-5)
    seen = []
    for _ in range(5):
        _, decision, _ = env.run_step(policy, "chat", 1, 16)
        assert decision.probabilities.tolist() == [1.0]  # deterministic: propensity 1
        seen.append(decision.mode)
    assert sorted(seen) == sorted(arms_for(drafters.items()))
    picks = [env.run_step(policy, "chat", 1, 16)[1].mode for _ in range(300)]
    counts = Counter(picks)
    best, pulls = counts.most_common(1)[0]
    assert best == parse_arm("ngram/k=4"), counts
    assert pulls > 2 * counts[OFF], counts


# -- TensorRT-LLM threshold ---------------------------------------------------


def test_trtllm_switches_off_permanently_until_reset() -> None:
    policy = offered(
        "trtllm-threshold",
        {"arm": "ngram/k=4", "acceptance_window": 64, "acceptance_length_threshold": 1.0},
    )
    env = SyntheticEnv(drafters=NGRAM, acceptance={"ngram": 0.8})
    for _ in range(10):
        env.run_step(policy, "chat", 0, 16)
    assert policy.select_action("chat", 0).mode == parse_arm("ngram/k=4")
    env.acceptance["ngram"] = 0.1
    for _ in range(10):
        env.run_step(policy, "chat", 0, 16)
    decision = policy.select_action("chat", 0)
    assert decision.mode == OFF
    assert "disabled permanently" in decision.explanation
    env.acceptance["ngram"] = 0.99
    for _ in range(50):
        env.run_step(policy, "chat", 0, 16)
    assert policy.select_action("chat", 0).mode == OFF  # no recovery: it never probes
    assert policy.select_action("other", 0).mode == parse_arm("ngram/k=4")
    policy.reset_class("chat")
    assert policy.select_action("chat", 0).mode == parse_arm("ngram/k=4")


def test_trtllm_max_concurrency_turns_speculation_off_at_high_load() -> None:
    policy = offered("trtllm-threshold", {"max_concurrency": 32})
    assert policy.select_action("chat", 0).mode == parse_arm("ngram/k=8")
    assert policy.select_action("chat", 3).mode == OFF


# -- epsilon-greedy -----------------------------------------------------------


def test_epsilon_greedy_puts_one_minus_epsilon_on_the_best_mean() -> None:
    drafters = {"ngram": 3}
    policy = offered("epsilon-greedy", {"epsilon": 0.2}, drafters)
    first = policy.select_action("chat", 1)
    np.testing.assert_allclose(first.probabilities, 0.25)
    env = SyntheticEnv(drafters=drafters, acceptance={"ngram": 0.95}, token_s=1e-5)
    for _ in range(200):
        env.run_step(policy, "chat", 1, 16)
    decision = policy.select_action("chat", 1)
    assert decision.mode == parse_arm("ngram/k=3")
    assert decision.probability_of(parse_arm("ngram/k=3")) == pytest.approx(0.8 + 0.05)
    assert decision.probability_of(OFF) == pytest.approx(0.05)
