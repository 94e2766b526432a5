"""Off-policy estimates against known true values, on a synthetic logging environment.

The environment (tests/replay_support.py) logs with a randomised policy; each
candidate's true value is measured by running it. Intervals must cover the
truth in at least 90% of 20 seeds, and the ranking must put the truly better
policy first wherever the gap exceeds the intervals' width.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from replay_support import (
    ARMS,
    CLASSES,
    LOGGING,
    Environment,
    TrueValue,
    log_table,
    logging_dist,
    static_dist,
    true_value,
    true_value_online,
)

from specctl.arms import Arm, parse_arm
from specctl.decisionlog import read_decision_log
from specctl.policy.base import Decision, Policy
from specctl.policy.state import PolicyState, StateReader, StateValue, state_header
from specctl.replay.bootstrap import Bootstrap
from specctl.replay.candidates import Candidate, parse_policy_spec
from specctl.replay.data import LoggedRounds, prepare
from specctl.replay.estimators import (
    DoublyRobust,
    InverseProbabilityWeighting,
    RejectionReplayEstimator,
    SelfNormalizedInverseProbabilityWeighting,
    TruncationModel,
)
from specctl.replay.evaluate import Evaluation, evaluate
from specctl.replay.rejection import RejectionReplay
from specctl.replay.weights import Weights, candidate_action_dist, importance_weights
from specctl.steps import StepBatch

ENV = Environment()
SEEDS = range(20)
STEPS = 4000
SPECS = ("off", "ngram/k=2", "ngram/k=4")
ESTIMATORS = ("ipw", "snipw", "dr", "model", "replay")


@pytest.fixture(scope="module")
def truths() -> dict[str, TrueValue]:
    return {spec: true_value(ENV, static_dist(parse_arm(spec))) for spec in SPECS}


@pytest.fixture(scope="module")
def evaluations() -> list[Evaluation]:
    out = []
    for seed in SEEDS:
        data = prepare(log_table(ENV, logging_dist(), STEPS, seed))
        candidates = [parse_policy_spec(s) for s in SPECS]
        out.append(evaluate(data, candidates, random_state=seed))
    return out


def test_intervals_cover_the_true_value_in_90_percent_of_seeds(
    evaluations: list[Evaluation], truths: dict[str, TrueValue]
) -> None:
    covered: dict[tuple[str, str, str], int] = {}
    for ev in evaluations:
        for r in ev.results:
            truth = truths[r.candidate].goodput[r.scope]
            key = (r.candidate, r.estimator, r.scope)
            hit = r.estimate.goodput_low <= truth <= r.estimate.goodput_high
            covered[key] = covered.get(key, 0) + int(hit)
    assert len(covered) == len(SPECS) * len(ESTIMATORS) * (1 + len(CLASSES))
    overall = {k: v for k, v in covered.items() if k[2] == "all"}
    assert all(v >= 18 for v in overall.values()), overall
    # per class, pooled over candidates, per estimator
    for est in ESTIMATORS:
        hits = sum(v for k, v in covered.items() if k[1] == est and k[2] != "all")
        assert hits >= 0.9 * len(SEEDS) * len(SPECS) * len(CLASSES), (est, hits)


def test_ranking_puts_the_truly_better_policy_first_when_the_gap_exceeds_the_width(
    evaluations: list[Evaluation], truths: dict[str, TrueValue]
) -> None:
    decisive = 0
    for ev in evaluations:
        for scope in ev.scopes:
            ranking = ev.ranking(scope)
            assert len(ranking) == len(SPECS)
            for i, better in enumerate(ranking):
                for worse in ranking[i + 1 :]:
                    gap = (
                        truths[worse.candidate].goodput[scope]
                        - truths[better.candidate].goodput[scope]
                    )
                    width = max(
                        r.estimate.goodput_high - r.estimate.goodput_low for r in (better, worse)
                    )
                    if abs(gap) > width:
                        decisive += 1
                        assert gap < 0, (scope, better.candidate, worse.candidate, gap, width)
        assert ev.ranking("all")[0].candidate == "ngram/k=2"
        assert ev.ranking("all")[0].estimator == "dr"
    assert decisive >= len(SEEDS) * 3


def test_step_time_is_split_across_rows_without_loss() -> None:
    data = prepare(log_table(ENV, logging_dist(), 500, 3))
    per_step = np.bincount(data.unit_step, weights=data.unit_seconds, minlength=data.num_steps)
    np.testing.assert_allclose(per_step, data.step_time_s, rtol=1e-9)
    np.testing.assert_allclose(data.attribute_seconds(data.cost), data.unit_seconds, rtol=1e-9)
    assert data.num_rows == int(data.unit_rows.sum())
    # the fitted cost model finds the environment's per-draft cost
    np.testing.assert_allclose(data.cost.per_draft[:, 0], ENV.per_draft_s, rtol=0.15)
    np.testing.assert_allclose(data.cost.per_spec_row[:, 0], 0.0, atol=0.0005)


def _weights(data: LoggedRounds, spec: str) -> Weights:
    policy = parse_policy_spec(spec).make()
    policy.set_arms(data.arms)
    return importance_weights(data, candidate_action_dist(data, policy))


def test_truncation_model_evaluates_shorter_proposals_the_log_never_ran() -> None:
    """Logged only off and ngram/k=4: k=2 is unseen, but every k=4 round reveals it."""
    only_4 = np.zeros_like(LOGGING)
    only_4[ARMS.index(Arm("", 0))] = 0.3
    only_4[ARMS.index(Arm("ngram", 4))] = 0.7
    dist = np.broadcast_to(only_4, logging_dist().shape).copy()
    data = prepare(log_table(ENV, dist, STEPS, 11))
    assert {a.name for a in data.arms} >= {"ngram/k=2", "ngram/k=3"}
    truth = true_value(ENV, static_dist(Arm("ngram", 2)))
    candidate = _weights(data, "ngram/k=2")
    boot = Bootstrap(data, 200, random_state=1)
    model = TruncationModel().estimate_interval(data, candidate, bootstrap=boot)
    dr = DoublyRobust().estimate_interval(data, candidate, bootstrap=boot)
    for est in (model, dr):
        assert est["all"].goodput_low <= truth.goodput["all"] <= est["all"].goodput_high
        assert est["all"].tokens_low <= truth.tokens_per_round["all"] <= est["all"].tokens_high
    ips = InverseProbabilityWeighting().estimate_interval(data, candidate, bootstrap=boot)
    assert ips["all"].effective_sample_size == 0.0  # no logged k=2 round at all
    ev = evaluate(data, [parse_policy_spec("ngram/k=2")], n_bootstrap_samples=50)
    warnings = {r.estimator: r.warnings for r in ev.results if r.scope == "all"}
    assert any("never ran" in w for w in warnings["ipw"])
    assert any("model carries" in w for w in warnings["dr"])
    assert not any("cannot model" in w for w in warnings["model"])
    assert ev.ranking("all")[0].estimator == "dr"


def test_arms_beyond_the_logged_k_are_refused_by_name() -> None:
    data = prepare(log_table(ENV, logging_dist(), 200, 0))
    with pytest.raises(ValueError, match="cannot evaluate ngram/k=6"):
        evaluate(data, [parse_policy_spec("ngram/k=6")], n_bootstrap_samples=5)


def test_a_log_whose_bad_arm_rows_were_left_out_prepares(tmp_path: Path) -> None:
    """The arm column's dictionary still names the bad arm no remaining row uses."""
    table = log_table(ENV, logging_dist(), 100, 0)
    arm = table.column("arm").combine_chunks()
    names = [*arm.dictionary.to_pylist(), "bogus"]
    codes = arm.indices.to_numpy().copy()
    codes[0] = len(names) - 1
    bad = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(names))
    i = table.schema.get_field_index("arm")
    pq.write_table(table.set_column(i, table.schema.field("arm"), bad), tmp_path / "x.parquet")
    log = read_decision_log([tmp_path / "x.parquet"], on_bad_input="skip")
    assert [p.reason for p in log.problems] == ["arm"]
    data = prepare(log.table)
    assert data.num_rows == table.num_rows - 1
    assert "bogus" not in {a.name for a in data.arms}


def test_ipw_and_snipw_agree_on_goodput_and_differ_on_tokens() -> None:
    data = prepare(log_table(ENV, logging_dist(), 1000, 5))
    d = _weights(data, "ngram/k=4")
    ips = InverseProbabilityWeighting().estimate_policy_value(data, d)["all"]
    snips = SelfNormalizedInverseProbabilityWeighting().estimate_policy_value(data, d)["all"]
    assert ips.goodput == pytest.approx(snips.goodput, rel=1e-12)
    assert ips.tokens_per_round != snips.tokens_per_round


class EpsilonGreedy(Policy):
    """Learns tokens and seconds per round per (class, bucket, arm); plays the best
    goodput with probability 1 - epsilon. A stand-in for an adaptive policy."""

    policy_name = "epsilon_greedy"

    def __init__(self, epsilon: float = 0.2) -> None:
        self.epsilon = epsilon
        self.arms: tuple[Arm, ...] = ()
        self.tokens: dict[tuple[str, int, Arm], float] = {}
        self.seconds: dict[tuple[str, int, Arm], float] = {}

    def set_arms(self, arms: Sequence[Arm]) -> None:
        self.arms = tuple(arms)

    def update_params(self, batch: StepBatch) -> None:
        share = batch.step_time_s / batch.num_requests
        for i in range(batch.num_rows):
            key = (
                batch.classes[batch.class_index[i]],
                int(batch.load_bucket[batch.request_step[i]]),
                batch.arms[batch.arm_index[i]],
            )
            self.tokens[key] = self.tokens.get(key, 0.0) + 1 + int(batch.accepted[i])
            self.seconds[key] = self.seconds.get(key, 0.0) + float(share[batch.request_step[i]])

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        def goodput(arm: Arm) -> float:
            key = (workload_class, load_bucket, arm)
            return self.tokens.get(key, 0.0) / self.seconds.get(key, 1.0)

        best = max(self.arms, key=goodput)
        p = np.full(len(self.arms), self.epsilon / len(self.arms))
        p[self.arms.index(best)] += 1.0 - self.epsilon
        return Decision(self.arms, p, "epsilon-greedy")

    def state_dict(self) -> PolicyState:
        keys = list(self.tokens)
        return {
            **state_header(self.policy_name, self.state_version),
            "classes": np.array([c for c, _, _ in keys], dtype=np.str_),
            "buckets": np.array([b for _, b, _ in keys], dtype=np.int64),
            "arms": np.array([a.name for _, _, a in keys], dtype=np.str_),
            "tokens": np.array([self.tokens[k] for k in keys]),
            "seconds": np.array([self.seconds[k] for k in keys]),
        }

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        reader = StateReader(state, self.policy_name, self.state_version)
        arms = reader.arms("arms")
        n = len(arms)
        keys = [
            (c, b, a)
            for c, b, a in zip(
                reader.strings("classes", n), reader.array("buckets", (n,), "i"), arms, strict=True
            )
        ]
        self.tokens = dict(zip(keys, reader.array("tokens", (n,)).tolist(), strict=True))
        self.seconds = dict(zip(keys, reader.array("seconds", (n,)).tolist(), strict=True))


def test_rejection_replay_matches_an_adaptive_policy_run_online() -> None:
    """Replay's value of a learning policy is what the policy earns when run online.

    One replay (or one online run) follows one learning path; both are averaged
    over a few paths before they are compared.
    """
    data = prepare(log_table(ENV, logging_dist(), 20_000, 21))
    replay = RejectionReplay(update_every=128)
    accepted = replay.accepted_units(data, EpsilonGreedy, random_state=3)
    # about min(propensity) / propensity of the log is accepted
    assert 0.05 * data.num_units < accepted.size < 0.2 * data.num_units
    assert np.all(np.diff(data.step_end_unix_s[data.unit_step[accepted]]) >= 0)
    estimates = [
        RejectionReplayEstimator().estimate_interval(
            data, replay.weights(data, EpsilonGreedy, random_state=seed), random_state=seed
        )["all"]
        for seed in range(4)
    ]
    replayed = float(np.mean([e.goodput for e in estimates]))
    # the online policy meets about two step-contexts per step, so its steps are half
    steps = int(np.mean([e.effective_sample_size for e in estimates]) / 2)
    online = float(
        np.mean(
            [true_value_online(ENV, EpsilonGreedy, steps, seed=s).goodput["all"] for s in range(6)]
        )
    )
    assert abs(replayed - online) < 0.01 * online, (replayed, online)
    # it learned: well above the policy that logged
    logging = true_value(ENV, logging_dist(), num_steps=50_000)
    assert min(e.goodput_low for e in estimates) > logging.goodput["all"] + 20
    ev = evaluate(data, [Candidate("epsilon-greedy", EpsilonGreedy, stationary=False)])
    assert {r.estimator for r in ev.results} == {"replay"}


def test_ipw_on_step_sums_equals_the_per_unit_formula() -> None:
    data = prepare(log_table(ENV, logging_dist(), 1000, 8))
    d = _weights(data, "ngram/k=2")
    assert d.action_dist is not None
    w = d.action_dist[data.unit_context, data.unit_arm] / data.unit_propensity
    chat = data.unit_class == CLASSES.index("chat")
    value = InverseProbabilityWeighting().estimate_policy_value(data, d)
    for scope, m in (("all", np.ones_like(chat)), ("chat", chat)):
        rounds = data.unit_rows[m].sum()
        assert value[scope].tokens_per_round == pytest.approx(
            (w * data.unit_tokens)[m].sum() / rounds
        )
        assert value[scope].seconds_per_round == pytest.approx(
            (w * data.unit_seconds)[m].sum() / rounds
        )
