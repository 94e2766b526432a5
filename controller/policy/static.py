"""A fixed arm for every context: what operators run today, and the safe default."""

from __future__ import annotations

from collections.abc import Sequence

from specctl.arms import OFF, Arm
from specctl.policy.base import Decision, Policy
from specctl.steps import StepBatch


class StaticPolicy(Policy):
    """Always ``arm`` (or ``off`` where the engines do not offer it)."""

    policy_name = "static"

    def __init__(self, arm: Arm) -> None:
        self.arm = arm
        self._offered: frozenset[Arm] = frozenset({OFF, arm})

    def set_arms(self, arms: Sequence[Arm]) -> None:
        self._offered = frozenset(arms)

    def update_params(self, batch: StepBatch) -> None:
        return None

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        if self.arm in self._offered:
            return Decision.point(self.arm, f"static {self.arm}")
        return Decision.point(OFF, f"static {self.arm} not offered: off")
