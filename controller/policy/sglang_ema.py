"""SGLang's adaptive speculative decoding: an EMA of acceptance length with hysteresis.

As in SGLang's ``AdaptiveSpeculativeParams``: per batch, the mean accepted
drafts per request updates ``ema = (1 - alpha) * ema + alpha * mean``; after
``warmup_batches`` batches, every ``update_interval`` batches the number of
steps moves down across candidates while ``ema <= lower - 0.5 +
down_hysteresis`` and up while ``ema > current - 0.5 + up_hysteresis``, so K
tracks "one more than what is being accepted". It starts at the candidate
nearest ``initial_steps`` with ``ema = steps - 1``. It never turns
speculation off and never looks at step time.

Here one batch is the rows of a (workload class, load bucket) in one step
(SGLang keeps one state per server, or per batch-size slot in newer
versions), and the chosen K is capped by the drafter's offered max K.
Without a drafter, the first drafter the engines offer is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from specctl.arms import MAX_K, OFF, Arm, max_k_by_drafter
from specctl.policy.base import Decision, Policy
from specctl.policy.params import (
    DEFAULT_LOAD_BUCKET_BOUNDS,
    bucket_bounds,
    integer,
    parse_config,
    real,
)
from specctl.policy.state import PolicyState, StateReader, StateValue, state_header
from specctl.steps import StepBatch


@dataclass(frozen=True)
class SglangEmaConfig:
    # empty: the first drafter the engines offer
    drafter: str = ""
    candidate_steps: Sequence[int] = (1, 3, 7)
    initial_steps: int = 3
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    load_bucket_bounds: Sequence[int] = field(default=DEFAULT_LOAD_BUCKET_BOUNDS)

    def __post_init__(self) -> None:
        if not isinstance(self.drafter, str):
            raise ValueError(f"drafter={self.drafter!r} must be a drafter name, e.g. 'eagle3'")
        if not isinstance(self.candidate_steps, Sequence) or isinstance(self.candidate_steps, str):
            raise ValueError(f"candidate_steps={self.candidate_steps!r} must be a list of K")
        steps = sorted({integer("candidate_steps[]", k, 1, MAX_K) for k in self.candidate_steps})
        if len(steps) < 2:
            raise ValueError(
                f"candidate_steps={list(self.candidate_steps)} needs 2 distinct values"
            )
        values: dict[str, Any] = {
            "candidate_steps": tuple(steps),
            "initial_steps": integer("initial_steps", self.initial_steps, 1, MAX_K),
            "ema_alpha": real("ema_alpha", self.ema_alpha, 0.0, 1.0, lo_open=True),
            "update_interval": integer("update_interval", self.update_interval, 1, 1 << 20),
            "warmup_batches": integer("warmup_batches", self.warmup_batches, 0, 1 << 20),
            "down_hysteresis": real("down_hysteresis", self.down_hysteresis, -MAX_K, MAX_K),
            "up_hysteresis": real("up_hysteresis", self.up_hysteresis, -MAX_K, MAX_K),
            "load_bucket_bounds": bucket_bounds(self.load_bucket_bounds),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)


@dataclass
class _EmaState:
    steps: int
    ema: float
    batches: int = 0


class SglangEmaPolicy(Policy):
    policy_name = "sglang-ema"

    def __init__(self, config: SglangEmaConfig | None = None) -> None:
        self.config = config or SglangEmaConfig()
        self.num_buckets = len(self.config.load_bucket_bounds) + 1
        self.drafter = self.config.drafter
        self._max_k = 0
        self._states: dict[tuple[str, int], _EmaState] = {}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        return cls(parse_config(SglangEmaConfig, params, cls.policy_name))

    def set_arms(self, arms: Sequence[Arm]) -> None:
        max_k = max_k_by_drafter(arms)
        if not self.config.drafter:
            self.drafter = next(iter(max_k), "")
        self._max_k = max_k.get(self.drafter, 0)

    def _initial_state(self) -> _EmaState:
        initial = self.config.initial_steps
        steps = min(self.config.candidate_steps, key=lambda k: (abs(k - initial), -k))
        return _EmaState(steps=steps, ema=float(steps - 1))

    def _state(self, context: tuple[str, int]) -> _EmaState:
        state = self._states.get(context)
        if state is None:
            state = self._states[context] = self._initial_state()
        return state

    def update_params(self, batch: StepBatch) -> None:
        if batch.num_rows == 0:
            return
        drafter = np.array([a.drafter == self.drafter for a in batch.arms])
        rows = drafter[batch.arm_index]
        if not rows.any():
            return
        nc = len(batch.classes)
        key = batch.request_step[rows] * nc + batch.class_index[rows]
        groups, group = np.unique(key, return_inverse=True)
        means = np.bincount(group, weights=batch.accepted[rows]) / np.bincount(group)
        steps, classes = np.divmod(groups, nc)
        buckets = np.minimum(batch.load_bucket[steps], self.num_buckets - 1)
        for c, b, mean in zip(classes.tolist(), buckets.tolist(), means.tolist(), strict=True):
            self._update(self._state((batch.classes[c], b)), mean)

    def _update(self, state: _EmaState, batch_mean: float) -> None:
        cfg = self.config
        state.ema = (1.0 - cfg.ema_alpha) * state.ema + cfg.ema_alpha * batch_mean
        state.batches += 1
        if state.batches <= cfg.warmup_batches:
            return
        if (state.batches - cfg.warmup_batches) % cfg.update_interval != 0:
            return
        candidates = cfg.candidate_steps
        i = candidates.index(state.steps)
        while i > 0 and state.ema <= candidates[i - 1] - 0.5 + cfg.down_hysteresis:
            i -= 1
        while i < len(candidates) - 1 and state.ema > candidates[i] - 0.5 + cfg.up_hysteresis:
            i += 1
        state.steps = candidates[i]

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        state = self._states.get((workload_class, load_bucket)) or self._initial_state()
        k = min(state.steps, self._max_k)
        if k == 0:
            return Decision.point(OFF, f"sglang ema: drafter {self.drafter!r} not offered")
        return Decision.point(
            Arm(self.drafter, k), f"sglang ema: accept length {state.ema:.2f} -> K={k}"
        )

    def reset_class(self, workload_class: str) -> None:
        for b in range(self.num_buckets):
            self._states.pop((workload_class, b), None)

    def state_dict(self) -> PolicyState:
        """Per context: its number of steps, EMA and batches seen."""
        contexts = sorted(self._states)
        states = [self._states[c] for c in contexts]
        return {
            **state_header(self.policy_name, self.state_version),
            "classes": np.array([c for c, _ in contexts], dtype=np.str_),
            "buckets": np.array([b for _, b in contexts], dtype=np.int64),
            "steps": np.array([s.steps for s in states], dtype=np.int64),
            "ema": np.array([s.ema for s in states], dtype=np.float64),
            "batches": np.array([s.batches for s in states], dtype=np.int64),
        }

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        reader = StateReader(state, self.policy_name, self.state_version)
        contexts = reader.contexts("classes", "buckets", self.num_buckets)
        n = len(contexts)
        steps = reader.array("steps", (n,), "i").tolist()
        ema = reader.array("ema", (n,)).tolist()
        batches = reader.array("batches", (n,), "i").tolist()
        unknown = sorted(set(steps) - set(self.config.candidate_steps))
        if unknown:
            raise ValueError(
                f"{self.policy_name} state: 'steps' has {unknown}, not among candidate_steps="
                f"{list(self.config.candidate_steps)}"
            )
        if any(b < 0 for b in batches):
            raise ValueError(f"{self.policy_name} state: 'batches' has negative counts")
        self._states = {
            context: _EmaState(steps=k, ema=e, batches=m)
            for context, k, e, m in zip(contexts, steps, ema, batches, strict=True)
        }
