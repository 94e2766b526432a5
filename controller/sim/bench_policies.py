"""The policies the simulator benchmark runs, by name: registered ones, variants, references.

Besides the registered policies run as shipped, a tunable peer runs as
``<name>@tuned`` (tuned in hindsight), and three references run with every
policy list (``oracle``, ``static-off``, ``best-static``); ``static:<arm>``
runs one fixed arm. Each name belongs to one variant, which the results
report with it.
"""

from __future__ import annotations

from specctl.arms import parse_arm
from specctl.policy.registry import POLICIES

REFERENCES = ("oracle", "static-off", "best-static")
TUNED_SUFFIX = "@tuned"
# peers with a configuration to tune in hindsight (drafter, K, table, cap)
TUNABLE = ("sglang-ema", "trtllm-threshold", "vllm-batch-table")
LEARNING = ("specctl",)
VARIANTS = ("as-shipped", "tuned-in-hindsight", "reference", "learning")


def default_policies() -> list[str]:
    """specctl first, then every other registered policy as shipped, each tunable peer
    followed by its ``@tuned`` variant, then the references."""
    names: list[str] = []
    learning = (n for n, cls in POLICIES.items() if not cls.stationary)
    for n in sorted(learning, key=lambda n: (n != "specctl", n)):
        names.append(n)
        if n in TUNABLE:
            names.append(n + TUNED_SUFFIX)
    return [*names, *REFERENCES]


def base_policy(name: str) -> str:
    """The registered policy behind a bench name (``sglang-ema@tuned`` -> ``sglang-ema``)."""
    return name.removesuffix(TUNED_SUFFIX)


def policy_variant(name: str) -> str:
    """``reference``, ``learning``, ``tuned-in-hindsight`` or ``as-shipped``."""
    if name in REFERENCES or name.startswith("static:"):
        return "reference"
    if name.endswith(TUNED_SUFFIX):
        return "tuned-in-hindsight"
    if name in LEARNING:
        return "learning"
    return "as-shipped"


def check_policy_name(name: str) -> None:
    """Raise ValueError unless the bench can run ``name``."""
    if name in REFERENCES:
        return
    if name.startswith("static:"):
        parse_arm(name.removeprefix("static:"))  # ArmError is a ValueError
        return
    base = base_policy(name)
    if base not in POLICIES or POLICIES[base].stationary:
        known = [*default_policies(), "static:<arm>"]
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(known)}")
    if name.endswith(TUNED_SUFFIX) and base not in TUNABLE:
        raise ValueError(
            f"{base} has no {TUNED_SUFFIX} variant (nothing to tune in hindsight); "
            f"tunable: {', '.join(TUNABLE)}"
        )
