"""Evaluate candidates with every estimator, per class and overall, with warnings.

The ranking in each scope uses one estimator per candidate: ``rank_by``
(doubly robust by default) for stationary candidates, rejection-sampling
replay for adaptive ones. Estimators come from the registry,
:data:`specctl.replay.estimators.ESTIMATORS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specctl.replay.bootstrap import Bootstrap
from specctl.replay.candidates import Candidate
from specctl.replay.data import LoggedRounds
from specctl.replay.estimators import (
    ESTIMATORS,
    SCOPE_ALL,
    BaseOffPolicyEstimator,
    IntervalEstimate,
    scopes,
)
from specctl.replay.rejection import RejectionReplay
from specctl.replay.truncation import fit_arm_model
from specctl.replay.weights import candidate_action_dist, importance_weights

# The estimator that ranks candidates that learn as they go.
ADAPTIVE_RANK_BY = next(n for n, cls in ESTIMATORS.items() if cls.uses_rejection_sampling)


@dataclass(frozen=True)
class Result:
    candidate: str
    estimator: str
    scope: str
    estimate: IntervalEstimate
    warnings: tuple[str, ...] = ()


@dataclass
class Evaluation:
    results: list[Result] = field(default_factory=list)
    rank_by: str = "dr"
    scopes: list[str] = field(default_factory=list)
    stationary: dict[str, bool] = field(default_factory=dict)

    def primary(self, candidate: str, scope: str) -> Result | None:
        mine = [r for r in self.results if r.candidate == candidate and r.scope == scope]
        wanted = self.rank_by if self.stationary.get(candidate, True) else ADAPTIVE_RANK_BY
        for r in mine:
            if r.estimator == wanted:
                return r
        return mine[0] if mine else None

    def ranking(self, scope: str = SCOPE_ALL) -> list[Result]:
        """One result per candidate, best goodput first; estimates that failed go last."""
        rows = [r for c in self.stationary if (r := self.primary(c, scope)) is not None]

        def key(r: Result) -> float:
            g = r.estimate.goodput
            return -g if math.isfinite(g) else math.inf

        return sorted(rows, key=key)


def _context_label(data: LoggedRounds, x: int) -> str:
    c, b = data.context_name(x)
    return f"({c}, bucket {b})"


def _warnings(
    data: LoggedRounds,
    estimator: BaseOffPolicyEstimator,
    scope_index: int,
    dist: np.ndarray,
    estimate: IntervalEstimate,
    min_ess: float,
    logged: np.ndarray,
    modelled: np.ndarray,
) -> tuple[str, ...]:
    out: list[str] = []
    in_scope = (
        np.ones(data.num_contexts, dtype=bool)
        if scope_index == 0
        else data.context_class == scope_index - 1
    )
    if estimator.weighted and estimate.effective_sample_size < min_ess:
        unit = "accepted step-contexts" if estimator.uses_rejection_sampling else "step-contexts"
        out.append(
            f"thin support: effective sample size {estimate.effective_sample_size:.0f} {unit}"
        )
    if estimator.weighted and not estimator.uses_rejection_sampling:
        blind = (dist > 0) & (logged == 0) & in_scope[:, None]
        if blind.any():
            x, a = map(int, np.argwhere(blind)[0])
            mass = float(dist[blind].sum() / max(int(in_scope.sum()), 1))
            what = (
                "the model carries that part" if estimator.model_based else "they are not counted"
            )
            out.append(
                f"plays arms the log never ran in this scope (e.g. {data.arms[a].name} in "
                f"{_context_label(data, x)}; mean P={mass:.2f}): {what}"
            )
    if estimator.model_based:
        missing = (dist > 0) & ~modelled & in_scope[:, None]
        if missing.any():
            x, a = map(int, np.argwhere(missing)[0])
            arm = data.arms[a]
            out.append(
                f"cannot model {arm.name} in {_context_label(data, x)}: no logged "
                f"{arm.drafter} round at K >= {arm.k} there"
            )
        if data.cost.rank_deficient:
            out.append(
                "step cost model not identified (drafts never varied apart from batch rows): "
                "seconds per round at unlogged K are unreliable"
            )
    if not math.isfinite(estimate.goodput):
        out.append("no estimate")
    return tuple(out)


def evaluate(
    data: LoggedRounds,
    candidates: Sequence[Candidate],
    *,
    estimators: Sequence[str] = tuple(ESTIMATORS),
    rank_by: str = "dr",
    alpha: float = 0.05,
    n_bootstrap_samples: int = 200,
    random_state: int | None = 0,
    update_every: int = 128,
    min_ess: float = 100.0,
    on_task: Callable[[str], None] | None = None,
) -> Evaluation:
    """Every (candidate, estimator) per scope. Adaptive candidates get only the
    rejection-sampling estimator."""
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        raise ValueError(f"unknown estimators {unknown}; known: {', '.join(ESTIMATORS)}")
    if rank_by not in ESTIMATORS:
        raise ValueError(f"rank_by={rank_by!r} must be one of {', '.join(ESTIMATORS)}")
    labels = [c.label for c in candidates]
    if len(set(labels)) != len(labels):
        raise ValueError(f"candidates must be distinct, got {labels}")
    evaluation = Evaluation(
        rank_by=rank_by,
        scopes=scopes(data),
        stationary={c.label: c.stationary for c in candidates},
    )
    # What the log can speak for, per (context, arm): logged step-contexts, and the model.
    logged = np.zeros((data.num_contexts, len(data.arms)))
    np.add.at(logged, (data.unit_context, data.unit_arm), 1.0)
    modelled = np.isfinite(fit_arm_model(data).tokens)
    bootstrap = Bootstrap(data, n_bootstrap_samples, random_state)
    for candidate in candidates:
        if candidate.arm is not None and data.arm_code(candidate.arm) is None:
            can = ", ".join(a.name for a in data.arms)
            raise ValueError(
                f"policy {candidate.label!r}: the log cannot evaluate {candidate.arm.name} "
                f"(it can evaluate {can}: logged arms and shorter K of logged drafters)"
            )
    for candidate in candidates:
        policy = candidate.make()
        policy.set_arms(data.arms)
        dist = candidate_action_dist(data, policy)
        importance = importance_weights(data, dist)
        for name in estimators:
            estimator = ESTIMATORS[name]()
            if not candidate.stationary and not estimator.uses_rejection_sampling:
                continue
            if on_task is not None:
                on_task(f"{candidate.label} {name}")
            weights = (
                RejectionReplay(update_every).weights(
                    data, candidate.make, random_state=random_state
                )
                if estimator.uses_rejection_sampling
                else importance
            )
            intervals = estimator.estimate_interval(data, weights, alpha=alpha, bootstrap=bootstrap)
            for i, scope in enumerate(evaluation.scopes):
                est = intervals[scope]
                evaluation.results.append(
                    Result(
                        candidate.label,
                        name,
                        scope,
                        est,
                        _warnings(data, estimator, i, dist, est, min_ess, logged, modelled),
                    )
                )
    return evaluation
