"""The policies the real-engine benchmark runs, by the names a workload or --policies gives.

``static`` runs every static arm, ``static:<arm>`` one of them; a learning
policy is specctl or a peer the sidecar can run (every registered policy but
the stationary ``static``).
"""

from __future__ import annotations

from collections.abc import Sequence


def learning_policies() -> list[str]:
    """specctl first, then every peer the sidecar can run (all but the stationary ``static``)."""
    from specctl.policy.registry import POLICIES

    learning = (n for n, cls in POLICIES.items() if not cls.stationary)
    return sorted(learning, key=lambda n: (n != "specctl", n))


def policy_name_problem(name: str, arms: Sequence[str]) -> str | None:
    """Why the benchmark cannot run ``name`` (``static:<arm>``, ``static``, or a learning
    policy), or None."""
    if name == "static":
        return None
    if name.startswith("static:"):
        arm = name.removeprefix("static:")
        if arm not in arms:
            return f"{arm!r} is not an arm the engine offers ({', '.join(arms)})"
        return None
    known = learning_policies()
    if name not in known:
        return f"unknown policy; known: static, static:<arm>, {', '.join(known)}"
    return None
