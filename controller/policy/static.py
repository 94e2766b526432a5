"""A fixed arm for every context: what operators run today, and the safe default."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from specctl.arms import OFF, Arm, ArmError, parse_arm
from specctl.policy.base import Decision, Policy
from specctl.policy.params import parse_config
from specctl.policy.state import PolicyState, StateReader, StateValue, state_header
from specctl.steps import StepBatch


@dataclass(frozen=True)
class StaticConfig:
    arm: str = ""

    def __post_init__(self) -> None:
        if self.arm == "":
            raise ValueError("parameter 'arm' is required, e.g. arm='ngram/k=4'")
        if not isinstance(self.arm, str):
            raise ValueError(f"arm={self.arm!r} must be an arm name, e.g. 'ngram/k=4'")
        try:
            parse_arm(self.arm)
        except ArmError as exc:
            raise ValueError(f"arm: {exc}") from None


class StaticPolicy(Policy):
    """Always ``arm`` (or ``off`` where the engines do not offer it)."""

    policy_name = "static"
    stationary = True
    uses_load_buckets = False

    def __init__(self, arm: Arm) -> None:
        self.arm = arm
        self._offered: frozenset[Arm] = frozenset({OFF, arm})

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        return cls(parse_arm(parse_config(StaticConfig, params, cls.policy_name).arm))

    def set_arms(self, arms: Sequence[Arm]) -> None:
        self._offered = frozenset(arms)

    def update_params(self, batch: StepBatch) -> None:
        return None

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        if self.arm in self._offered:
            return Decision.point(self.arm, f"static {self.arm}")
        return Decision.point(OFF, f"static {self.arm} not offered: off")

    def state_dict(self) -> PolicyState:
        """Nothing is learned: the header alone."""
        return state_header(self.policy_name, self.state_version)

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        StateReader(state, self.policy_name, self.state_version)
