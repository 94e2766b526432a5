"""What the book answers with, as plain values: an engine's policy, and the evidence.

:mod:`specctl.protocol.policy_messages` turns them into the messages engines and
operators receive; the simulator compiles them into an engine's view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specctl.arms import OFF, Arm
from specctl.policy.base import Decision, Evidence
from specctl.sidecar.stability import StabilityStats


@dataclass(frozen=True)
class PolicyEntry:
    """One context's distribution, over the arms one engine can run."""

    workload_class: str
    load_bucket: int
    arms: tuple[Arm, ...]
    probabilities: tuple[float, ...]
    explanation: str


@dataclass(frozen=True)
class EnginePolicy:
    """The published policy as an engine offering some drafters receives it."""

    version: int
    policy_name: str
    fallback_arm: Arm
    load_bucket_bounds: tuple[int, ...]
    default_class: str
    entries: tuple[PolicyEntry, ...]


def engine_policy(
    published: Sequence[tuple[tuple[str, int], Decision]],
    offered: Mapping[str, int],
    fallback: Arm,
    engine_fallback: Arm,
    *,
    version: int,
    policy_name: str,
    load_bucket_bounds: tuple[int, ...],
    default_class: str,
) -> EnginePolicy:
    """The published distributions restricted to what an engine offering ``offered`` runs.

    Each distribution keeps the engine's runnable arms, renormalised; where
    none remains, ``fallback``, or the engine's own fallback if ``fallback`` is
    not runnable there, or off.
    """

    def runnable(arm: Arm) -> bool:
        return arm.is_off or arm.k <= offered.get(arm.drafter, 0)

    if not runnable(fallback):
        fallback = engine_fallback if runnable(engine_fallback) else OFF
    entries = []
    for (cls, bucket), d in published:
        keep = [i for i, arm in enumerate(d.arms) if runnable(arm)]
        probs = d.probabilities[keep]
        total = float(probs.sum())
        if keep and total > 0.0:
            arms = tuple(d.arms[i] for i in keep)
            values = tuple((probs / total).tolist())
            why = (
                d.explanation
                if len(keep) == len(d.arms)
                else f"{d.explanation} (restricted to this engine's arms)"
            )
        else:
            arms, values = (fallback,), (1.0,)
            why = f"{d.explanation} (not runnable here: fallback {fallback})"
        entries.append(PolicyEntry(cls, bucket, arms, values, why))
    return EnginePolicy(
        version, policy_name, fallback, load_bucket_bounds, default_class, tuple(entries)
    )


@dataclass(frozen=True)
class ContextEvidence:
    """Why one context's distribution is what it is."""

    workload_class: str
    load_bucket: int
    decision: Decision
    override: Arm | None
    evidence: Evidence
    stability: StabilityStats


@dataclass(frozen=True)
class BookEvidence:
    """The evidence behind the published policy, for some or all classes."""

    policy_version: int
    policy_name: str
    contexts: tuple[ContextEvidence, ...]
