"""How much each logged step-context counts for one candidate: what the estimators consume.

A stationary candidate, given as ``action_dist`` (its probability of each arm,
columns ``data.arms``, in each logged context, rows ``data.context_*``), has
importance weights pi(logged arm | context) / logged propensity. A candidate
that learns as it goes has no fixed distribution: rejection sampling
(:mod:`specctl.replay.rejection`) replays the log through it and weighs each
step-context it accepted 1 and every other 0. Either way the estimators see
one weight per unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specctl.policy.base import Policy
from specctl.replay.data import LoggedRounds

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class Weights:
    """One weight per unit of a log, and the candidate's distribution where it has one."""

    unit: FloatArray  # (units,)
    # (contexts, arms) of a stationary candidate; None for one that learns as it goes
    action_dist: FloatArray | None = None
    notes: tuple[str, ...] = ()  # on the overall estimate

    def __post_init__(self) -> None:
        if self.unit.ndim != 1:
            raise ValueError(f"unit weights have shape {self.unit.shape}, expected (units,)")
        if self.action_dist is not None and self.action_dist.ndim != 2:
            raise ValueError(
                f"action_dist has shape {self.action_dist.shape}, expected (contexts, arms)"
            )

    def check(self, data: LoggedRounds) -> None:
        """Raise ValueError unless these weights are for ``data``."""
        if self.unit.shape != (data.num_units,):
            raise ValueError(
                f"unit weights have shape {self.unit.shape}, expected ({data.num_units},)"
            )
        if self.action_dist is not None:
            _check_action_dist(data, self.action_dist)


def _check_action_dist(data: LoggedRounds, action_dist: FloatArray) -> None:
    shape = (data.num_contexts, len(data.arms))
    if action_dist.shape != shape:
        raise ValueError(f"action_dist has shape {action_dist.shape}, expected {shape}")


def importance_weights(data: LoggedRounds, action_dist: FloatArray) -> Weights:
    """A stationary candidate's weights: pi_e(logged arm | context) / logged propensity."""
    _check_action_dist(data, action_dist)
    unit = action_dist[data.unit_context, data.unit_arm] / data.unit_propensity
    return Weights(unit, action_dist)


def candidate_action_dist(data: LoggedRounds, policy: Policy) -> FloatArray:
    """The policy's distribution over ``data.arms`` in every logged context."""
    dist = np.zeros((data.num_contexts, len(data.arms)))
    for x in range(data.num_contexts):
        workload_class, bucket = data.context_name(x)
        decision = policy.select_action(workload_class, bucket)
        for arm, p in zip(decision.arms, decision.probabilities, strict=True):
            if p <= 0.0:
                continue
            code = data.arm_code(arm)
            if code is None:
                raise ValueError(
                    f"policy {policy.policy_name!r} plays {arm.name} with P={p:.3g} in "
                    f"({workload_class}, bucket {bucket}), which the log cannot evaluate "
                    f"(arms it can: {', '.join(a.name for a in data.arms)})"
                )
            dist[x, code] += p
    return dist
