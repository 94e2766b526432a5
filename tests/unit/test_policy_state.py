"""Every policy's state: saved and restored, it decides and learns as the saved policy did."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from policy_env import SyntheticEnv

from specctl.arms import arms_for
from specctl.policy.base import Decision, Policy
from specctl.policy.registry import POLICIES, make_policy
from specctl.policy.state import PolicyState, StateValue

DRAFTERS = {"ngram": 4, "eagle3": 3}
# (requests per step, per-position acceptance): "code" accepts too little for any gate
MIX = {"chat": (6, 0.85), "code": (4, 0.05)}
CONTEXTS = [(c, b) for c in ("chat", "code", "never-seen") for b in range(4)]

# parameters per registered policy: small and quick where the policy has a knob for it
PARAMS: dict[str, dict[str, Any]] = {
    "static": {"arm": "ngram/k=4"},
    "specctl": {"num_samples": 64, "cold_start_rounds": 0.0},
    "vllm-batch-table": {},
    "sglang-ema": {"warmup_batches": 4, "update_interval": 2},
    "banditspec-ucb": {},
    "trtllm-threshold": {"acceptance_window": 32},
    "epsilon-greedy": {},
}


def build(name: str) -> Policy:
    policy = make_policy(name, PARAMS[name])
    policy.set_arms(arms_for(DRAFTERS.items()))
    return policy


def learn(policy: Policy, env: SyntheticEnv, steps: int) -> None:
    """Shared batches of two classes at two loads, and one class alone at a third."""
    for _ in range(steps):
        env.run_mixed_step(policy, MIX, 0)
        env.run_mixed_step(policy, MIX, 2)
        env.run_step(policy, "chat", 3, 150)


def through_a_file(state: PolicyState) -> dict[str, StateValue]:
    """What a snapshot hands back: arrays read with allow_pickle=False, scalars as values."""
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **state)  # type: ignore[arg-type]
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as npz:
        return {k: npz[k].item() if npz[k].ndim == 0 else npz[k] for k in npz.files}


def assert_same_state(a: PolicyState, b: PolicyState) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


def state_bytes(state: PolicyState) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Each value's dtype, shape and bytes: equal means byte-identical."""
    out = {}
    for key, value in state.items():
        array = np.asarray(value)
        out[key] = (array.dtype.str, array.shape, array.tobytes())
    return out


def decisions(policy: Policy) -> list[Decision]:
    return [policy.select_action(c, b) for c, b in CONTEXTS]


def assert_same_decisions(a: list[Decision], b: list[Decision]) -> None:
    for (ctx, x), y in zip(zip(CONTEXTS, a, strict=True), b, strict=True):
        assert x.arms == y.arms, ctx
        np.testing.assert_array_equal(x.probabilities, y.probabilities, err_msg=str(ctx))
        assert x.explanation == y.explanation, ctx


def test_every_registered_policy_is_covered() -> None:
    assert set(PARAMS) == set(POLICIES)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_restored_policy_decides_and_learns_as_the_saved_one(name: str) -> None:
    saved = build(name)
    env = SyntheticEnv(
        drafters=DRAFTERS, acceptance={"ngram": 0.8, "eagle3": 0.6}, noise_s=0.004, seed=3
    )
    learn(saved, env, 40)
    state = saved.state_dict()
    assert state["policy_name"] == name and state["state_version"] == saved.state_version

    restored = build(name)
    # what it learned shows: a fresh policy decides differently, unless it is stationary
    fresh = decisions(restored)
    learned = decisions(saved)
    differs = any(
        x.arms != y.arms or not np.array_equal(x.probabilities, y.probabilities)
        for x, y in zip(fresh, learned, strict=True)
    )
    assert differs != saved.stationary

    restored.load_state_dict(through_a_file(state))
    assert_same_state(restored.state_dict(), state)
    assert_same_decisions(decisions(restored), learned)

    # and it goes on learning as the saved one does, from the same reports
    first = len(env.batches)
    learn(saved, env, 15)
    for batch in env.batches[first:]:
        restored.update_params(batch)
    assert_same_state(restored.state_dict(), saved.state_dict())
    assert_same_decisions(decisions(restored), decisions(saved))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_state_missing_a_key_is_refused_naming_it_and_nothing_is_loaded(name: str) -> None:
    saved = build(name)
    env = SyntheticEnv(drafters=DRAFTERS, acceptance={"ngram": 0.8, "eagle3": 0.6}, seed=5)
    learn(saved, env, 12)
    state = saved.state_dict()
    target = build(name)
    before = target.state_dict()
    for key in set(state) - {"policy_name", "state_version"}:
        broken = {k: v for k, v in state.items() if k != key}
        with pytest.raises(ValueError, match=key):
            target.load_state_dict(broken)
        assert_same_state(target.state_dict(), before)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_state_of_another_policy_or_layout_is_refused(name: str) -> None:
    policy = build(name)
    state = policy.state_dict()
    with pytest.raises(ValueError, match=f"state is for policy 'other', not '{name}'"):
        policy.load_state_dict({**state, "policy_name": "other"})
    with pytest.raises(ValueError, match=f"{name} state: state_version=99; this policy reads"):
        policy.load_state_dict({**state, "state_version": 99})


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_reads_between_updates_leave_the_state_byte_identical(name: str) -> None:
    policy = build(name)
    env = SyntheticEnv(drafters=DRAFTERS, acceptance={"ngram": 0.8, "eagle3": 0.6}, seed=7)
    for _ in range(30):
        learn(policy, env, 1)
        before = state_bytes(policy.state_dict())
        for _ in range(2):
            for context in CONTEXTS:
                policy.select_action(*context)
                policy.evidence(*context)
        assert state_bytes(policy.state_dict()) == before
