"""Scenario 2 at CI size: on Qwen3-8B, where EAGLE-3 loses on math500 at every N, specctl's
policy ends up on another drafter or off there."""

from __future__ import annotations

import numpy as np
import pytest

from specctl.arms import OFF
from specctl.policy.registry import make_policy
from specctl.sidecar.admission import Refused
from specctl.sidecar.book import PolicyBook
from specctl.sim.engine import InProcessLink, SimulatedEngine, World
from specctl.sim.scenario import build_scenarios
from specctl.steps import StepRecord

STEPS = 2000


def test_qwen3_8b_math500_leaves_eagle3() -> None:
    scenario = build_scenarios("qwen3-8b", STEPS)[0]
    model = scenario.model
    math500 = model.classes.index("math500")
    eagle3 = [i for i, a in enumerate(model.arms) if a.drafter == "eagle3"]
    world = World(scenario, np.random.default_rng(11))
    # the premise, from the table: every EAGLE-3 arm is below no speculation on math500
    assert (world.goodput[math500, eagle3] < world.goodput[math500, model.arm_index(OFF)]).all()

    book = PolicyBook(make_policy("specctl"), policy_name="specctl")
    link = InProcessLink(book, model.drafters)
    record = SimulatedEngine(world, link, seed=11).run(STEPS)

    bucket = link.view.load_bucket(scenario.batch)
    published = book.decision("math500", bucket)
    assert published.mode.drafter != "eagle3", published
    assert sum(published.probability_of(model.arms[a]) for a in eagle3) < 0.1
    # and over the run EAGLE-3 got little of math500's traffic
    share = record.rounds[math500, eagle3].sum() / record.rounds[math500].sum()
    assert share < 0.2


def _step(arm: str, sequence: int) -> StepRecord:
    return StepRecord(
        step_index=sequence,
        step_time_s=0.02,
        batch_size=1,
        num_scheduled_tokens=1,
        policy_version=1,
        load_bucket=0,
        step_end_unix_s=1.7e9,
        classes=["chat"],
        arms=[arm],
        propensity=[1.0],
        drafted=[0],
        accepted=[0],
    )


def test_the_in_process_link_admits_through_the_servers_admission() -> None:
    book = PolicyBook(make_policy("static", {"arm": "ngram/k=4"}))
    with pytest.raises(Refused, match=r"hello.drafters\[0\].max_k=99"):
        InProcessLink(book, {"ngram": 99})
    link = InProcessLink(book, {"ngram": 4}, report_every=1)
    link.push(_step("ngram/k=4", 1))
    assert link.admission.metrics.reports_received._value.get() == 1
    assert "chat" in book.classes
    with pytest.raises(RuntimeError, match="drafter 'eagle3' was not offered"):
        link.push(_step("eagle3/k=2", 2))
    rejected = link.admission.metrics.reports_rejected.labels("unknown_arm")._value.get()
    assert rejected == 1
