"""specctl's policy parameters, each checked against its range when the configuration is built.

:meth:`SpecctlPolicy.from_params <specctl.policy.thompson.SpecctlPolicy.from_params>`
builds a :class:`SpecctlConfig` from a sidecar's ``[policy] params`` through
:func:`specctl.policy.params.parse_config`: a value out of range, or two
parameters that contradict each other, is refused with the parameter named
before a policy is built. What each parameter does is told where it acts, in
:mod:`specctl.policy.thompson` and the modules it names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specctl.arms import MAX_K, ArmError, parse_arm
from specctl.policy.params import DEFAULT_LOAD_BUCKET_BOUNDS, bucket_bounds, integer, real

# what the per-(class, arm) cost deviations are centred on (see specctl.policy.pair_cost)
PAIR_CENTRINGS = ("class", "class-drafter")


@dataclass(frozen=True)
class SpecctlConfig:
    """Parameters of :class:`~specctl.policy.thompson.SpecctlPolicy` (all optional)."""

    discount: float = 1.0
    recent_discount: float = 0.99
    change_z: float = 5.0
    change_min_shift: float = 0.1
    cost_discount: float = 0.999
    probe_budget: float = 0.02
    probe_floor: float = 0.005
    probe_decay_steps: float = 500.0
    switch_off_confidence: float = 0.95
    switch_on_confidence: float = 0.8
    prior_arm: str | None = None
    cold_start_rounds: float = 50.0
    control_share: float = 0.05
    control_steps: float = 20.0
    control_z: float = 4.0
    prior_acceptance: float = 0.6
    prior_strength: float = 4.0
    max_rounds: float = 50000.0
    fleet_max_rounds: float = 800000.0
    model_rounds: float = 200.0
    prior_step_s: float = 0.02
    prior_token_s: float = 2e-5
    prior_cost_spread: float = 0.3
    num_samples: int = 256
    posterior_scale: float = 1.0
    seed: int = 0
    load_bucket_bounds: Sequence[int] = field(default=DEFAULT_LOAD_BUCKET_BOUNDS)
    max_classes: int = 256
    max_drafters: int = 4
    cost_k_columns: int = 16
    cost_class_columns: int = 16
    cost_pair_columns: int = 64
    cost_pair_discount: float = 0.9999
    cost_pair_z: float = 1.5
    cost_pair_centring: str = "class"

    def __post_init__(self) -> None:
        checked: dict[str, Any] = {
            "discount": real("discount", self.discount, 0.5, 1.0, lo_open=True),
            "recent_discount": real(
                "recent_discount", self.recent_discount, 0.5, 1.0, lo_open=True
            ),
            "change_z": real("change_z", self.change_z, 1.0, 1e6),
            "change_min_shift": real("change_min_shift", self.change_min_shift, 0.0, 1.0),
            "cost_discount": real("cost_discount", self.cost_discount, 0.5, 1.0, lo_open=True),
            "probe_budget": real("probe_budget", self.probe_budget, 0.0, 0.5),
            "probe_floor": real("probe_floor", self.probe_floor, 0.0, 0.5),
            "probe_decay_steps": real(
                "probe_decay_steps", self.probe_decay_steps, 0.0, 1e12, lo_open=True
            ),
            "switch_off_confidence": real(
                "switch_off_confidence", self.switch_off_confidence, 0.5, 1.0, hi_open=True
            ),
            "switch_on_confidence": real(
                "switch_on_confidence", self.switch_on_confidence, 0.0, 1.0, hi_open=True
            ),
            "cold_start_rounds": real("cold_start_rounds", self.cold_start_rounds, 0.0, 1e9),
            "control_share": real("control_share", self.control_share, 0.0, 0.5),
            "control_steps": real("control_steps", self.control_steps, 0.0, 1e6),
            "control_z": real("control_z", self.control_z, 0.0, 1e6),
            "prior_acceptance": real(
                "prior_acceptance", self.prior_acceptance, 0.0, 1.0, lo_open=True, hi_open=True
            ),
            "prior_strength": real("prior_strength", self.prior_strength, 0.0, 1e6, lo_open=True),
            "max_rounds": real("max_rounds", self.max_rounds, 1.0, 1e12),
            "fleet_max_rounds": real("fleet_max_rounds", self.fleet_max_rounds, 1.0, 1e12),
            "model_rounds": real("model_rounds", self.model_rounds, 0.0, 1e12),
            "prior_step_s": real("prior_step_s", self.prior_step_s, 0.0, 3600.0, lo_open=True),
            "prior_token_s": real("prior_token_s", self.prior_token_s, 0.0, 60.0),
            "prior_cost_spread": real(
                "prior_cost_spread", self.prior_cost_spread, 0.0, 1e6, lo_open=True
            ),
            "num_samples": integer("num_samples", self.num_samples, 16, 1 << 16),
            "posterior_scale": real(
                "posterior_scale", self.posterior_scale, 0.0, 4.0, lo_open=True
            ),
            "seed": integer("seed", self.seed, 0, (1 << 63) - 1),
            "load_bucket_bounds": bucket_bounds(self.load_bucket_bounds),
            "max_classes": integer("max_classes", self.max_classes, 1, 1 << 16),
            "max_drafters": integer("max_drafters", self.max_drafters, 1, 64),
            "cost_k_columns": integer("cost_k_columns", self.cost_k_columns, 0, MAX_K),
            "cost_class_columns": integer("cost_class_columns", self.cost_class_columns, 0, 64),
            "cost_pair_columns": integer("cost_pair_columns", self.cost_pair_columns, 0, 256),
            "cost_pair_discount": real(
                "cost_pair_discount", self.cost_pair_discount, 0.5, 1.0, lo_open=True
            ),
            "cost_pair_z": real("cost_pair_z", self.cost_pair_z, 0.0, 1e6),
        }
        if checked["recent_discount"] > checked["discount"]:
            raise ValueError(
                f"recent_discount={self.recent_discount!r} must not exceed "
                f"discount={self.discount!r}: the recent window is the shorter memory"
            )
        if checked["switch_on_confidence"] > checked["switch_off_confidence"]:
            raise ValueError(
                f"switch_on_confidence={self.switch_on_confidence!r} must not exceed "
                f"switch_off_confidence={self.switch_off_confidence!r}"
            )
        if self.cost_pair_centring not in PAIR_CENTRINGS:
            raise ValueError(
                f"cost_pair_centring={self.cost_pair_centring!r} must be one of "
                f"{', '.join(PAIR_CENTRINGS)}"
            )
        if self.prior_arm is not None:
            if not isinstance(self.prior_arm, str):
                raise ValueError(f"prior_arm={self.prior_arm!r} must be an arm name")
            try:
                parse_arm(self.prior_arm)
            except ArmError as exc:
                raise ValueError(f"prior_arm: {exc}") from None
        for name, value in checked.items():
            object.__setattr__(self, name, value)
