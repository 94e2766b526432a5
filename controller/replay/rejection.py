"""Rejection-sampling replay (Li et al. 2011) for policies that learn as they go.

The log is walked in time order. Each logged step-context is *accepted* with
probability ``pi(logged arm | context) / (M * propensity)``, where ``pi`` is
the candidate's distribution at that moment and ``M = 1 / min propensity``
bounds the weights, so accepted rounds are distributed as if the candidate had
chosen them; the candidate then learns from what it accepted
(``update_params``), as it would in the sidecar. The candidate learns and
refreshes its distribution after every ``update_every`` accepted
step-contexts, its own interactions, like a policy push (128 is about 64
steps of an engine serving two classes).

What comes out is weights: 1 for each accepted step-context, 0 for the rest,
which the ``replay`` estimator (:class:`~specctl.replay.estimators.RejectionReplayEstimator`)
turns into the value of the accepted rounds. Unbiased for any policy, adaptive
or not, as long as the log gave every arm it plays a positive propensity; it
uses about ``1/M`` of the log per unit of probability, so it needs large logs
and says how many rounds it accepted. Intervals resample the accepted rounds'
steps: they do not include the variability of the candidate's own learning
path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specctl.decisionlog.rows import LogRows, to_step_batch
from specctl.policy.base import Policy
from specctl.replay.data import LoggedRounds
from specctl.replay.weights import Weights, candidate_action_dist
from specctl.steps import StepBatch

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _rows_of(data: LoggedRounds, units: IntArray) -> IntArray:
    """Row indices of ``units``, in order."""
    counts = data.unit_rows[units].astype(np.int64)
    starts = np.repeat(data.unit_start[units], counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return starts + offsets


def _batches_of(
    data: LoggedRounds, units: IntArray, propensity: FloatArray, sequence: int
) -> list[StepBatch]:
    """What the candidate would have seen: the accepted rounds as step batches, per engine.

    A step carries only its accepted rows, with their share of the step's time, and
    the K the engine's batch drafter drafted at in it, as the engine reported;
    ``propensity`` is the candidate's, per unit of ``units`` (sorted).
    """
    rows = _rows_of(data, units)
    row_unit = np.repeat(np.arange(units.shape[0]), data.unit_rows[units].astype(np.int64))
    unit = units[row_unit]
    step = data.unit_step[unit]
    accepted = LogRows(
        engines=data.engines,
        classes=data.classes,
        arms=data.arms,
        batch_drafters=data.batch_drafters,
        engine=data.step_engine[step],
        workload_class=data.unit_class[unit],
        arm=data.unit_arm[unit],
        time_unix_s=data.step_end_unix_s[step],
        step_index=data.step_index[step],
        load_bucket=data.step_bucket[step],
        propensity=propensity[row_unit],
        drafted=data.row_drafted[rows],
        accepted=data.row_accepted[rows],
        step_time_s=data.step_time_s[step],
        batch_size=data.step_batch_size[step],
        num_scheduled_tokens=data.step_scheduled_tokens[step],
        policy_version=np.zeros(rows.shape[0], dtype=np.int64),
        report_sequence=np.full(rows.shape[0], sequence, dtype=np.int64),
        batch_drafter=data.step_batch_drafter[step],
        draft_k=data.step_draft_k[step],
    )
    batches = []
    for engine in np.unique(accepted.engine):
        mine = np.flatnonzero(accepted.engine == engine)
        batches.append(to_step_batch(accepted.take(mine), row_seconds=data.row_seconds[rows[mine]]))
    return batches


@dataclass(frozen=True)
class RejectionReplay:
    """Replay a candidate that learns against the log; see the module docstring."""

    update_every: int = 128

    def __post_init__(self) -> None:
        if self.update_every < 1:
            raise ValueError(f"update_every={self.update_every} must be at least 1")

    def accepted_units(
        self,
        data: LoggedRounds,
        make_policy: Callable[[], Policy],
        *,
        random_state: int | None = None,
    ) -> IntArray:
        """Replay the log through a fresh policy; the accepted units, in time order."""
        policy = make_policy()
        policy.set_arms(data.arms)
        rng = np.random.default_rng(random_state)
        scale = float(data.unit_propensity.min())  # 1 / M
        step_rank = np.empty(data.num_steps, dtype=np.int64)
        step_rank[np.argsort(data.step_end_unix_s, kind="stable")] = np.arange(data.num_steps)
        order = np.argsort(step_rank[data.unit_step], kind="stable")
        # Decide acceptance a block at a time under the current distribution; at the
        # update_every-th acceptance the candidate learns, and decisions drawn past
        # that point are thrown away (they influenced nothing) and drawn again.
        block = max(4 * self.update_every, 1024)
        accepted: list[IntArray] = []
        pending: list[IntArray] = []
        num_pending = 0
        updates = 0
        pos = 0
        dist = candidate_action_dist(data, policy)
        while pos < order.shape[0]:
            units = order[pos : pos + block]
            pi = dist[data.unit_context[units], data.unit_arm[units]]
            keep = rng.random(units.shape[0]) * data.unit_propensity[units] < pi * scale
            need = self.update_every - num_pending
            hits = np.flatnonzero(keep)
            if hits.size >= need:
                cut = int(hits[need - 1]) + 1
                pending.append(units[:cut][keep[:cut]])
                pos += cut
                taken = np.sort(np.concatenate(pending))
                taken_pi = dist[data.unit_context[taken], data.unit_arm[taken]]
                for batch in _batches_of(data, taken, taken_pi, updates):
                    policy.update_params(batch)
                accepted.append(taken)
                pending, num_pending, updates = [], 0, updates + 1
                dist = candidate_action_dist(data, policy)
            else:
                pending.append(units[keep])
                num_pending += hits.size
                pos += units.shape[0]
        if num_pending:
            accepted.append(np.sort(np.concatenate(pending)))
        return np.concatenate(accepted) if accepted else np.zeros(0, dtype=np.int64)

    def weights(
        self,
        data: LoggedRounds,
        make_policy: Callable[[], Policy],
        *,
        random_state: int | None = None,
    ) -> Weights:
        """1 for each step-context a fresh policy accepts as it learns, 0 for the rest."""
        units = self.accepted_units(data, make_policy, random_state=random_state)
        unit = np.zeros(data.num_units)
        unit[units] = 1.0
        return Weights(unit, notes=(f"accepted {units.shape[0]} of the log's step-contexts",))
