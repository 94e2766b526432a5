"""Policies by name, so configuration, the benchmark and replay can build any of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specctl.arms import parse_arm
from specctl.policy.banditspec_ucb import make_banditspec_ucb
from specctl.policy.base import Policy
from specctl.policy.epsilon_greedy import make_epsilon_greedy
from specctl.policy.sglang_ema import make_sglang_ema
from specctl.policy.static import StaticPolicy
from specctl.policy.thompson import make_specctl
from specctl.policy.trtllm_threshold import make_trtllm_threshold
from specctl.policy.vllm_table import make_vllm_batch_table


def _static(params: Mapping[str, Any]) -> Policy:
    unknown = set(params) - {"arm"}
    if unknown:
        raise ValueError(f"static policy: unknown parameters {sorted(unknown)}; it takes 'arm'")
    if "arm" not in params:
        raise ValueError("static policy: parameter 'arm' is required, e.g. arm='ngram/k=4'")
    return StaticPolicy(parse_arm(str(params["arm"])))


# name -> factory(params). Each factory validates its own parameters.
POLICIES: dict[str, Callable[[Mapping[str, Any]], Policy]] = {
    "static": _static,
    "specctl": make_specctl,
    "vllm-batch-table": make_vllm_batch_table,
    "sglang-ema": make_sglang_ema,
    "banditspec-ucb": make_banditspec_ucb,
    "trtllm-threshold": make_trtllm_threshold,
    "epsilon-greedy": make_epsilon_greedy,
}

# The policy the sidecar runs unless configured otherwise.
DEFAULT_POLICY = "specctl"

# Policies whose state depends on the load buckets (all but static).
BUCKETED = frozenset(POLICIES) - {"static"}


def make_policy(
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    load_bucket_bounds: Sequence[int] | None = None,
) -> Policy:
    """Build a policy by name; raise ValueError naming the policy and the bad parameter.

    ``load_bucket_bounds`` is the caller's bucketing (the sidecar's
    ``policy.load_bucket_bounds``): it is handed to policies that depend on
    it, and must agree with a ``load_bucket_bounds`` in ``params``.
    """
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    params = dict(params or {})
    if load_bucket_bounds is not None and name in BUCKETED:
        bounds = [int(b) for b in load_bucket_bounds]
        given = params.setdefault("load_bucket_bounds", bounds)
        if isinstance(given, Sequence) and [*given] != bounds:
            raise ValueError(
                f"{name} policy: load_bucket_bounds={list(given)} differs from the "
                f"load buckets in use, {bounds}"
            )
    return factory(params)
