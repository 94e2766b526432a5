"""The engine's read-only copy of a policy, compiled for sampling on the step path.

A :class:`PolicyView` is immutable: the client thread builds a new one when a
policy arrives and swaps a single reference, so the scheduler reads it with no
lock. Sampling is one dict lookup and one ``bisect`` per (class, bucket) per
step.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from specctl.api import pb
from specctl.arms import OFF, Arm, ArmError, parse_arm
from specctl.steps import load_bucket_of


class PolicyError(ValueError):
    """A policy from the controller that this engine cannot apply."""


@dataclass(frozen=True, slots=True)
class Choice:
    """An arm to apply and the probability with which it was chosen."""

    arm: Arm
    propensity: float


@dataclass(frozen=True, slots=True)
class _Entry:
    arms: tuple[Arm, ...]
    cumulative: tuple[float, ...]
    probabilities: tuple[float, ...]
    # One Choice per arm, built once: sampling allocates nothing.
    choices: tuple[Choice, ...] = ()

    def __post_init__(self) -> None:
        if not self.choices:
            choices = tuple(
                Choice(a, p) for a, p in zip(self.arms, self.probabilities, strict=True)
            )
            object.__setattr__(self, "choices", choices)

    # Capped choices by cap, built on first use (see :meth:`capped`).
    capped_choices: dict[int, Choice] = field(default_factory=dict, compare=False)

    def sample(self, u: float) -> Choice:
        i = bisect.bisect_right(self.cumulative, u * self.cumulative[-1])
        return self.choices[min(i, len(self.choices) - 1)]

    def capped(self, drafter: str, cap: int) -> Choice:
        """The arm every arm of ``drafter`` above ``cap`` becomes, with its total probability.

        Under a cap, the policy's arms ``k >= cap`` all run as ``k = cap``: the
        arm that ran was chosen with the sum of their probabilities.
        """
        choice = self.capped_choices.get(cap)
        if choice is None:
            arm = capped_arm(drafter, cap)
            p = sum(
                q
                for a, q in zip(self.arms, self.probabilities, strict=True)
                if capped_arm(a.drafter, min(a.k, cap)) == arm
            )
            choice = self.capped_choices[cap] = Choice(arm, p)
        return choice


@dataclass(frozen=True)
class PolicyView:
    """A policy as the engine applies it. ``version`` 0 means the fallback arm."""

    version: int
    fallback: Arm
    load_bucket_bounds: tuple[int, ...]
    default_class: str
    received_monotonic: float
    entries: Mapping[tuple[str, int], _Entry] = field(default_factory=dict)
    fallback_choice: Choice = field(init=False, repr=False, compare=False)
    # The fallback arm under each cap, built on first use.
    capped_fallback: dict[int, Choice] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "fallback_choice", Choice(self.fallback, 1.0))

    @property
    def num_load_buckets(self) -> int:
        return len(self.load_bucket_bounds) + 1

    def load_bucket(self, batch_size: int) -> int:
        return load_bucket_of(batch_size, self.load_bucket_bounds)

    def choose(self, workload_class: str, load_bucket: int, u: float) -> Choice:
        """Sample with ``u`` uniform in [0, 1); unknown contexts use the default class."""
        entry = self.entries.get((workload_class, load_bucket))
        if entry is None:
            entry = self.entries.get((self.default_class, load_bucket))
            if entry is None:
                return self.fallback_choice
        return entry.sample(u)

    def choose_capped(self, workload_class: str, load_bucket: int, u: float, cap: int) -> Choice:
        """:meth:`choose` under a step-level cap on K (a user's Dynamic SD table).

        An arm above the cap runs at the cap; the returned choice names the
        arm that runs and the probability that the policy runs it, so the
        sidecar learns from what ran with a true propensity.
        """
        entry = self.entries.get((workload_class, load_bucket))
        if entry is None:
            entry = self.entries.get((self.default_class, load_bucket))
        if entry is None:
            choice = self.fallback_choice
            if choice.arm.k <= cap:
                return choice
            capped = self.capped_fallback.get(cap)
            if capped is None:
                capped = Choice(capped_arm(choice.arm.drafter, cap), 1.0)
                self.capped_fallback[cap] = capped
            return capped
        choice = entry.sample(u)
        if choice.arm.k < cap:
            return choice  # runs as sampled, and no other arm runs as it
        return entry.capped(choice.arm.drafter, cap)


def capped_arm(drafter: str, k: int) -> Arm:
    """``drafter`` at ``k`` tokens; ``off`` at 0."""
    return OFF if k <= 0 else Arm(drafter, k)


def fallback_view(fallback: Arm, load_bucket_bounds: Sequence[int] = ()) -> PolicyView:
    """The view an engine runs before any policy arrives, or when its policy is stale."""
    return PolicyView(
        version=0,
        fallback=fallback,
        load_bucket_bounds=tuple(load_bucket_bounds),
        default_class="default",
        received_monotonic=time.monotonic(),
    )


def compile_policy(policy: pb.Policy, offered: Mapping[str, int]) -> PolicyView:
    """Check a pushed policy against what this engine runs (drafter -> max K) and compile it.

    Arms the engine cannot run are an error (the controller restricts each
    engine's policy to the arms it offered); so are probabilities that are not
    a distribution.
    """

    def runnable(name: str, where: str) -> Arm:
        try:
            arm = parse_arm(name)
        except ArmError as exc:
            raise PolicyError(f"{where}: {exc}") from None
        if not arm.is_off and arm.k > offered.get(arm.drafter, 0):
            raise PolicyError(f"{where}: arm {name!r} is not offered by this engine")
        return arm

    fallback = runnable(policy.fallback_arm or OFF.name, "fallback_arm")
    bounds = tuple(int(b) for b in policy.load_bucket_bounds)
    if list(bounds) != sorted(set(bounds)):
        raise PolicyError(f"load_bucket_bounds {list(bounds)} must be strictly increasing")
    entries: dict[tuple[str, int], _Entry] = {}
    for n, e in enumerate(policy.entries):
        where = f"entries[{n}] ({e.workload_class!r}, bucket {e.load_bucket})"
        if len(e.arms) == 0 or len(e.arms) != len(e.probabilities):
            raise PolicyError(
                f"{where}: {len(e.arms)} arms and {len(e.probabilities)} probabilities"
            )
        probs = tuple(float(p) for p in e.probabilities)
        if any(not (0.0 <= p <= 1.0) for p in probs) or abs(sum(probs) - 1.0) > 1e-6:
            raise PolicyError(f"{where}: probabilities {list(probs)} are not a distribution")
        # off first, then by drafter and K: the scheduler samples every class with one
        # uniform, so that classes drafting short and long go together
        order = sorted(
            zip((runnable(a, where) for a in e.arms), probs, strict=True),
            key=lambda ap: (not ap[0].is_off, ap[0].drafter, ap[0].k),
        )
        arms = tuple(a for a, _ in order)
        probs = tuple(p for _, p in order)
        entries[(e.workload_class, int(e.load_bucket))] = _Entry(
            arms, tuple(accumulate(probs)), probs
        )
    return PolicyView(
        version=int(policy.version),
        fallback=fallback,
        load_bucket_bounds=bounds,
        default_class=policy.default_class or "default",
        received_monotonic=time.monotonic(),
        entries=entries,
    )
