"""The policy interface, in the manner of Open Bandit Pipeline.

A policy learns from logged feedback (``update_params`` with a validated
:class:`~specctl.steps.StepBatch`) and answers, per context (workload
class, load bucket), with a probability distribution over arms
(``select_action``). Engines sample from that distribution themselves, so the
propensity of every logged choice is exact.

The contract, for every policy:

- ``from_params(params)`` builds it from configuration's plain mapping (the
  registry's only way to build one), refusing a bad parameter by name;
- ``update_params`` is the only method that learns; ``select_action`` and
  ``evidence`` are reads: calling them any number of times changes nothing;
- ``state_dict()`` holds everything it learned, as plain values headed by its
  name and ``state_version`` (:mod:`specctl.policy.state`), and
  ``load_state_dict()`` restores it whole or raises ValueError naming what
  does not fit, so a restored policy decides as the saved one did;
- ``stationary`` says, on the class, whether its distributions stay the same
  whatever it is shown (a fixed rule), which off-policy estimators that
  assume one fixed policy need; ``uses_load_buckets`` whether its decisions
  depend on the load bucket, so the caller's bucketing is handed to it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt

from specctl.arms import Arm
from specctl.policy.state import PolicyState, StateValue
from specctl.steps import StepBatch


@dataclass(frozen=True)
class Decision:
    """A distribution over ``arms`` for one context, and why."""

    arms: tuple[Arm, ...]
    probabilities: npt.NDArray[np.float64]
    explanation: str = ""

    def __post_init__(self) -> None:
        p = self.probabilities
        if p.shape != (len(self.arms),):
            raise ValueError(f"{len(self.arms)} arms but probabilities of shape {p.shape}")
        if len(self.arms) == 0:
            raise ValueError("a decision needs at least one arm")
        if not np.all(np.isfinite(p)) or np.any(p < 0.0) or abs(float(p.sum()) - 1.0) > 1e-6:
            raise ValueError(f"probabilities {p.tolist()} must be non-negative and sum to 1")

    def probability_of(self, arm: Arm) -> float:
        try:
            return float(self.probabilities[self.arms.index(arm)])
        except ValueError:
            return 0.0

    @property
    def mode(self) -> Arm:
        return self.arms[int(np.argmax(self.probabilities))]

    @staticmethod
    def point(arm: Arm, explanation: str = "") -> Decision:
        return Decision((arm,), np.ones(1), explanation)


@dataclass(frozen=True)
class ArmEstimate:
    """What a policy believes about one arm in one context."""

    arm: Arm
    expected_tokens: float  # committed tokens per request-round
    expected_step_time_s: float
    goodput: float  # committed tokens per second of engine time
    goodput_low: float
    goodput_high: float
    prob_best: float


@dataclass(frozen=True)
class Evidence:
    """The evidence behind a context's decision, for GetEvidence and metrics."""

    workload_class: str
    load_bucket: int
    arms: tuple[ArmEstimate, ...] = ()
    # drafter -> conditional acceptance at positions 1..max_k, and observations
    acceptance: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict)
    rounds: float = 0.0
    explanation: str = ""


class Policy(abc.ABC):
    """A decision rule over the arms engines offer, per (class, load bucket)."""

    policy_name: ClassVar[str] = "policy"
    # the distributions do not depend on what the policy is shown (a fixed rule)
    stationary: ClassVar[bool] = False
    # decisions depend on the load bucket: the caller's bucket bounds are handed to it
    uses_load_buckets: ClassVar[bool] = True
    # the layout of state_dict(); a change to it comes with a new version
    state_version: ClassVar[int] = 1

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        """Build from configuration's parameters; by default a policy takes none."""
        if params:
            raise ValueError(
                f"{cls.policy_name} policy: unknown parameters {sorted(params)}; it takes none"
            )
        return cls()

    @abc.abstractmethod
    def set_arms(self, arms: Sequence[Arm]) -> None:
        """The arms offered by the connected engines changed (``off`` always included)."""

    @abc.abstractmethod
    def update_params(self, batch: StepBatch) -> None:
        """Learn from one validated report."""

    @abc.abstractmethod
    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        """The distribution to run in this context from the next step."""

    @abc.abstractmethod
    def state_dict(self) -> PolicyState:
        """Everything learned, as plain values (see :mod:`specctl.policy.state`)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        """Restore :meth:`state_dict` output saved under the same configuration; ValueError
        naming what does not fit, and then nothing is loaded."""

    def evidence(self, workload_class: str, load_bucket: int) -> Evidence:
        """What the decision rests on; by default only the decision's explanation."""
        decision = self.select_action(workload_class, load_bucket)
        return Evidence(workload_class, load_bucket, explanation=decision.explanation)

    def reset_class(self, workload_class: str) -> None:  # noqa: B027 - optional hook
        """Forget what was learned for a class."""
