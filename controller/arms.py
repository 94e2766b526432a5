"""Arms: what the engine does for a request in one step.

An arm is either ``off`` (no speculation) or a drafter with a proposal length,
written ``<drafter>/k=<K>`` (``ngram/k=4``, ``eagle3/k=2``) so that logs,
metrics and overrides read the same to a person as to the code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

OFF_NAME = "off"
MAX_K = 64
_DRAFTER_RE = re.compile(r"^[a-z0-9][a-z0-9_.\-]{0,31}$")
_ARM_RE = re.compile(r"^(?P<drafter>[^/]+)/k=(?P<k>[0-9]{1,3})$")


class ArmError(ValueError):
    """An arm name or drafter that is not valid."""


@dataclass(frozen=True, order=True, slots=True)
class Arm:
    """``drafter`` is empty and ``k`` is 0 for ``off``."""

    drafter: str
    k: int

    def __post_init__(self) -> None:
        if self.k == 0 and self.drafter == "":
            return
        if not _DRAFTER_RE.match(self.drafter):
            raise ArmError(
                f"drafter {self.drafter!r} must be 1-32 of [a-z0-9_.-], starting alphanumeric"
            )
        if not 1 <= self.k <= MAX_K:
            raise ArmError(f"k={self.k} for drafter {self.drafter!r} must be in 1..{MAX_K}")

    @property
    def is_off(self) -> bool:
        return self.k == 0

    @property
    def name(self) -> str:
        return OFF_NAME if self.is_off else f"{self.drafter}/k={self.k}"

    def __str__(self) -> str:
        return self.name


OFF = Arm("", 0)


def parse_arm(name: str) -> Arm:
    """Parse ``off`` or ``<drafter>/k=<K>``; raise ArmError naming what is wrong."""
    if name == OFF_NAME:
        return OFF
    match = _ARM_RE.match(name)
    if match is None:
        raise ArmError(f"arm {name!r} is neither 'off' nor '<drafter>/k=<K>'")
    return Arm(match.group("drafter"), int(match.group("k")))


def arms_for(drafters: Iterable[tuple[str, int]]) -> list[Arm]:
    """Every arm an engine with these (drafter, max K) pairs can run, ``off`` first."""
    arms = [OFF]
    for drafter, max_k in drafters:
        arms.extend(Arm(drafter, k) for k in range(1, max_k + 1))
    return arms


def max_k_by_drafter(arms: Sequence[Arm]) -> dict[str, int]:
    out: dict[str, int] = {}
    for arm in arms:
        if not arm.is_off:
            out[arm.drafter] = max(out.get(arm.drafter, 0), arm.k)
    return out
