"""Candidate policies for replay, from the command line's ``--policy SPEC``.

A SPEC is a static arm (``off``, ``ngram/k=4``), a built-in policy name
(``NAME``), or a policy with parameters (``NAME:key=value,key=value``; values
are read as JSON where they parse, else as strings, e.g.
``static:arm=ngram/k=2``). Static policies are stationary and are evaluated by
every estimator; any other policy is taken to learn as it goes and is evaluated
by rejection-sampling replay.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specctl.arms import OFF_NAME, Arm, ArmError, parse_arm
from specctl.policy.base import Policy
from specctl.policy.registry import make_policy


@dataclass(frozen=True)
class Candidate:
    """A policy to evaluate: ``make`` builds a fresh instance (replay consumes one)."""

    label: str
    make: Callable[[], Policy]
    stationary: bool
    arm: Arm | None = None  # for a static arm: what it plays everywhere


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_policy_spec(spec: str) -> Candidate:
    """Parse a ``--policy`` SPEC; raise ValueError naming what is wrong."""
    spec = spec.strip()
    if spec == OFF_NAME or "/" in spec.split(":", 1)[0]:
        try:
            arm = parse_arm(spec)
        except ArmError as exc:
            raise ValueError(f"--policy {spec!r}: {exc}") from None
        name, params = "static", {"arm": arm.name}
    else:
        name, _, rest = spec.partition(":")
        params = {}
        for item in filter(None, rest.split(",")):
            key, eq, text = item.partition("=")
            if not eq or not key:
                raise ValueError(f"--policy {spec!r}: parameter {item!r} is not key=value")
            params[key.strip()] = _value(text.strip())
    make_policy(name, params)  # fail now, naming the bad parameter, not mid-replay

    def make() -> Policy:
        return make_policy(name, params)

    static_arm = parse_arm(str(params["arm"])) if name == "static" else None
    return Candidate(label=spec, make=make, stationary=name == "static", arm=static_arm)
