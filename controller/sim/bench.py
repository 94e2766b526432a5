"""The side-by-side policy benchmark: every policy on the same scenario and seeds.

Each policy runs in its own simulated world built from the same seed, through
the production path (:class:`~specctl.sidecar.book.PolicyBook`, report
encoding and validation, the engine's compiled policy view). Besides the
registered policies, three references run:

- ``oracle``: the best arm per class for the current conditions (:mod:`.oracle`);
- ``static-off``: no speculation;
- ``best-static``: the single arm, for every class, with the highest expected
  goodput over the whole scenario, chosen in hindsight from the ground truth.

``static:<arm>`` runs one fixed arm (``static:dflash/k=7``).

The peers run in two variants (:func:`policy_variant`):

- ``<name>``, *as shipped* (:func:`shipped_params`): what a user gets without a
  sweep, the engine's configured K (the drafter offered first at its longest
  offered K, i.e. the engine's ``num_speculative_tokens``) and each system's
  own documented defaults;
- ``<name>@tuned``, *tuned in hindsight* (:func:`baseline_params`): configured
  from the same sweep the simulator runs on, for the peers that take a drafter,
  a K or a table (``sglang-ema``, ``trtllm-threshold``, ``vllm-batch-table``).

``specctl`` is labelled ``learning`` (its defaults, nothing configured), the
references ``reference``.

Goodput is committed tokens per second of engine time; per class, over the
time charged to that class's requests (:mod:`.engine`). Ratios compare runs
with the same seed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specctl.arms import OFF, Arm, parse_arm
from specctl.policy.base import Policy
from specctl.policy.registry import POLICIES, make_policy
from specctl.policy.static import StaticPolicy
from specctl.sidecar.book import PolicyBook
from specctl.sim.engine import (
    FloatArray,
    InProcessLink,
    RunRecord,
    SimulatedEngine,
    SimWorld,
    make_world,
)
from specctl.sim.oracle import OraclePolicy
from specctl.sim.scenario import AcceptanceChange, LoadChange, MixChange, Scenario

REFERENCES = ("oracle", "static-off", "best-static")
TUNED_SUFFIX = "@tuned"
# peers with a configuration to tune in hindsight (drafter, K, table, cap)
TUNABLE = ("sglang-ema", "trtllm-threshold", "vllm-batch-table")
LEARNING = ("specctl",)
VARIANTS = ("as-shipped", "tuned-in-hindsight", "reference", "learning")
ADAPT_WITHIN = 0.05  # "back within 5% of the oracle"
ADAPT_WINDOW_BLOCKS = 5  # trailing window for time-to-adapt, in accounting blocks
REGRET_WINDOWS = 40
SPEC_LOSES_OFF_SHARE = 0.95  # cells where the oracle ran off this often: speculation loses

Progress = Callable[[str], None]


def default_policies() -> list[str]:
    """specctl first, then every other registered policy as shipped, each tunable peer
    followed by its ``@tuned`` variant, then the references."""
    names: list[str] = []
    learning = (n for n, cls in POLICIES.items() if not cls.stationary)
    for n in sorted(learning, key=lambda n: (n != "specctl", n)):
        names.append(n)
        if n in TUNABLE:
            names.append(n + TUNED_SUFFIX)
    return [*names, *REFERENCES]


def base_policy(name: str) -> str:
    """The registered policy behind a bench name (``sglang-ema@tuned`` -> ``sglang-ema``)."""
    return name.removesuffix(TUNED_SUFFIX)


def policy_variant(name: str) -> str:
    """``reference``, ``learning``, ``tuned-in-hindsight`` or ``as-shipped``."""
    if name in REFERENCES or name.startswith("static:"):
        return "reference"
    if name.endswith(TUNED_SUFFIX):
        return "tuned-in-hindsight"
    if name in LEARNING:
        return "learning"
    return "as-shipped"


def check_policy_name(name: str) -> None:
    """Raise ValueError unless the bench can run ``name``."""
    if name in REFERENCES:
        return
    if name.startswith("static:"):
        parse_arm(name.removeprefix("static:"))  # ArmError is a ValueError
        return
    base = base_policy(name)
    if base not in POLICIES or POLICIES[base].stationary:
        known = [*default_policies(), "static:<arm>"]
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(known)}")
    if name.endswith(TUNED_SUFFIX) and base not in TUNABLE:
        raise ValueError(
            f"{base} has no {TUNED_SUFFIX} variant (nothing to tune in hindsight); "
            f"tunable: {', '.join(TUNABLE)}"
        )


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


def build_policy(name: str, scenario: Scenario, world: SimWorld) -> Policy:
    check_policy_name(name)
    if name == "oracle":
        return OraclePolicy(world)
    if policy_variant(name) == "reference":
        return StaticPolicy(parse_arm(policy_params(name, scenario)["arm"]))
    return make_policy(base_policy(name), policy_params(name, scenario))


def run_policy(
    scenario: Scenario,
    name: str,
    *,
    seed: int,
    report_every: int = 8,
    progress: Progress | None = None,
) -> RunRecord:
    """One policy over one scenario, in-process through the production path."""
    world = make_world(scenario, np.random.default_rng([seed, 0]))
    policy = build_policy(name, scenario, world)
    book = PolicyBook(
        policy, policy_name=name, max_classes=max(64, len(scenario.model.classes) + 1)
    )
    link = InProcessLink(book, scenario.model.drafters, report_every=report_every)
    engine = SimulatedEngine(world, link, seed=seed)

    def tick(step: int) -> None:
        if progress is not None:
            progress(f"{scenario.name}: {name} step {step}/{scenario.steps}")

    record = engine.run(scenario.steps, tick)
    record.policy_versions = link.policy_versions
    return record


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 and math.isfinite(a / b) else None


def _goodput(tokens: np.ndarray, time_s: np.ndarray) -> float:
    t = float(time_s.sum())
    return float(tokens.sum()) / t if t > 0 else float("nan")


def _windows(blocks: int) -> list[tuple[int, int]]:
    n = min(REGRET_WINDOWS, blocks)
    edges = np.linspace(0, blocks, n + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges) if b > a]


def window_goodput(run: RunRecord, windows: Sequence[tuple[int, int]]) -> FloatArray:
    """Goodput per [window, class] (NaN where a class ran no time in a window)."""
    tokens = np.stack([run.tokens[a:b].sum(axis=0) for a, b in windows])
    time_s = np.stack([run.time_s[a:b].sum(axis=0) for a, b in windows])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(time_s > 0, tokens / np.where(time_s > 0, time_s, 1.0), np.nan)


def cell_ratios(mine: FloatArray, ref: FloatArray, weights: FloatArray, axis: int) -> FloatArray:
    """Traffic-weighted mean of goodput ratios over (window, class) cells, along ``axis``
    (0: per class, 1: per window); NaN where no cell has traffic.

    Ratios are taken per cell, where conditions are the same for both runs,
    and weighted by the cell's request-rounds in the oracle run. A pooled
    tokens-over-time ratio would not compare like with like: in a closed loop
    a faster policy shifts the batch's class mix, and with load changing over
    the run a policy that slows high-load steps gives them more weight.
    """
    ratio = mine / ref
    ok = np.isfinite(ratio) & (weights > 0)
    w = np.where(ok, weights, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray((w * np.where(ok, ratio, 0.0)).sum(axis=axis) / w.sum(axis=axis))


def cell_ratio(mine: FloatArray, ref: FloatArray, weights: FloatArray) -> float | None:
    """:func:`cell_ratios` over every cell."""
    return _rounded(
        float(cell_ratios(mine.ravel()[None], ref.ravel()[None], weights.ravel()[None], 1)[0])
    )


def adaptation_steps(
    run: RunRecord, oracle: RunRecord, class_id: int, event_step: int, end_step: int
) -> int | None:
    """Steps from an event until the class's goodput over a trailing window, all after the
    event, is within ADAPT_WITHIN of the oracle's over the same window (None: not
    before ``end_step``). Resolution: one accounting block."""
    first = -(-event_step // run.block_steps)  # first block that starts after the event
    last = min(run.tokens.shape[0], end_step // run.block_steps)
    w = ADAPT_WINDOW_BLOCKS
    for b in range(first + w, last + 1):
        mine = _goodput(run.tokens[b - w : b, class_id], run.time_s[b - w : b, class_id])
        best = _goodput(oracle.tokens[b - w : b, class_id], oracle.time_s[b - w : b, class_id])
        if best > 0 and mine >= (1.0 - ADAPT_WITHIN) * best:
            return b * run.block_steps - event_step
    return None


def summarize_run(
    scenario: Scenario, runs: dict[str, RunRecord], best_static: Arm
) -> dict[str, dict[str, Any]]:
    """Per policy: goodput ratios overall and per class, arm shares, regret, adaptation.

    Ratios are traffic-weighted means over (window, class) cells
    (:func:`cell_ratio`), 40 windows over the run. ``goodput_vs_no_spec_where_spec_loses``
    takes only the cells where the oracle ran ``off`` (every arm loses there).
    """
    oracle, off, static = runs["oracle"], runs["static-off"], runs["best-static"]
    classes = scenario.model.classes
    windows = _windows(oracle.tokens.shape[0])
    weights = np.stack([oracle.block_rounds[a:b].sum(axis=0) for a, b in windows])
    oracle_off = np.stack([oracle.block_off_rounds[a:b].sum(axis=0) for a, b in windows])
    with np.errstate(invalid="ignore", divide="ignore"):
        loses = np.nan_to_num(oracle_off / weights) >= SPEC_LOSES_OFF_SHARE
    loses_weights = np.where(loses, weights, 0.0)
    traffic = weights.sum(axis=0) / max(float(weights.sum()), 1.0)
    oracle_arm = [oracle.arms[int(np.argmax(oracle.rounds[c]))] for c in range(len(classes))]
    refs = {k: window_goodput(r, windows) for k, r in (("o", oracle), ("off", off), ("s", static))}
    events = sorted(scenario.events, key=lambda e: e.step)
    out: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        g = window_goodput(run, windows)
        by_class = {k: cell_ratios(g, ref, weights, 0) for k, ref in refs.items()}
        per_class: dict[str, Any] = {}
        for c, cls in enumerate(classes):
            rounds = run.rounds[c]
            n = max(int(rounds.sum()), 1)
            shares = {
                run.arms[a]: round(float(rounds[a]) / n, 4)
                for a in np.argsort(-rounds)
                if rounds[a] > 0
            }
            time_s = float(run.time_s[:, c].sum())
            per_class[cls] = {
                "traffic_share": round(float(traffic[c]), 4),
                "goodput_tok_s": round(float(run.tokens[:, c].sum()) / time_s, 2)
                if time_s > 0
                else None,
                "goodput_vs_oracle": _rounded(by_class["o"][c]),
                "goodput_vs_no_spec": _rounded(by_class["off"][c]),
                "goodput_vs_best_static": _rounded(by_class["s"][c]),
                "oracle_arm": oracle_arm[c],
                "arm_share": shares,
            }
        by_window = cell_ratios(g, refs["o"], weights, 1)
        regret_curve = []
        cumulative = 0.0
        for w, (a, b) in enumerate(windows):
            time_s = run.time_s[a:b].sum(axis=0)
            tokens = run.tokens[a:b].sum(axis=0)
            cumulative += float(np.nansum(refs["o"][w] * time_s - tokens))
            regret_curve.append(
                {
                    "step": min(b * run.block_steps, scenario.steps),
                    "goodput_vs_oracle": _rounded(by_window[w]),
                    "cumulative_regret_tokens": round(cumulative, 1),
                }
            )
        adapt = []
        for i, e in enumerate(events):
            if isinstance(e, AcceptanceChange):
                end = next(
                    (x.step for x in events[i + 1 :] if isinstance(x, AcceptanceChange)),
                    scenario.steps,
                )
                steps = adaptation_steps(run, oracle, classes.index(e.workload_class), e.step, end)
                adapt.append(
                    {
                        "step": e.step,
                        "event": f"{e.workload_class} acceptance x{e.scale:g}",
                        "steps_to_adapt": steps,
                    }
                )
        out[name] = {
            "goodput_tok_s": round(_goodput(run.tokens, run.time_s), 2),
            "goodput_vs_oracle": cell_ratio(g, refs["o"], weights),
            "goodput_vs_no_spec": cell_ratio(g, refs["off"], weights),
            "goodput_vs_best_static": cell_ratio(g, refs["s"], weights),
            "spec_loses_traffic_share": round(
                float(loses_weights.sum() / max(float(weights.sum()), 1.0)), 4
            ),
            "goodput_vs_no_spec_where_spec_loses": cell_ratio(g, refs["off"], loses_weights),
            "classes": per_class,
            "regret_over_time": regret_curve,
            "adaptation": adapt,
            "policy_versions": run.policy_versions,
        }
    return out


def _rounded(x: float) -> float | None:
    return round(float(x), 4) if math.isfinite(x) else None


@dataclass
class ScenarioResult:
    scenario: Scenario
    best_static: Arm
    runs: dict[str, RunRecord]
    summary: dict[str, dict[str, Any]]


def run_scenario(
    scenario: Scenario,
    policies: Sequence[str],
    *,
    seed: int,
    report_every: int = 8,
    progress: Progress | None = None,
) -> ScenarioResult:
    names = list(dict.fromkeys([*policies, *REFERENCES]))
    for name in names:
        check_policy_name(name)
    runs = {
        name: run_policy(scenario, name, seed=seed, report_every=report_every, progress=progress)
        for name in names
    }
    best = best_static_arm(scenario)
    return ScenarioResult(scenario, best, runs, summarize_run(scenario, runs, best))


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(float(np.mean(kept)), 4) if kept else None


def benchmark_json(
    scenario_name: str, results: Sequence[ScenarioResult], *, steps: int, seed: int
) -> dict[str, Any]:
    """The benchmark's JSON: ``policies`` keyed by policy name, means over the scenario runs.

    Each policy entry carries its ``variant`` (:func:`policy_variant`) and, per
    scenario run, the ``params`` it ran with (:func:`policy_params`).
    """
    names = list(results[0].summary) if results else []
    params = {(n, r.scenario.name): policy_params(n, r.scenario) for n in names for r in results}
    policies: dict[str, Any] = {}
    for name in names:
        per_run = {r.scenario.name: r.summary[name] for r in results}
        adapt = [a["steps_to_adapt"] for s in per_run.values() for a in s["adaptation"]]
        policies[name] = {
            "variant": policy_variant(name),
            "params": {r.scenario.name: params[name, r.scenario.name] for r in results},
            "goodput_vs_oracle": _mean([s["goodput_vs_oracle"] for s in per_run.values()]),
            "goodput_vs_no_spec": _mean([s["goodput_vs_no_spec"] for s in per_run.values()]),
            "goodput_vs_best_static": _mean(
                [s["goodput_vs_best_static"] for s in per_run.values()]
            ),
            "steps_to_adapt": adapt,
            "goodput_vs_no_spec_where_spec_loses": _mean(
                [s["goodput_vs_no_spec_where_spec_loses"] for s in per_run.values()]
            ),
            "runs": per_run,
        }
    return {
        "scenario": scenario_name,
        "steps": steps,
        "seed": seed,
        "goodput": "committed tokens per second of engine time",
        "aggregate": "ratios under 'policies' are means over the scenario's runs",
        "scenarios": {
            r.scenario.name: {
                "description": r.scenario.description,
                "target": r.scenario.model.target,
                "classes": list(r.scenario.model.classes),
                "best_static_arm": r.best_static.name,
                "engine_arm": engine_arm(r.scenario).name,
                "baseline_params": {
                    n: params[n, r.scenario.name]
                    for n in names
                    if policy_variant(n) in ("as-shipped", "tuned-in-hindsight")
                    and params[n, r.scenario.name]
                },
                "events": [_event_json(e) for e in r.scenario.events],
            }
            for r in results
        },
        "policies": policies,
    }


def _event_json(e: object) -> dict[str, Any]:
    if isinstance(e, AcceptanceChange):
        return {"step": e.step, "kind": "acceptance", "class": e.workload_class, "scale": e.scale}
    if isinstance(e, MixChange):
        return {"step": e.step, "kind": "mix", "weights": e.weights}
    if isinstance(e, LoadChange):
        return {"step": e.step, "kind": "load", "batch": e.batch}
    raise TypeError(f"unknown event {e!r}")
