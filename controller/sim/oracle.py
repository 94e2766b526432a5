"""The simulation-only oracle: it reads the simulator's ground truth.

Per class it runs the arm with the highest expected goodput at the current
batch size and acceptance. In a stationary scenario that is the best fixed
arm per class in hindsight; after an event it is the best fixed arm for the
new conditions, which is what "the new oracle" means when measuring
adaptation. It learns nothing and cannot be deployed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from specctl.arms import OFF, Arm
from specctl.policy.base import Decision, Policy
from specctl.policy.state import PolicyState, StateReader, StateValue, state_header
from specctl.sim.engine import SimWorld
from specctl.steps import StepBatch


class OraclePolicy(Policy):
    policy_name = "oracle"

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self._class_id = {c: i for i, c in enumerate(world.model.classes)}
        self._offered: frozenset[Arm] = frozenset(world.model.arms)
        self._decisions: dict[Arm, Decision] = {}

    def set_arms(self, arms: Sequence[Arm]) -> None:
        self._offered = frozenset(arms)

    def update_params(self, batch: StepBatch) -> None:
        return None

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        c = self._class_id.get(workload_class)
        w = self.world
        if c is None:  # the default class, before any report: best for the traffic mix
            arm = w.model.arms[int(np.argmax((w.mix @ w.expected_tokens) / (w.mix @ w.cost)))]
        else:
            arm = w.model.arms[w.best_arm(c)]
        if arm not in self._offered:
            arm = OFF
        decision = self._decisions.get(arm)
        if decision is None:
            decision = self._decisions[arm] = Decision.point(arm, f"oracle: best now is {arm}")
        return decision

    def state_dict(self) -> PolicyState:
        """Nothing is learned: the simulator's ground truth is read afresh."""
        return state_header(self.policy_name, self.state_version)

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        StateReader(state, self.policy_name, self.state_version)
