"""The policies the real-engine benchmark runs, by the names a workload or --policies gives.

``static`` runs every static arm, ``static:<arm>`` one of them, ``hindsight`` every
class at once on its best static arm so far (:mod:`specctl.bench.hindsight`); a learning
policy is specctl or a peer the sidecar can run (every registered policy but
the stationary ``static``). ``<policy>@<label>`` is a variant of a learning
policy: the same policy with the parameters of the workload's
``[sidecar.params."<policy>@<label>"]`` over the policy's own, run in the same
repetitions as the policy, so that a parameter change is measured side by side
with what it would replace, on the same engine and in the same minutes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from specctl.bench.hindsight import HINDSIGHT

VARIANT_SEPARATOR = "@"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")


def learning_policies() -> list[str]:
    """specctl first, then every peer the sidecar can run (all but the stationary ``static``)."""
    from specctl.policy.registry import POLICIES

    learning = (n for n, cls in POLICIES.items() if not cls.stationary)
    return sorted(learning, key=lambda n: (n != "specctl", n))


def registered_policy(name: str) -> str:
    """The policy the sidecar runs for a learning policy's benchmark name:
    ``specctl@class-price`` -> ``specctl``."""
    return name.split(VARIANT_SEPARATOR, 1)[0]


def policy_params(params: Mapping[str, Mapping[str, Any]], name: str) -> dict[str, Any]:
    """The parameters a learning policy or a variant (``<policy>@<label>``) runs with: the
    workload's ``[sidecar.params.<policy>]``, and a variant's own table over them."""
    policy = registered_policy(name)
    return {**params.get(policy, {}), **(params.get(name, {}) if name != policy else {})}


def learning_policy_problem(name: str) -> str | None:
    """Why ``name`` is not a learning policy or a variant of one, or None."""
    policy, sep, label = name.partition(VARIANT_SEPARATOR)
    known = learning_policies()
    if policy not in known:
        return (
            f"unknown policy; known: static, static:<arm>, {HINDSIGHT}, {', '.join(known)}, "
            "<policy>@<label>"
        )
    if sep and not _LABEL.fullmatch(label):
        return (
            f"variant label {label!r} must be 1-40 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return None


def policy_name_problem(name: str, arms: Sequence[str]) -> str | None:
    """Why the benchmark cannot run ``name`` (``static:<arm>``, ``static``, ``hindsight``,
    a learning policy or ``<policy>@<label>``), or None."""
    if name in ("static", HINDSIGHT):
        return None
    if name.startswith("static:"):
        arm = name.removeprefix("static:")
        if arm not in arms:
            return f"{arm!r} is not an arm the engine offers ({', '.join(arms)})"
        return None
    return learning_policy_problem(name)
