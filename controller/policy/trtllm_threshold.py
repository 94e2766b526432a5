"""TensorRT-LLM's switch-off: a fixed arm until rolling acceptance falls below a threshold.

TensorRT-LLM keeps the average acceptance length over the last
``acceptance_window`` completed requests and disables speculation
permanently once it drops below ``acceptance_length_threshold``; with
``max_concurrency`` set, speculation is also off at batch sizes above it.
Here the window holds a class's last ``acceptance_window`` speculative
request-rounds (accepted drafts each; reports carry rounds, not completed
requests), the gate is per class (TensorRT-LLM has one per server), and the
batch size of a load bucket is the mean of the batch sizes its steps had.
Only an operator's ``reset_class`` turns a tripped gate back on. Without an
arm, the first drafter the engines offer runs at its longest K (the engine's
configured draft length).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from specctl.arms import OFF, Arm, ArmError, max_k_by_drafter, parse_arm
from specctl.policy.base import Decision, Policy
from specctl.policy.load import BucketLoad
from specctl.policy.params import (
    DEFAULT_LOAD_BUCKET_BOUNDS,
    bucket_bounds,
    integer,
    parse_config,
    real,
)
from specctl.policy.state import (
    PolicyState,
    StateReader,
    StateValue,
    assign_arrays,
    copy_arrays,
    state_header,
)
from specctl.steps import StepBatch


@dataclass(frozen=True)
class ThresholdConfig:
    # empty: the first offered drafter at its longest K
    arm: str = ""
    acceptance_window: int = 128
    acceptance_length_threshold: float = 0.5
    max_concurrency: int | None = None
    load_bucket_bounds: Sequence[int] = field(default=DEFAULT_LOAD_BUCKET_BOUNDS)

    def __post_init__(self) -> None:
        if not isinstance(self.arm, str):
            raise ValueError(f"arm={self.arm!r} must be an arm name, e.g. 'eagle3/k=3'")
        if self.arm:
            try:
                arm = parse_arm(self.arm)
            except ArmError as exc:
                raise ValueError(f"arm: {exc}") from None
            if arm.is_off:
                raise ValueError("arm='off' leaves nothing to switch off; name a speculative arm")
        values: dict[str, Any] = {
            "acceptance_window": integer("acceptance_window", self.acceptance_window, 1, 1 << 20),
            "acceptance_length_threshold": real(
                "acceptance_length_threshold", self.acceptance_length_threshold, 0.0, 64.0
            ),
            "load_bucket_bounds": bucket_bounds(self.load_bucket_bounds),
        }
        if self.max_concurrency is not None:
            values["max_concurrency"] = integer("max_concurrency", self.max_concurrency, 1, 1 << 20)
        for name, value in values.items():
            object.__setattr__(self, name, value)


class TrtllmThresholdPolicy(Policy):
    policy_name = "trtllm-threshold"

    def __init__(self, config: ThresholdConfig | None = None) -> None:
        self.config = config = config or ThresholdConfig()
        self.arm = parse_arm(config.arm) if config.arm else OFF
        self.load = BucketLoad(config.load_bucket_bounds, discount=0.99)
        self._offered = False
        self._windows: dict[str, deque[int]] = {}
        self._disabled: dict[str, float] = {}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        return cls(parse_config(ThresholdConfig, params, cls.policy_name))

    def set_arms(self, arms: Sequence[Arm]) -> None:
        if not self.config.arm:
            max_k = max_k_by_drafter(arms)
            drafter = next(iter(max_k), None)
            self.arm = Arm(drafter, max_k[drafter]) if drafter is not None else OFF
        self._offered = not self.arm.is_off and self.arm in arms

    def update_params(self, batch: StepBatch) -> None:
        self.load.update(batch, np.zeros(batch.num_steps))
        if batch.num_rows == 0:
            return
        spec = batch.arm_k > 0
        window = self.config.acceptance_window
        for c, name in enumerate(batch.classes):
            if name in self._disabled:
                continue
            accepted = batch.accepted[spec & (batch.class_index == c)]
            if accepted.size == 0:
                continue
            rounds = self._windows.setdefault(name, deque(maxlen=window))
            rounds.extend(accepted.tolist())
            if len(rounds) == window:
                mean = sum(rounds) / window
                if mean < self.config.acceptance_length_threshold:
                    self._disabled[name] = mean
                    del self._windows[name]

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        tripped = self._disabled.get(workload_class)
        if tripped is not None:
            return Decision.point(
                OFF,
                f"trtllm: speculation disabled permanently (acceptance {tripped:.2f} < "
                f"{self.config.acceptance_length_threshold:g})",
            )
        limit = self.config.max_concurrency
        batch_size = self.load.batch_size(load_bucket)
        if limit is not None and batch_size > limit:
            return Decision.point(OFF, f"trtllm: batch size {batch_size:.0f} > {limit}")
        if not self._offered:
            return Decision.point(OFF, f"trtllm: {self.arm} not offered")
        return Decision.point(self.arm, f"trtllm: {self.arm}")

    def reset_class(self, workload_class: str) -> None:
        self._disabled.pop(workload_class, None)
        self._windows.pop(workload_class, None)

    def state_dict(self) -> PolicyState:
        """The buckets' batch sizes, each class's window of accepted drafts (one list
        of all windows, cut by their lengths) and the classes switched off."""
        windows = list(self._windows.items())
        return {
            **state_header(self.policy_name, self.state_version),
            **copy_arrays(self.load.state_arrays()),
            "window_classes": np.array([c for c, _ in windows], dtype=np.str_),
            "window_lengths": np.array([len(w) for _, w in windows], dtype=np.int64),
            "window_accepted": np.array([a for _, w in windows for a in w], dtype=np.int64),
            "disabled_classes": np.array(list(self._disabled), dtype=np.str_),
            "disabled_acceptance": np.array(list(self._disabled.values()), dtype=np.float64),
        }

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        reader = StateReader(state, self.policy_name, self.state_version)
        targets = self.load.state_arrays()
        load = reader.arrays_like(targets, {})
        classes = reader.strings("window_classes")
        lengths = reader.array("window_lengths", (len(classes),), "i").tolist()
        accepted = reader.array("window_accepted", (None,), "i").tolist()
        window = self.config.acceptance_window
        if any(not 0 < n <= window for n in lengths) or sum(lengths) != len(accepted):
            raise ValueError(
                f"{self.policy_name} state: 'window_lengths' {lengths} must be in 1..{window} "
                f"(acceptance_window) and add up to the {len(accepted)} 'window_accepted'"
            )
        disabled = reader.strings("disabled_classes")
        if len(set(classes)) != len(classes) or len(set(disabled)) != len(disabled):
            raise ValueError(f"{self.policy_name} state: a class is listed twice")
        if any(a < 0 for a in accepted):
            raise ValueError(f"{self.policy_name} state: 'window_accepted' has negative counts")
        means = reader.array("disabled_acceptance", (len(disabled),)).tolist()
        ends = np.cumsum([0, *lengths]).tolist()
        assign_arrays(targets, load)
        self._windows = {
            c: deque(accepted[a:b], maxlen=window)
            for c, a, b in zip(classes, ends[:-1], ends[1:], strict=True)
        }
        self._disabled = dict(zip(disabled, means, strict=True))
