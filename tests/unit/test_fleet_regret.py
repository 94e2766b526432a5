"""benchmarks/fleet_regret.py: the cold and the warm run of a fleet see the same draws, and
a replica started from a learned state pays less regret than one started cold."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from specctl.sim.engine import World
from specctl.sim.scenario import build_scenarios

STEPS = 600


@pytest.fixture(scope="module")
def fleet_regret() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_regret.py"
    spec = importlib.util.spec_from_file_location("fleet_regret", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def _run(world: World, arm: int, steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Run every request on ``arm``; the classes of the requests that arrived, in order,
    and each step's acceptance uniforms."""
    arrived: list[int] = []
    uniforms: list[np.ndarray] = []
    new_classes, accept = world._new_classes, world._accept_rng

    def record_classes(n: int) -> np.ndarray:
        out = new_classes(n)
        arrived.extend(out.tolist())
        return out

    class Recording:
        def random(self, shape: tuple[int, int]) -> np.ndarray:
            out = accept.random(shape)
            uniforms.append(out)
            return out

    world._new_classes = record_classes  # type: ignore[method-assign]
    world._accept_rng = Recording()  # type: ignore[assignment]
    for _ in range(steps):
        world.run_round(np.full(len(world.slot_class), arm, dtype=np.int64))
    return arrived, uniforms


def test_independent_draws_do_not_depend_on_the_arms() -> None:
    (scenario,) = build_scenarios("qwen3-8b", STEPS)
    deepest = int(np.argmax(scenario.model.arm_k))
    off = int(np.flatnonzero(scenario.model.arm_k == 0)[0])
    drafted = World(scenario, np.random.default_rng([3, 0, 0]), independent_draws=True)
    plain = World(scenario, np.random.default_rng([3, 0, 0]), independent_draws=True)
    assert np.array_equal(drafted.slot_class, plain.slot_class)
    arrived_drafted, uniforms_drafted = _run(drafted, deepest, 300)
    arrived_plain, uniforms_plain = _run(plain, off, 300)
    # drafting finishes requests sooner: more arrive, and the first ones are the same
    assert len(arrived_drafted) > len(arrived_plain) > 0
    assert arrived_drafted[: len(arrived_plain)] == arrived_plain
    # every step draws its uniforms, whether it drafts or not, and the same ones
    assert len(uniforms_drafted) == len(uniforms_plain) == 300
    assert all(np.array_equal(a, b) for a, b in zip(uniforms_drafted, uniforms_plain, strict=True))
    assert drafted._noise_rng.random() == plain._noise_rng.random()


def test_a_warm_replica_pays_less_than_a_cold_one(fleet_regret: ModuleType) -> None:
    setup = fleet_regret.Setup(STEPS, exchange_steps=107, report_every=8)
    scenario = setup.scenario()
    warm = fleet_regret.learn_warm_state(scenario, 0, setup.report_every)
    runs = [fleet_regret.fleet_task(setup, 0, 1, False, state) for state in (None, warm)]
    cold, learned = runs
    assert (cold["start"], learned["start"]) == ("cold", "warm")
    run = fleet_regret.paired(cold, learned, 1, False, STEPS)
    assert run["exploration_regret_tokens"] == cold["regret_tokens"] - learned["regret_tokens"]
    assert learned["regret_tokens"] < 0.75 * cold["regret_tokens"]
    # the same fleet, started warm twice, pays the same: nothing but the start differs
    again = fleet_regret.fleet_task(setup, 0, 1, False, warm)
    assert again["curve"] == learned["curve"]


def test_a_warm_sharing_fleet_restores_every_replica(fleet_regret: ModuleType) -> None:
    setup = fleet_regret.Setup(STEPS, exchange_steps=107, report_every=8)
    warm = fleet_regret.learn_warm_state(setup.scenario(), 1, setup.report_every)
    cold = fleet_regret.fleet_task(setup, 1, 4, True, None)
    learned = fleet_regret.fleet_task(setup, 1, 4, True, warm)
    run = fleet_regret.paired(cold, learned, 4, True, STEPS)
    assert run["exploration_before_first_merge_tokens"] > 0
    assert run["exploration_regret_tokens"] > 0


def test_regret_over_one_learned_replica_takes_one_mark_for_every_fleet(
    fleet_regret: ModuleType,
) -> None:
    """The second measure subtracts one learned replica's regret from every fleet's cold
    regret, where the first subtracts each fleet's own warm run."""
    runs = [
        {"replicas": 1, "sharing": False, "regret_tokens": 110.0, "warm_regret_tokens": 100.0},
        {"replicas": 16, "sharing": True, "regret_tokens": 95.0, "warm_regret_tokens": 80.0},
    ]
    fleet_regret.add_regret_over_one_learned(runs)
    assert [r["regret_over_one_learned_tokens"] for r in runs] == [10.0, -5.0]
    with pytest.raises(AssertionError):
        fleet_regret.add_regret_over_one_learned(runs[1:])


def test_every_replica_runs_the_parameters_given(fleet_regret: ModuleType) -> None:
    setup = fleet_regret.Setup(STEPS, exchange_steps=107, report_every=8)
    params = fleet_regret.parse_params('{"fleet_max_rounds": 800000}')
    replica = fleet_regret.make_replica(setup.scenario(), 0, 3, 8, params=params)
    assert replica.book.policy.config.fleet_max_rounds == 800000
    default = fleet_regret.make_replica(setup.scenario(), 0, 3, 8)
    assert default.book.policy.config.fleet_max_rounds == 800000
    for bad, message in (
        ("[1]", "JSON object"),
        ("{", "not JSON"),
        ('{"fleet_max_rounds": 0}', "fleet_max_rounds"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            fleet_regret.parse_params(bad)
