"""Where a learning policy's regret comes from, read off its own evidence at a run's end.

The simulator knows, per class, each arm's true committed tokens per round and the cost of
a round in plain decode steps. A policy's :meth:`~specctl.policy.base.Policy.evidence` says
what it believes of both: ``expected_tokens``, and the round cost its ``goodput`` implies
(its time per committed token times the tokens). A policy's goodput for an arm is the
class's within the batch it shares, so its level is not the sweep's; its shape over the
arms is what a choice rests on, so the belief is put in the truth's units at the arm the
class ran most.

Side by side they tell an acceptance error from a cost error, which a goodput ratio alone
cannot: per class, the arm the policy believes best, and the arm it would pick knowing the
true tokens but keeping its own costs (``pick_with_true_tokens``) or knowing the true costs
but keeping its own tokens (``pick_with_true_cost``), each valued at the truth against the
class's best arm. A loss that goes with the true costs and stays with the true tokens is
the cost model's, and the other way round.

It describes the world's conditions at the run's end, so it reads a scenario whose last
event is well before its end (the stationary targets, ``qwen3-8b``); it is a read: the
evidence never changes what the policy has learned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specctl.policy.base import ArmEstimate, Policy
from specctl.sim.engine import RunRecord, SimWorld


@dataclass(frozen=True)
class ArmReading:
    """One arm for one class: the truth, the policy's belief, and what the class ran."""

    arm: str
    true_tokens: float  # committed tokens per request-round
    estimated_tokens: float
    true_cost: float  # a round, in plain decode steps (off = 1)
    # the round cost the policy's goodput implies, scaled to the truth at the class's
    # most-run arm
    estimated_cost: float
    goodput_vs_best: float  # true goodput over the class's best arm's
    prob_best: float
    share: float  # of the class's request-rounds over the run

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0 + 1e-9:
            raise ValueError(f"{self.arm}: share {self.share} is not in [0, 1]")


@dataclass(frozen=True)
class ClassReading:
    """One class at the run's end: which arm is best, which the policy believes best, and
    what it loses from its token estimates and from its cost estimates."""

    workload_class: str
    load_bucket: int
    best_arm: str
    believed_best: str
    pick_with_true_tokens: str
    pick_with_true_cost: str
    loss: float  # 1 - the believed best arm's true goodput over the best arm's
    loss_with_true_tokens: float
    loss_with_true_cost: float
    arms: tuple[ArmReading, ...]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["arms"] = [asdict(a) for a in self.arms]
        return out


def explain_run(
    policy: Policy, world: SimWorld, record: RunRecord, load_bucket: int
) -> list[ClassReading]:
    """Per class, the policy's evidence in ``load_bucket`` next to the world's truth; empty
    where the policy has no per-arm evidence (the peers and the references)."""
    arms = [a.name for a in world.model.arms]
    readings = []
    for c, name in enumerate(world.model.classes):
        evidence = policy.evidence(name, load_bucket).arms
        estimates = {e.arm.name: e for e in evidence if e.goodput > 0 and e.expected_tokens > 0}
        known = [i for i, a in enumerate(arms) if a in estimates]
        if "off" not in estimates or len(known) < 2:
            continue
        readings.append(_read_class(world, record, c, load_bucket, known, estimates))
    return readings


def _read_class(
    world: SimWorld,
    record: RunRecord,
    c: int,
    load_bucket: int,
    known: list[int],
    estimates: dict[str, ArmEstimate],
) -> ClassReading:
    names = [world.model.arms[i].name for i in known]
    true_tokens = world.expected_tokens[c, known]
    true_cost = world.cost[c, known]
    est_tokens = np.array([estimates[a].expected_tokens for a in names])
    est_goodput = np.array([estimates[a].goodput for a in names])
    rounds = record.rounds[c, known]
    total = max(int(rounds.sum()), 1)
    # the round cost the policy's goodput implies (its time per committed token times the
    # tokens), in the truth's units at the arm the class ran most: its shape over the arms
    # is what the policy's choice among them rests on
    most = int(np.argmax(rounds))
    est_cost = est_tokens / est_goodput
    est_cost *= true_cost[most] / est_cost[most]
    true_goodput = true_tokens / true_cost
    best = int(np.argmax(true_goodput))

    def loss(pick: int) -> float:
        return round(1.0 - float(true_goodput[pick] / true_goodput[best]), 4)

    believed = int(np.argmax(est_goodput))
    with_true_tokens = int(np.argmax(true_tokens / est_cost))
    with_true_cost = int(np.argmax(est_tokens / true_cost))
    return ClassReading(
        workload_class=world.model.classes[c],
        load_bucket=load_bucket,
        best_arm=names[best],
        believed_best=names[believed],
        pick_with_true_tokens=names[with_true_tokens],
        pick_with_true_cost=names[with_true_cost],
        loss=loss(believed),
        loss_with_true_tokens=loss(with_true_tokens),
        loss_with_true_cost=loss(with_true_cost),
        arms=tuple(
            ArmReading(
                arm=a,
                true_tokens=round(float(true_tokens[j]), 4),
                estimated_tokens=round(float(est_tokens[j]), 4),
                true_cost=round(float(true_cost[j]), 4),
                estimated_cost=round(float(est_cost[j]), 4),
                goodput_vs_best=round(float(true_goodput[j] / true_goodput[best]), 4),
                prob_best=round(estimates[a].prob_best, 4),
                share=round(int(rounds[j]) / total, 4),
            )
            for j, a in enumerate(names)
        ),
    )


def format_readings(policy_name: str, run_name: str, readings: list[ClassReading]) -> str:
    """A table per class: its most-run arms and its best, truth next to belief."""
    lines = []
    for r in readings:
        lines.append(
            f"{run_name} {policy_name} {r.workload_class} (bucket {r.load_bucket}): best "
            f"{r.best_arm}, believed {r.believed_best} (loses {r.loss:.3f}); with the true "
            f"tokens {r.pick_with_true_tokens} ({r.loss_with_true_tokens:.3f}), with the true "
            f"cost {r.pick_with_true_cost} ({r.loss_with_true_cost:.3f})"
        )
        lines.append(
            f"  {'arm':<14} {'share':>6} {'tokens':>7} {'est':>7} {'cost':>7} {'est':>7} "
            f"{'vs best':>7} {'P(best)':>7}"
        )
        shown = sorted(r.arms, key=lambda a: -a.share)[:5]
        if all(a.arm != r.best_arm for a in shown):
            shown.append(next(a for a in r.arms if a.arm == r.best_arm))
        for a in shown:
            lines.append(
                f"  {a.arm:<14} {a.share:>6.3f} {a.true_tokens:>7.3f} {a.estimated_tokens:>7.3f} "
                f"{a.true_cost:>7.3f} {a.estimated_cost:>7.3f} {a.goodput_vs_best:>7.3f} "
                f"{a.prob_best:>7.3f}"
            )
    return "\n".join(lines)
