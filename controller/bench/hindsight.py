"""The oracle's choice of arms, run: every class pinned at once to its best static arm.

The oracle of :mod:`specctl.bench.analysis` adds up, per phase, each class's goodput
under its best static arm, each measured in a segment where the *whole* batch ran that
arm. Run together, the classes share every step: where the drafter runs for the
whole batch (vLLM's ``draft_model`` proposes for every request and the scheduler only
cuts what each class verifies), a class pinned ``off`` still waits for the draft passes
its neighbours asked for, and a class pinned to a draft still pays the target's pass over
its neighbours' tokens. So the oracle can be out of reach of any policy that runs the
classes together, and by how much depends on the engine and the mix.

``hindsight`` measures it: a segment per phase, after every static arm of the phase in
the repetition, with each class pinned (the sidecar's per-class override) to the static
arm with the highest median class goodput per wall second over the phase's static
segments measured so far (this repetition's and the earlier ones'), as the oracle
chooses on the whole run. It is a reference, not a policy: it knows what the sweep
measured. specctl's distance to it is what learning leaves; its distance to the oracle
is what running the classes together costs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

HINDSIGHT = "hindsight"
STATIC_PREFIX = "static:"


def is_reference(name: str) -> bool:
    """A static arm (``static:<arm>``) or ``hindsight``: what a policy is measured against,
    not a policy that learns."""
    return name.startswith(STATIC_PREFIX) or name == HINDSIGHT


def hindsight_arms(
    segments: Sequence[Mapping[str, Any]], phase: str, classes: Sequence[str]
) -> dict[str, str]:
    """Per class, the static arm (without ``static:``) with the highest median class
    goodput per wall second over the static segments of ``phase`` in ``segments``.
    Raises ValueError where no static segment of the phase measured a class. A read."""
    goodput: dict[tuple[str, str], list[float]] = {}
    for s in segments:
        policy = str(s["policy"])
        seconds = float(s["window_s"])
        if s["phase"] != phase or not policy.startswith(STATIC_PREFIX) or seconds <= 0:
            continue
        arm = policy.removeprefix(STATIC_PREFIX)
        for c, v in s["classes"].items():
            goodput.setdefault((c, arm), []).append(float(v["tokens"]) / seconds)
    chosen: dict[str, str] = {}
    for c in classes:
        measured = {arm: statistics.median(g) for (k, arm), g in goodput.items() if k == c}
        if not measured:
            raise ValueError(
                f"hindsight: no static arm was measured for class {c!r} in phase {phase!r}"
            )
        chosen[c] = max(measured, key=lambda a: measured[a])
    return chosen
