"""The real-engine benchmark's schedule: which policies run, in which order, for how long.

Every policy runs one segment per repetition and load phase, in an order
rotated from phase to phase and repetition to repetition, so that no policy
always runs first, or always right after a given one (see
:mod:`specctl.bench.engine_bench`). ``hindsight`` runs last in each, after the
static arms it chooses among (:mod:`specctl.bench.hindsight`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specctl.bench.hindsight import HINDSIGHT
from specctl.bench.policy_names import learning_policies, policy_params, registered_policy
from specctl.bench.workload import Workload


@dataclass(frozen=True)
class PolicyRun:
    """One policy of the benchmark: a static arm pinned by override, ``hindsight`` (each
    class pinned to its best static arm so far), or a learning policy."""

    name: str
    static_arm: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    hindsight: bool = False

    @property
    def learning(self) -> bool:
        return self.static_arm is None and not self.hindsight

    @property
    def policy(self) -> str:
        """The policy the sidecar runs: ``specctl`` for ``specctl`` and ``specctl@<label>``."""
        return registered_policy(self.name)


def expand_policies(workload: Workload, names: Sequence[str] | None = None) -> list[PolicyRun]:
    """The policies to run, in the order given: ``static`` expands to every static arm of
    the workload (``static:<arm>``); default: every static arm, specctl, every peer. A
    variant (``<policy>@<label>``) runs its policy with the parameters of
    :func:`~specctl.bench.policy_names.policy_params`."""
    chosen = list(names or workload.bench.policies or ["static", *learning_policies()])
    runs: dict[str, PolicyRun] = {}
    for name in chosen:
        if name == HINDSIGHT:
            runs.setdefault(name, PolicyRun(name, hindsight=True))
        elif name == "static":
            for arm in workload.static_arms():
                runs.setdefault(f"static:{arm}", PolicyRun(f"static:{arm}", static_arm=arm))
        elif name.startswith("static:"):
            runs.setdefault(name, PolicyRun(name, static_arm=name.removeprefix("static:")))
        else:
            runs.setdefault(
                name, PolicyRun(name, params=policy_params(workload.policy_params, name))
            )
    if HINDSIGHT in runs and not any(r.static_arm for r in runs.values()):
        raise ValueError("hindsight pins the static arms' best per class: run static arms too")
    return list(runs.values())


def rotated(runs: Sequence[PolicyRun], offset: int) -> list[PolicyRun]:
    k = offset % len(runs) if runs else 0
    return [*runs[k:], *runs[:k]]


def schedule(
    workload: Workload, runs: Sequence[PolicyRun], repetitions: int
) -> list[tuple[int, int, PolicyRun]]:
    """(repetition, phase index, policy) in the order they run: ``hindsight`` after the
    others of its repetition and phase, which it chooses among."""
    rotating = [r for r in runs if not r.hindsight]
    last = [r for r in runs if r.hindsight]
    out = []
    for rep in range(repetitions):
        for p in range(len(workload.phases)):
            for run in [*rotated(rotating, rep * len(workload.phases) + p), *last]:
                out.append((rep, p, run))
    return out


def estimate_seconds(workload: Workload, runs: Sequence[PolicyRun], repetitions: int) -> float:
    """What the segments take, without engine start-up and switching."""
    total = 0.0
    for _, p, run in schedule(workload, runs, repetitions):
        lead = workload.bench.warmup_s if run.learning else workload.bench.settle_s
        total += lead + workload.phases[p].seconds
    return total
