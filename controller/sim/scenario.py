"""Scenarios: a simulated target, its traffic, its load over time, and events.

A scenario is written in fractions of the run, so the same scenario runs at a
CI size (a few hundred steps) and at full size (20,000 steps). Concurrency is
a closed loop: ``batch`` clients each keep one request running, and a finished
request is replaced by a new one whose class is drawn from the current mix.

Events, at a step:

- :class:`AcceptanceChange`: every conditional acceptance rate of a class is
  multiplied by ``scale`` from then on (0.5: a drafter checkpoint that no
  longer matches the target; 1.0: recovered);
- :class:`MixChange`: new requests follow a new class mix (a traffic shift);
- :class:`LoadChange`: the number of concurrent requests becomes ``batch``
  (a surge, or its end).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specctl.sim.table import (
    REFERENCE_BATCH,
    Row,
    TableError,
    TargetModel,
    build_target,
    read_rows,
    targets,
)


@dataclass(frozen=True)
class AcceptanceChange:
    step: int
    workload_class: str
    scale: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.scale <= 2.0:
            raise ValueError(f"acceptance scale {self.scale} must be in [0, 2]")


@dataclass(frozen=True)
class MixChange:
    step: int
    weights: dict[str, float]


@dataclass(frozen=True)
class LoadChange:
    step: int
    batch: int

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batch {self.batch} must be at least 1")


Event = AcceptanceChange | MixChange | LoadChange


class EventQueue:
    """A run's events in step order, each handed out once, when its step comes."""

    def __init__(self, events: Sequence[Event]) -> None:
        self._events = sorted(events, key=lambda e: e.step)
        self._next = 0

    def pop_due(self, step: int) -> list[Event]:
        """The events not handed out yet whose step is at most ``step``, in step order."""
        due: list[Event] = []
        while self._next < len(self._events) and self._events[self._next].step <= step:
            due.append(self._events[self._next])
            self._next += 1
        return due


@dataclass(frozen=True)
class Scenario:
    """One simulated run's world. ``mix`` weights need not sum to 1."""

    name: str
    description: str
    model: TargetModel
    steps: int
    batch: int = REFERENCE_BATCH
    mix: dict[str, float] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    mean_output_tokens: int = 256

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"scenario {self.name}: steps={self.steps} must be positive")
        known = set(self.model.classes)
        for name in self.mix:
            if name not in known:
                raise ValueError(f"scenario {self.name}: mix names unknown class {name!r}")
        for e in self.events:
            if not 0 <= e.step < self.steps:
                raise ValueError(f"scenario {self.name}: event {e} is outside 0..{self.steps - 1}")
            names = [e.workload_class] if isinstance(e, AcceptanceChange) else []
            names += list(e.weights) if isinstance(e, MixChange) else []
            for name in names:
                if name not in known:
                    raise ValueError(f"scenario {self.name}: event {e} names unknown class")

    def mix_vector(self, weights: dict[str, float] | None = None) -> np.ndarray:
        w = weights if weights is not None else self.mix
        v = np.array([w.get(c, 0.0) for c in self.model.classes]) if w else None
        if v is None or v.sum() <= 0:
            v = np.ones(len(self.model.classes))
        return v / v.sum()

    def with_events(self, events: Sequence[Event]) -> Scenario:
        return dataclasses.replace(self, events=tuple(sorted(events, key=lambda e: e.step)))


def expand_classes(
    model: TargetModel,
    names: Sequence[str],
    profile: Sequence[int],
    acceptance_scale: Sequence[float],
) -> TargetModel:
    """A target whose class ``names[i]`` behaves like class ``profile[i]`` of ``model``,
    with every conditional acceptance rate scaled by ``acceptance_scale[i]``."""
    idx = np.asarray(profile, dtype=np.int64)
    scale = np.asarray(acceptance_scale, dtype=np.float64)[:, None, None]
    return dataclasses.replace(
        model,
        classes=tuple(names),
        conditional=np.clip(model.conditional[idx] * scale, 0.0, 1.0),
        cost_ref=model.cost_ref[idx],
    )


def short_name(target: str) -> str:
    """``Qwen/Qwen3-8B`` -> ``qwen3-8b``: a target as a scenario name."""
    return target.rsplit("/", 1)[-1].lower()


def _find_target(rows: Sequence[Row], wanted: str) -> str:
    for t in targets(rows):
        if t == wanted or short_name(t) == wanted.lower():
            return t
    raise TableError(f"target {wanted!r} is not in the table; it has {', '.join(targets(rows))}")


def per_target(rows: Sequence[Row], steps: int) -> list[Scenario]:
    """Scenario 1: each target of the table, its datasets as classes, equal mix."""
    return [
        Scenario(
            name=f"targets/{short_name(t)}",
            description=f"{t}: its datasets as classes, equal mix, batch {REFERENCE_BATCH}",
            model=build_target(rows, t),
            steps=steps,
        )
        for t in targets(rows)
    ]


def qwen3_8b(rows: Sequence[Row], steps: int) -> list[Scenario]:
    """Scenario 2: Qwen3-8B, where EAGLE-3 loses on MATH500 at every N."""
    t = _find_target(rows, "qwen3-8b")
    return [
        Scenario(
            name="qwen3-8b",
            description="Qwen3-8B, equal mix: EAGLE-3 loses on math500 at every N",
            model=build_target(rows, t),
            steps=steps,
        )
    ]


def drift(rows: Sequence[Row], steps: int) -> list[Scenario]:
    """Scenario 3: one class's acceptance halves at 40% of the run and recovers at 70%."""
    t = _find_target(rows, "kimi-k2.5")
    return [
        Scenario(
            name="drift",
            description="Kimi-K2.5: math500 acceptance x0.5 from 40% of the run, back at 70%",
            model=build_target(rows, t),
            steps=steps,
            events=(
                AcceptanceChange(int(steps * 0.4), "math500", 0.5),
                AcceptanceChange(int(steps * 0.7), "math500", 1.0),
            ),
        )
    ]


def load_swing(rows: Sequence[Row], steps: int) -> list[Scenario]:
    """Scenario 4: concurrency rises from 8 to 256 (speculation loses) and falls back."""
    t = _find_target(rows, "qwen3.5-27b")
    low, high = 8, 256
    events: list[Event] = []
    ramp = 20
    for i in range(ramp + 1):
        frac = i / ramp
        batch = round(low * (high / low) ** frac)
        events.append(LoadChange(int(steps * (0.1 + 0.3 * frac)), batch))
        events.append(LoadChange(int(steps * (0.9 - 0.3 * frac)), batch))
    events.sort(key=lambda e: e.step)
    return [
        Scenario(
            name="load-swing",
            description=(
                f"Qwen3.5-27B: concurrency {low} -> {high} over 10-40% of the run, held, "
                f"back to {low} over 60-90%"
            ),
            model=build_target(rows, t),
            steps=steps,
            batch=low,
            events=tuple(events),
        )
    ]


def long_tail(rows: Sequence[Row], steps: int, num_classes: int = 100) -> list[Scenario]:
    """Scenario 5: 100 classes, Zipf(1.1) traffic, each a perturbed copy of a dataset."""
    t = _find_target(rows, "qwen3.6-35b-a3b")
    base = build_target(rows, t)
    rng = np.random.default_rng(20260823)
    names = [f"tenant-{i:03d}" for i in range(num_classes)]
    profile = [i % len(base.classes) for i in range(num_classes)]
    scale = rng.uniform(0.75, 1.0, num_classes)
    weights = 1.0 / np.arange(1, num_classes + 1) ** 1.1
    return [
        Scenario(
            name="long-tail",
            description=(
                f"Qwen3.6-35B-A3B: {num_classes} classes (datasets with acceptance x0.75-1.0), "
                "Zipf(1.1) traffic"
            ),
            model=expand_classes(base, names, profile, scale.tolist()),
            steps=steps,
            batch=64,
            mix=dict(zip(names, weights.tolist(), strict=True)),
        )
    ]


SCENARIOS: dict[str, Callable[[Sequence[Row], int], list[Scenario]]] = {
    "targets": per_target,
    "qwen3-8b": qwen3_8b,
    "drift": drift,
    "load-swing": load_swing,
    "long-tail": long_tail,
}


def build_scenarios(
    name: str,
    steps: int,
    table: str | Path | None = None,
    target: str | None = None,
    trace: Sequence[str | Path] = (),
) -> list[Scenario]:
    """Scenarios by name (``all`` for every one); with ``table``, a user's sweep.

    A user table runs as scenario ``table``: ``target`` (or each target in the
    table) with its datasets as classes, equal mix. Scenario ``trace`` replays
    each recorded trace in ``trace`` (:mod:`specctl.sim.trace_scenario`).
    """
    if name == "trace":
        from specctl.sim.trace_scenario import trace_scenarios

        return list(trace_scenarios(trace, steps))
    rows = read_rows(table)
    if table is not None and name in ("table", "all"):
        chosen = [_find_target(rows, target)] if target else targets(rows)
        return [
            Scenario(
                name=f"table/{short_name(t)}",
                description=f"{t} from {Path(table).name}: its datasets as classes, equal mix",
                model=build_target(rows, t),
                steps=steps,
            )
            for t in chosen
        ]
    if name == "all":
        return [s for build in SCENARIOS.values() for s in build(rows, steps)]
    build = SCENARIOS.get(name)
    if build is None:
        raise ValueError(
            f"unknown scenario {name!r}; known: all, {', '.join(SCENARIOS)}, trace (with --trace)"
            + (", table" if table is not None else "")
        )
    scenarios = build(rows, steps)
    if target is not None:
        scenarios = [
            s
            for s in scenarios
            if short_name(s.model.target) == target.lower() or s.model.target == target
        ]
        if not scenarios:
            raise ValueError(f"scenario {name!r} has no target {target!r}")
    return scenarios
