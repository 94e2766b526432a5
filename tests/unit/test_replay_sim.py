"""Replay on the simulator's logs, whose true values are known by running each candidate.

The simulator (controller/sim) runs Qwen3-8B from the AMD study with EAGLE-3,
DFlash and DSpark drafters through the production path (the engine's sampler,
report encoding and validation, the policy book); its decision log is written
by the book's sink, as the sidecar writes it. Two things differ from the
estimators' assumptions, on purpose: a round's cost is the study's per
(dataset, N) measurement, not linear in K, and acceptance per position depends
on N. So tokens per round (which needs no time model) must be covered by the
weighted estimators' intervals, while goodput is held to within 10%.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from specctl.arms import Arm, parse_arm
from specctl.decisionlog import DecisionLogConfig, DecisionLogWriter, read_decision_log
from specctl.policy.base import Decision, Policy
from specctl.policy.state import PolicyState, StateReader, StateValue, state_header
from specctl.policy.static import StaticPolicy
from specctl.replay.candidates import parse_policy_spec
from specctl.replay.data import prepare
from specctl.replay.evaluate import Evaluation, evaluate
from specctl.sidecar.book import PolicyBook
from specctl.sim.engine import InProcessLink, RunRecord, SimulatedEngine, World
from specctl.sim.scenario import Scenario, qwen3_8b
from specctl.sim.table import read_rows
from specctl.steps import StepBatch

STEPS = 4000
SPECS = ("off", "eagle3/k=3", "dflash/k=3", "dspark/k=1", "dflash/k=8")


class UniformLogging(Policy):
    """Every offered arm with equal probability: the logging policy."""

    policy_name = "uniform"

    def set_arms(self, arms: Sequence[Arm]) -> None:
        self.arms = tuple(arms)

    def update_params(self, batch: StepBatch) -> None:
        return None

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        return Decision(self.arms, np.full(len(self.arms), 1.0 / len(self.arms)), "uniform")

    def state_dict(self) -> PolicyState:
        return state_header(self.policy_name, self.state_version)

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        StateReader(state, self.policy_name, self.state_version)


def _run(
    scenario: Scenario, policy: Policy, seed: int, sink: DecisionLogWriter | None
) -> RunRecord:
    world = World(scenario, np.random.default_rng([seed, 0]))
    book = PolicyBook(policy, policy_name=policy.policy_name, max_classes=64)
    if sink is not None:
        book.add_sink(sink)
    link = InProcessLink(book, scenario.model.drafters, report_every=8)
    return SimulatedEngine(world, link, seed=seed).run(scenario.steps)


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return qwen3_8b(read_rows(), STEPS)[0]


@pytest.fixture(scope="module")
def evaluation(scenario: Scenario) -> Evaluation:
    with tempfile.TemporaryDirectory() as tmp:
        with DecisionLogWriter(DecisionLogConfig(Path(tmp))) as writer:
            _run(scenario, UniformLogging(), 1, writer)
        data = prepare(read_decision_log([tmp]).table)
    return evaluate(data, [parse_policy_spec(s) for s in SPECS], random_state=0)


@pytest.fixture(scope="module")
def truths(scenario: Scenario) -> dict[str, tuple[float, float]]:
    """(goodput, tokens per round) of each candidate, by running it."""
    out = {}
    for spec in SPECS:
        rec = _run(scenario, StaticPolicy(parse_arm(spec)), 99, None)
        tokens = float(rec.tokens.sum())
        out[spec] = (tokens / float(rec.time_s.sum()), tokens / float(rec.block_rounds.sum()))
    return out


def test_weighted_estimators_cover_tokens_per_round_and_come_close_on_goodput(
    evaluation: Evaluation, truths: dict[str, tuple[float, float]]
) -> None:
    checked = 0
    for r in evaluation.results:
        if r.scope != "all" or r.estimator not in ("snipw", "dr", "replay"):
            continue
        goodput, tokens = truths[r.candidate]
        e = r.estimate
        assert e.tokens_low <= tokens <= e.tokens_high, (r.candidate, r.estimator, tokens, e)
        assert abs(e.goodput / goodput - 1.0) < 0.10, (r.candidate, r.estimator, goodput, e)
        checked += 1
    assert checked == 3 * len(SPECS)


def test_ranking_is_right_where_the_gap_exceeds_the_width_and_the_model_error(
    evaluation: Evaluation, truths: dict[str, tuple[float, float]]
) -> None:
    ranking = evaluation.ranking("all")
    assert [r.estimator for r in ranking] == ["dr"] * len(SPECS)
    decisive = 0
    for i, better in enumerate(ranking):
        for worse in ranking[i + 1 :]:
            gap = truths[better.candidate][0] - truths[worse.candidate][0]
            width = max(r.estimate.goodput_high - r.estimate.goodput_low for r in (better, worse))
            if abs(gap) > width + 0.10 * truths[better.candidate][0]:
                decisive += 1
                assert gap > 0, (better.candidate, worse.candidate, gap)
    assert decisive >= 6
