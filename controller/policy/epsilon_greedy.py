"""Epsilon-greedy over independent arms: the textbook baseline.

Per (workload class, load bucket), the arm with the best mean goodput so far
runs with probability ``1 - epsilon`` (ties share it); every offered arm gets
``epsilon / arms``. It spends a fixed share on arms it already knows are bad,
and learns nothing about K=3 from a K=4 round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from specctl.policy.base import Decision
from specctl.policy.params import DEFAULT_LOAD_BUCKET_BOUNDS, bucket_bounds, parse_config, real
from specctl.policy.rewards import IndependentArmsPolicy


@dataclass(frozen=True)
class EpsilonGreedyConfig:
    epsilon: float = 0.1
    # 1.0 keeps plain sample means; below 1 forgets per step of the context
    discount: float = 1.0
    load_bucket_bounds: Sequence[int] = field(default=DEFAULT_LOAD_BUCKET_BOUNDS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", real("epsilon", self.epsilon, 0.0, 1.0))
        object.__setattr__(
            self, "discount", real("discount", self.discount, 0.5, 1.0, lo_open=True)
        )
        object.__setattr__(self, "load_bucket_bounds", bucket_bounds(self.load_bucket_bounds))


class EpsilonGreedyPolicy(IndependentArmsPolicy):
    policy_name = "epsilon-greedy"

    def __init__(self, config: EpsilonGreedyConfig | None = None) -> None:
        self.config = config or EpsilonGreedyConfig()
        super().__init__(self.config.load_bucket_bounds, self.config.discount)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        return cls(parse_config(EpsilonGreedyConfig, params, cls.policy_name))

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        pulls, means = self.rewards.pulls_and_means((workload_class, load_bucket), self._arms)
        greedy = means == means.max()
        eps = self.config.epsilon
        probs = np.full(len(self._arms), eps / len(self._arms))
        probs[greedy] += (1.0 - eps) / np.count_nonzero(greedy)
        best = int(np.argmax(means))
        if pulls.sum() == 0:
            return Decision(self._arms, probs, "epsilon-greedy: no data, uniform")
        return Decision(
            self._arms,
            probs,
            f"epsilon-greedy: {self._arms[best]} mean {means[best]:.1f} tok/s per request, "
            f"epsilon {eps:g}",
        )
