"""Policies by name, so configuration, the benchmark and replay can build any of them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specctl.policy.banditspec_ucb import BanditSpecUcbPolicy
from specctl.policy.base import Policy
from specctl.policy.epsilon_greedy import EpsilonGreedyPolicy
from specctl.policy.sglang_ema import SglangEmaPolicy
from specctl.policy.static import StaticPolicy
from specctl.policy.thompson import SpecctlPolicy
from specctl.policy.trtllm_threshold import TrtllmThresholdPolicy
from specctl.policy.vllm_table import VllmBatchTablePolicy

# name -> policy class; each builds itself with from_params, validating its parameters
POLICIES: dict[str, type[Policy]] = {
    cls.policy_name: cls
    for cls in (
        StaticPolicy,
        SpecctlPolicy,
        VllmBatchTablePolicy,
        SglangEmaPolicy,
        BanditSpecUcbPolicy,
        TrtllmThresholdPolicy,
        EpsilonGreedyPolicy,
    )
}

# The policy the sidecar runs unless configured otherwise.
DEFAULT_POLICY = "specctl"


def make_policy(
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    load_bucket_bounds: Sequence[int] | None = None,
) -> Policy:
    """Build a policy by name; raise ValueError naming the policy and the bad parameter.

    ``load_bucket_bounds`` is the caller's bucketing (the sidecar's
    ``policy.load_bucket_bounds``): it is handed to policies that use load
    buckets, and must agree with a ``load_bucket_bounds`` in ``params``.
    """
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    params = dict(params or {})
    if load_bucket_bounds is not None and cls.uses_load_buckets:
        bounds = [int(b) for b in load_bucket_bounds]
        given = params.setdefault("load_bucket_bounds", bounds)
        if isinstance(given, Sequence) and [*given] != bounds:
            raise ValueError(
                f"{name} policy: load_bucket_bounds={list(given)} differs from the "
                f"load buckets in use, {bounds}"
            )
    return cls.from_params(params)
