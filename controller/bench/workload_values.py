"""Checked values of a parsed workload file: every error names the file and the key.

A workload file is the real-engine benchmark's whole input, and a typo in a
long one must never fall back to a default silently. These readers check one
value each (a table, its keys, a number in range, a string, a list) and raise
:class:`WorkloadError` with the file, the key (``class[1].sampling.temperature``)
and what is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message names the file and the key."""


class Where:
    """Builds error messages that name the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, message: str) -> WorkloadError:
        prefix = f"{self.source}: " if self.source else ""
        sep = "" if message.startswith("=") else ": "  # "key=value: what is wrong"
        return WorkloadError(f"{prefix}{key}{sep}{message}")


def as_table(w: Where, value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise w.error(key, f"must be a table, not {type(value).__name__} {value!r}")
    return value


def check_keys(w: Where, table: Mapping[str, Any], key: str, known: Sequence[str]) -> None:
    for k in table:
        if k not in known:
            where = f"{key}.{k}" if key else k
            raise w.error(where, f"unknown key; known: {', '.join(sorted(known))}")


def as_number(
    w: Where,
    value: Any,
    key: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    integer: bool = False,
    lo_open: bool = False,
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise w.error(key, f"must be a number, not {value!r}")
    if integer and not isinstance(value, int):
        raise w.error(key, f"must be an integer, not {value!r}")
    if not math.isfinite(value):
        raise w.error(key, f"must be finite, not {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise w.error(key, f"={value}: must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and value > hi:
        raise w.error(key, f"={value}: must be <= {hi}")
    return value


def as_int(w: Where, value: Any, key: str, lo: int | None = None, hi: int | None = None) -> int:
    return int(as_number(w, value, key, lo=lo, hi=hi, integer=True))


def as_str(w: Where, value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise w.error(key, f"must be a non-empty string, not {value!r}")
    return value


def as_bool(w: Where, value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise w.error(key, f"must be true or false, not {value!r}")
    return value


def as_range(w: Where, value: Any, key: str, lo: int) -> tuple[int, int]:
    """An int (fixed) or [min, max]."""
    if isinstance(value, list):
        if len(value) != 2:
            raise w.error(key, f"must be an integer or [min, max], not {value!r}")
        a = as_int(w, value[0], f"{key}[0]", lo)
        b = as_int(w, value[1], f"{key}[1]", lo)
        if b < a:
            raise w.error(key, f"={value}: max must be >= min")
        return a, b
    n = as_int(w, value, key, lo)
    return n, n


def as_str_list(w: Where, value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise w.error(key, f"must be a non-empty list of strings, not {value!r}")
    return tuple(as_str(w, v, f"{key}[{i}]") for i, v in enumerate(value))


def resolve_path(base: Path | None, value: str) -> Path:
    p = Path(value).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    return p
