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

The peers run in two variants (:func:`~.bench_policies.policy_variant`):

- ``<name>``, *as shipped* (:func:`~.bench_params.shipped_params`): what a user gets without a
  sweep, the engine's configured K (the drafter offered first at its longest
  offered K, i.e. the engine's ``num_speculative_tokens``) and each system's
  own documented defaults;
- ``<name>@tuned``, *tuned in hindsight* (:func:`~.bench_params.baseline_params`): configured
  from the same sweep the simulator runs on, for the peers that take a drafter,
  a K or a table (``sglang-ema``, ``trtllm-threshold``, ``vllm-batch-table``).

``specctl`` is labelled ``learning`` (its defaults, nothing configured), the
references ``reference``.

Goodput is committed tokens per second of engine time; per class, over the
time charged to that class's requests (:mod:`.engine`). Ratios compare runs
with the same seed (:mod:`.bench_summary`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specctl.arms import Arm, parse_arm
from specctl.policy.base import Policy
from specctl.policy.registry import make_policy
from specctl.policy.static import StaticPolicy
from specctl.sidecar.book import PolicyBook
from specctl.sim.bench_explain import ClassReading, explain_run
from specctl.sim.bench_params import best_static_arm, engine_arm, policy_params
from specctl.sim.bench_policies import REFERENCES, base_policy, check_policy_name, policy_variant
from specctl.sim.bench_summary import summarize_run
from specctl.sim.engine import InProcessLink, RunRecord, SimulatedEngine, SimWorld, make_world
from specctl.sim.oracle import OraclePolicy
from specctl.sim.scenario import AcceptanceChange, LoadChange, MixChange, Scenario

Progress = Callable[[str], None]


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
    return _run(scenario, name, seed=seed, report_every=report_every, progress=progress)[0]


def _run(
    scenario: Scenario,
    name: str,
    *,
    seed: int,
    report_every: int,
    progress: Progress | None,
) -> tuple[RunRecord, list[ClassReading]]:
    """The run, and for a learning policy its evidence at the end next to the truth
    (:mod:`.bench_explain`)."""
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
    readings: list[ClassReading] = []
    if policy_variant(name) == "learning":
        bucket = link.view.load_bucket(world.batch_size)
        readings = explain_run(policy, world, record, bucket)
    return record, readings


@dataclass
class ScenarioResult:
    scenario: Scenario
    best_static: Arm
    runs: dict[str, RunRecord]
    summary: dict[str, dict[str, Any]]
    # per learning policy, its evidence at the run's end next to the truth
    explained: dict[str, list[ClassReading]] = field(default_factory=dict)


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
    ran = {
        name: _run(scenario, name, seed=seed, report_every=report_every, progress=progress)
        for name in names
    }
    runs = {name: record for name, (record, _) in ran.items()}
    explained = {name: readings for name, (_, readings) in ran.items() if readings}
    best = best_static_arm(scenario)
    summary = summarize_run(scenario, runs, best)
    for name, readings in explained.items():
        summary[name]["explained"] = [r.to_json() for r in readings]
    return ScenarioResult(scenario, best, runs, summary, explained)


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(float(np.mean(kept)), 4) if kept else None


def benchmark_json(
    scenario_name: str, results: Sequence[ScenarioResult], *, steps: int, seed: int
) -> dict[str, Any]:
    """The benchmark's JSON: ``policies`` keyed by policy name, means over the scenario runs.

    Each policy entry carries its ``variant`` (:func:`~.bench_policies.policy_variant`)
    and, per scenario run, the ``params`` it ran with (:func:`~.bench_params.policy_params`).
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
