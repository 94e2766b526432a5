"""Policy parameters: small dataclasses validated in ``__post_init__``.

Configuration reaches a policy as a plain mapping (from TOML, a flag or a
benchmark script); :func:`parse_config` turns it into the policy's config
dataclass and reports an unknown name or a bad value with the policy's name
in front, so an operator knows which knob to fix.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_LOAD_BUCKET_BOUNDS: tuple[int, ...] = (8, 32, 128)


def parse_config(cls: type[T], params: Mapping[str, Any], policy: str) -> T:
    """Build ``cls(**params)``; raise ValueError naming the policy and the parameter."""
    names = sorted(f.name for f in fields(cls))  # type: ignore[arg-type]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(f"{policy} policy: unknown parameters {unknown}; it takes {names}")
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{policy} policy: {exc}") from None


def real(
    name: str,
    value: object,
    lo: float,
    hi: float,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """``value`` as a float in the interval; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}={value!r} must be a number")
    v = float(value)
    low_bad = v <= lo if lo_open else v < lo
    high_bad = v >= hi if hi_open else v > hi
    if not math.isfinite(v) or low_bad or high_bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise ValueError(f"{name}={value!r} must be in {left}{lo:g}, {hi:g}{right}")
    return v


def integer(name: str, value: object, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi]; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be an integer")
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value!r} must be in [{lo}, {hi}]")
    return int(value)


def bucket_bounds(value: object) -> tuple[int, ...]:
    """Strictly increasing positive batch-size bounds, as the sidecar's policy carries them."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) == 0:
        raise ValueError(f"load_bucket_bounds={value!r} must be a non-empty list of integers")
    bounds = tuple(integer("load_bucket_bounds[]", v, 1, 1 << 20) for v in value)
    if any(b >= c for b, c in itertools.pairwise(bounds)):
        raise ValueError(f"load_bucket_bounds={list(bounds)} must be strictly increasing")
    return bounds
