"""BanditSpec-style UCB: each (drafter, K) configuration is an independent arm.

BanditSpec (ICML 2025) picks the speculative configuration per round with
UCB over unrelated arms. Here, per (workload class, load bucket): untried
offered arms run first (in offer order), then the arm maximising
``mean / best_mean + exploration * sqrt(2 ln N / n)``, rewards being goodput
per request scaled by the best arm's mean so the bonus is in reward units.
The choice is deterministic (propensity 1), and a K=5 round says nothing about
K=4: that is what specctl's censored acceptance model improves on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from specctl.policy.base import Decision
from specctl.policy.params import DEFAULT_LOAD_BUCKET_BOUNDS, bucket_bounds, parse_config, real
from specctl.policy.rewards import IndependentArmsPolicy


@dataclass(frozen=True)
class UcbConfig:
    exploration: float = 1.0
    discount: float = 1.0
    load_bucket_bounds: Sequence[int] = field(default=DEFAULT_LOAD_BUCKET_BOUNDS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "exploration", real("exploration", self.exploration, 0.0, 100.0))
        object.__setattr__(
            self, "discount", real("discount", self.discount, 0.5, 1.0, lo_open=True)
        )
        object.__setattr__(self, "load_bucket_bounds", bucket_bounds(self.load_bucket_bounds))


class BanditSpecUcbPolicy(IndependentArmsPolicy):
    policy_name = "banditspec-ucb"

    def __init__(self, config: UcbConfig | None = None) -> None:
        self.config = config or UcbConfig()
        super().__init__(self.config.load_bucket_bounds, self.config.discount)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        return cls(parse_config(UcbConfig, params, cls.policy_name))

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        pulls, means = self.rewards.pulls_and_means((workload_class, load_bucket), self._arms)
        untried = np.flatnonzero(pulls == 0)
        if untried.size:
            arm = self._arms[int(untried[0])]
            return Decision.point(arm, f"ucb: trying {arm} ({untried.size} arms untried)")
        scale = float(means.max()) or 1.0
        bonus = self.config.exploration * np.sqrt(
            2.0 * math.log(max(float(pulls.sum()), 1.0)) / pulls
        )
        index = means / scale + bonus
        best = int(np.argmax(index))
        arm = self._arms[best]
        return Decision.point(arm, f"ucb: {arm} index {index[best]:.3f}, {pulls[best]:.0f} pulls")
