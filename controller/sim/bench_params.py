"""The parameters each policy of the simulator benchmark runs with.

A peer runs as shipped (:func:`shipped_params`: the engine's configured arm
and the system's own documented defaults, what a user gets without a sweep)
or tuned in hindsight (:func:`baseline_params`: configured from the same
sweep the simulator runs on); the static references run the arm their name
says, ``best-static`` the one arm best over the whole scenario, from the truth.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specctl.arms import OFF, Arm, parse_arm
from specctl.sim.bench_policies import TUNED_SUFFIX, base_policy
from specctl.sim.engine import FloatArray
from specctl.sim.scenario import AcceptanceChange, LoadChange, MixChange, Scenario


def best_static_arm(scenario: Scenario) -> Arm:
    """The one arm with the highest expected goodput over the scenario, from the truth.

    Expected tokens and time are summed over the scenario's segments between
    events, at each segment's batch size, acceptance and class mix.
    """
    model = scenario.model
    world_events = sorted(scenario.events, key=lambda e: e.step)
    batch = scenario.batch
    scale = np.ones(len(model.classes))
    mix = scenario.mix_vector()
    class_id = {c: i for i, c in enumerate(model.classes)}
    tokens = np.zeros(len(model.arms))
    time_s = np.zeros(len(model.arms))
    bounds = [e.step for e in world_events] + [scenario.steps]
    start = 0
    for i, end in enumerate(bounds):
        n = end - start
        if n > 0:
            exp = model.expected_tokens(scale)  # [c, a]
            cost = model.cost(batch)
            share = model.base_step_time_s(batch)  # per step; per request = share / batch
            tokens += n * batch * (mix @ exp)
            time_s += n * share * (mix @ cost)
        if i < len(world_events):
            e = world_events[i]
            if isinstance(e, AcceptanceChange):
                scale[class_id[e.workload_class]] = e.scale
            elif isinstance(e, MixChange):
                mix = scenario.mix_vector(e.weights)
            elif isinstance(e, LoadChange):
                batch = e.batch
        start = end
    return model.arms[int(np.argmax(tokens / time_s))]


def _mix_goodput(scenario: Scenario, batch: int) -> FloatArray:
    """Expected goodput per arm at this batch size, over the scenario's initial mix."""
    model = scenario.model
    mix = scenario.mix_vector()
    return (mix @ model.expected_tokens()) / (mix @ model.cost(batch))


TABLE_BATCHES = (1, 8, 16, 32, 64, 128, 256, 512)


# The peers' own defaults, for the as-shipped variant (see shipped_params).
SGLANG_CANDIDATE_STEPS = (1, 3, 7)
SGLANG_EMA_DEFAULTS: dict[str, Any] = {
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "down_hysteresis": -0.25,
    "up_hysteresis": 0.0,
}
VLLM_DEFAULT_TABLE: dict[str, int] = {"1": 4, "16": 2, "64": 0}


def engine_arm(scenario: Scenario) -> Arm:
    """The engine's configured arm: the drafter offered first at its longest offered K
    (an engine's ``num_speculative_tokens``); ``off`` if nothing is offered."""
    drafters = scenario.model.drafters
    if not drafters:
        return OFF
    drafter, k = next(iter(drafters.items()))
    return Arm(drafter, k)


def shipped_params(name: str, scenario: Scenario) -> dict[str, Any]:
    """The peers as shipped: the engine's configured arm and each system's own defaults.

    No sweep, no profile: what a user who turns the feature on gets.

    - ``sglang-ema``: SGLang's adaptive speculative decoding
      (``--speculative-adaptive``; ``AdaptiveSpeculativeParams`` in SGLang's
      ``python/sglang/srt/speculative/adaptive_spec_params.py``). Candidate steps
      ``[1, 3, 7]``, with the configured ``--speculative-num-steps`` added when it
      is not one of them (the initial tier is the configured steps), here capped
      by the drafter's longest offered K; EMA defaults ``ema_alpha`` 0.2,
      ``update_interval`` 5, ``warmup_batches`` 10, ``down_hysteresis`` -0.25,
      ``up_hysteresis`` 0. (Later SGLang versions ship a per-batch-size ladder
      by default instead, ``[1, 3, 5, 7]`` at batch 1 and shorter ones above,
      the newest with 0 (no speculation) from batch 8; the single ladder is what
      this policy models. SGLang enables adaptive only for EAGLE/EAGLE3; here it
      applies to the first drafter, whatever it is.)
    - ``trtllm-threshold``: TensorRT-LLM's ``DecodingBaseConfig``
      (``tensorrt_llm/llmapi/llm_args.py``): ``acceptance_window`` and
      ``acceptance_length_threshold`` default to None, which disables the
      ``SpeculationGate``, and ``max_concurrency`` defaults to None
      ("speculation will always be on"). As shipped it is a fixed arm, the
      configured ``max_draft_len``. The gate is disabled here with
      ``acceptance_length_threshold`` 0: a mean accepted length is never below 0.
    - ``vllm-batch-table``: vLLM's ``num_speculative_tokens_per_batch_size``
      (``vllm/config/speculative.py``) defaults to None, a fixed K; Dynamic SD
      needs a table the user writes. As shipped it gets the policy's own
      documented default table ``{1: 4, 16: 2, 64: 0}``
      (:class:`~specctl.policy.vllm_table.BatchTableConfig`), K capped by
      the configured K as vLLM caps it. (vLLM's documentation example is
      ``[[1, 64, 3], [65, 128, 1], [129, 512, 0]]``.)
    - ``banditspec-ucb``, ``epsilon-greedy``: their defaults (UCB1 with
      ``exploration`` 1 and no discount; ``epsilon`` 0.1, no discount). They take
      no drafter or K and have no tuned variant.
    """
    arm = engine_arm(scenario)
    if arm.is_off:
        return {}
    if name == "sglang-ema":
        steps = sorted({min(k, arm.k) for k in SGLANG_CANDIDATE_STEPS} | {arm.k})
        if len(steps) < 2:  # a drafter offered at K=1 only: every tier runs K=1
            steps = sorted({*SGLANG_CANDIDATE_STEPS, arm.k})
        return {
            "drafter": arm.drafter,
            "candidate_steps": steps,
            "initial_steps": arm.k,
            **SGLANG_EMA_DEFAULTS,
        }
    if name == "trtllm-threshold":
        return {"arm": arm.name, "acceptance_length_threshold": 0.0}
    if name == "vllm-batch-table":
        return {"drafter": arm.drafter, "table": dict(VLLM_DEFAULT_TABLE)}
    return {}


def baseline_params(name: str, scenario: Scenario) -> dict[str, Any]:
    """The baselines tuned in hindsight, as a careful operator would from the same sweep.

    The drafter and K are those of the best static arm at the table's
    operating point; vLLM's batch-size table and TensorRT-LLM's concurrency
    cap are profiled from the model at each batch size. This is generous to
    the baselines: operators rarely have that profile.
    """
    model = scenario.model
    arm_names = [a.name for a in model.arms]
    ref = _mix_goodput(scenario, scenario.batch)
    spec = [i for i, a in enumerate(model.arms) if not a.is_off]
    best = model.arms[max(spec, key=lambda i: ref[i])]
    if name == "vllm-batch-table":
        mine = [i for i, a in enumerate(model.arms) if a.drafter == best.drafter]
        table: dict[str, int] = {}
        for b in TABLE_BATCHES:
            g = _mix_goodput(scenario, b)
            i = max(mine, key=lambda i: g[i])
            table[str(b)] = int(model.arm_k[i]) if g[i] > g[arm_names.index("off")] else 0
        return {"drafter": best.drafter, "table": table}
    if name == "sglang-ema":
        max_k = model.drafters[best.drafter]
        steps = sorted({min(k, max_k) for k in (1, 3, 7)} | {best.k})
        return {"drafter": best.drafter, "candidate_steps": steps, "initial_steps": best.k}
    if name == "trtllm-threshold":
        params: dict[str, Any] = {"arm": best.name}
        for b in range(1, 1025):
            g = _mix_goodput(scenario, b)
            if g[arm_names.index(best.name)] < g[arm_names.index("off")]:
                params["max_concurrency"] = b - 1
                break
        return params
    return {}


def policy_params(name: str, scenario: Scenario) -> dict[str, Any]:
    """The parameters a bench policy runs with (for a reference, its arm if it has one)."""
    if name == "oracle":
        return {}
    if name == "static-off":
        return {"arm": OFF.name}
    if name == "best-static":
        return {"arm": best_static_arm(scenario).name}
    if name.startswith("static:"):
        return {"arm": parse_arm(name.removeprefix("static:")).name}
    if name.endswith(TUNED_SUFFIX):
        return baseline_params(base_policy(name), scenario)
    return shipped_params(name, scenario)
