"""Goodput, the oracle and the ratios of a real-engine run, from its segments.

Goodput is committed tokens (per request-round: one token plus the accepted
drafts, as the engine reported them) per second, on two clocks: ``cpu``, per
engine CPU second (engine core and model workers), and ``wall``, per second of
the measured window. A class's goodput is its tokens over the same seconds, so
the classes of a segment add up to its goodput; each class has its own
clients, so its tokens do not depend on how fast the others go except through
the step time they share.

For one repetition ``r``:

- ``G(X, p, r)``: policy X's goodput in phase p (sum over classes);
- ``G(X, r)``: the mean over phases weighted by the phases' measured seconds;
- the **oracle** (in hindsight, from the same run): per (phase, class) the
  static arm with the highest median class goodput over the repetitions;
  ``O(p, r)`` is the sum over classes of that arm's class goodput in
  repetition r, ``O(r)`` its phase-weighted mean;
- the **best single static arm**: the arm (the same for every class and phase)
  with the highest median ``G(a, r)``; **no speculation** is ``static:off``;
- ``hindsight`` (when it runs, :mod:`specctl.bench.hindsight`): the oracle's
  arms pinned together in one segment, a reference measured like a policy;
- the **best measured assignment**: per phase, whichever static assignment the
  run measured (a static arm for every class, or ``hindsight``'s arm per
  class) has the highest median ``G(X, p, r)``; ``M(r)`` is its phase-weighted
  mean.

The oracle adds up classes measured in different segments, each in a batch
where every class ran that class's arm. Classes that share a batch share its
steps (a model drafter proposes for the whole batch whatever each class
verifies), so no engine runs the oracle's sum: it is a reference the classes'
interaction puts out of reach, by as much as the run shows between ``O`` and
``hindsight``. ``M`` is the best static assignment the engine did run, a
reachable reference next to it; both are reported.

The oracle's and the best static arm's identities are chosen on medians over
all repetitions, then each repetition is compared with that arm's own
measurement in the same repetition; ratios are per repetition, and the
summary gives their median, minimum and maximum.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specctl.bench.beliefs import beliefs
from specctl.bench.hindsight import HINDSIGHT, is_reference
from specctl.bench.policy_names import VARIANT_SEPARATOR

CLOCKS = {"cpu": "engine_cpu_s", "wall": "window_s"}
NO_SPEC = "static:off"
# a class gains from speculation where an arm beats off by this much in the sweep
GAIN_BAR = 1.10
SPECCTL = "specctl"


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


def stats(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, min and max over repetitions, and each repetition's value."""
    kept = [v for v in values if v is not None]
    return {
        "median": _r(statistics.median(kept)) if kept else None,
        "min": _r(min(kept)) if kept else None,
        "max": _r(max(kept)) if kept else None,
        "per_repetition": [_r(v) for v in values],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def variant(name: str, params: Mapping[str, Any] | None = None) -> str:
    """What a policy of the benchmark is: a static arm or ``hindsight`` (``reference``), specctl
    (``learning``), a policy's ``<policy>@<label>`` (``variant``), or a peer as its
    system ships it (``as-shipped``) or with the workload's parameters (``configured``)."""
    if is_reference(name):
        return "reference"
    if name == SPECCTL:
        return "learning"
    if VARIANT_SEPARATOR in name:
        return "variant"
    return "configured" if params else "as-shipped"


class ClockView:
    """Goodput on one clock, per (policy, repetition, phase, class), and the oracle."""

    def __init__(
        self,
        segments: Sequence[Mapping[str, Any]],
        clock: str,
        classes: Sequence[str],
        phases: Sequence[tuple[str, float]],
        reps: Sequence[int],
        statics: Sequence[str],
    ) -> None:
        key = CLOCKS[clock]
        self.classes, self.phases, self.reps = list(classes), list(phases), list(reps)
        self.g: dict[tuple[str, int, str, str], float] = {}
        for s in segments:
            seconds = float(s[key])
            if seconds > 0:
                for c, v in s["classes"].items():
                    self.g[(s["policy"], s["repetition"], s["phase"], c)] = v["tokens"] / seconds
        self.total_w = sum(w for _, w in phases)
        # the oracle's arm per (phase, class), on medians over the repetitions
        self.oracle_arm: dict[str, dict[str, str | None]] = {}
        for p, _ in phases:
            self.oracle_arm[p] = {}
            for c in classes:
                best, best_v = None, -1.0
                for a in statics:
                    kept = [v for r in reps if (v := self.cls(a, r, p, c)) is not None]
                    if kept and statistics.median(kept) > best_v:
                        best, best_v = a, statistics.median(kept)
                self.oracle_arm[p][c] = best

    def cls(self, x: str, r: int, p: str, c: str) -> float | None:
        return self.g.get((x, r, p, c))

    def phase(self, x: str, r: int, p: str) -> float | None:
        return _sum([self.cls(x, r, p, c) for c in self.classes])

    def mean(self, f: Callable[[str], float | None]) -> float | None:
        """Mean over phases weighted by their seconds (None if a phase is missing)."""
        vals = [(f(p), w) for p, w in self.phases]
        if any(v is None for v, _ in vals) or self.total_w <= 0:
            return None
        return sum(v * w for v, w in vals if v is not None) / self.total_w

    def overall(self, x: str, r: int) -> float | None:
        return self.mean(lambda p: self.phase(x, r, p))

    def assignment_overall(self, by_phase: Mapping[str, str], r: int) -> float | None:
        """``G(r)`` of running ``by_phase[p]`` (a policy's name) in each phase p."""
        return self.mean(lambda p: self.phase(by_phase[p], r, p))

    def class_overall(self, x: str, r: int, c: str) -> float | None:
        return self.mean(lambda p: self.cls(x, r, p, c))

    def oracle_cls(self, r: int, p: str, c: str) -> float | None:
        arm = self.oracle_arm[p][c]
        return None if arm is None else self.cls(arm, r, p, c)

    def oracle_phase(self, r: int, p: str) -> float | None:
        return _sum([self.oracle_cls(r, p, c) for c in self.classes])

    def oracle_overall(self, r: int) -> float | None:
        return self.mean(lambda p: self.oracle_phase(r, p))

    def oracle_class_overall(self, r: int, c: str) -> float | None:
        return self.mean(lambda p: self.oracle_cls(r, p, c))


def best_measured(view: ClockView, candidates: Sequence[str]) -> dict[str, str]:
    """Per phase, the static assignment among ``candidates`` (static arms and
    ``hindsight``) with the highest median phase goodput over the repetitions; empty
    where none ran."""
    out: dict[str, str] = {}
    for p, _ in view.phases:
        best_v = -1.0
        for x in candidates:
            kept = [v for r in view.reps if (v := view.phase(x, r, p)) is not None]
            if kept and statistics.median(kept) > best_v:
                out[p], best_v = x, statistics.median(kept)
    return out if len(out) == len(view.phases) else {}


def _sum(vals: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in vals) else sum(v for v in vals if v is not None)


def _ratios(mine: Sequence[float | None], ref: Sequence[float | None] | None) -> dict[str, Any]:
    if ref is None:
        return stats([None for _ in mine])
    return stats([_ratio(a, b) for a, b in zip(mine, ref, strict=True)])


def _clock_summary(
    view: ClockView, policies: Sequence[str], statics: Sequence[str], learning: Sequence[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the oracle's entry, per policy its entry) on one clock."""
    reps = view.reps
    overall = {x: [view.overall(x, r) for r in reps] for x in policies}
    oracle = [view.oracle_overall(r) for r in reps]
    measured_by_phase = best_measured(
        view, [*statics, *([HINDSIGHT] if HINDSIGHT in policies else [])]
    )
    measured = (
        [view.assignment_overall(measured_by_phase, r) for r in reps] if measured_by_phase else None
    )
    best_static = None
    if statics:
        best_static = max(
            statics,
            key=lambda a: statistics.median([v for v in overall[a] if v is not None] or [0.0]),
        )
    oracle_entry = {
        "arms": {
            p: {c: (a or "").removeprefix("static:") for c, a in arms.items()}
            for p, arms in view.oracle_arm.items()
        },
        "goodput": stats(oracle),
        "best_static_arm": best_static.removeprefix("static:") if best_static else None,
        "best_static_goodput": stats(overall[best_static]) if best_static else None,
        "best_measured": {
            "by_phase": {p: a.removeprefix("static:") for p, a in measured_by_phase.items()},
            "goodput": stats(measured or []),
            "vs_oracle": _ratios(measured or [], oracle),
        }
        if measured_by_phase
        else None,
    }
    entries: dict[str, Any] = {}
    for x in policies:
        per_phase: dict[str, Any] = {}
        for p, _ in view.phases:
            ph = [view.phase(x, r, p) for r in reps]
            per_phase[p] = {
                "goodput": stats(ph),
                "vs_oracle": _ratios(ph, [view.oracle_phase(r, p) for r in reps]),
                "vs_no_spec": _ratios(
                    ph, [view.phase(NO_SPEC, r, p) for r in reps] if NO_SPEC in policies else None
                ),
                "vs_best_measured": _ratios(
                    ph,
                    [view.phase(measured_by_phase[p], r, p) for r in reps]
                    if measured_by_phase
                    else None,
                ),
                "classes": {
                    c: {
                        "goodput": stats([view.cls(x, r, p, c) for r in reps]),
                        "vs_oracle": _ratios(
                            [view.cls(x, r, p, c) for r in reps],
                            [view.oracle_cls(r, p, c) for r in reps],
                        ),
                    }
                    for c in view.classes
                },
            }
        per_class = {
            c: {
                "goodput": stats([view.class_overall(x, r, c) for r in reps]),
                "vs_oracle": _ratios(
                    [view.class_overall(x, r, c) for r in reps],
                    [view.oracle_class_overall(r, c) for r in reps],
                ),
            }
            for c in view.classes
        }
        entry = {
            "goodput": stats(overall[x]),
            "vs_oracle": _ratios(overall[x], oracle),
            "vs_best_static": _ratios(overall[x], overall[best_static] if best_static else None),
            "vs_no_spec": _ratios(overall[x], overall.get(NO_SPEC)),
            "vs_best_measured": _ratios(overall[x], measured),
            "phases": per_phase,
            "classes": per_class,
        }
        if x == SPECCTL:
            entry["vs_peers"] = {
                peer: _ratios(overall[x], overall[peer]) for peer in learning if peer != SPECCTL
            }
        entries[x] = entry
    return oracle_entry, entries


def off_where_speculation_wins(
    view: ClockView, segments: Sequence[Mapping[str, Any]], statics: Sequence[str], policy: str
) -> list[dict[str, Any]]:
    """Per (phase, class) where a static arm's median class goodput beats ``off``'s by
    ``GAIN_BAR`` or more, the best such arm, its gain, and the share of the class's
    request-rounds ``policy`` ran ``off`` in the phase, per repetition: where speculation
    pays, a policy that keeps the class off loses it (empty without ``off`` in the run)."""
    if NO_SPEC not in statics:
        return []
    out = []
    for p, _ in view.phases:
        for c in view.classes:

            def median(x: str, p: str = p, c: str = c) -> float | None:
                kept = [v for r in view.reps if (v := view.cls(x, r, p, c)) is not None]
                return statistics.median(kept) if kept else None

            off = median(NO_SPEC)
            gains = {a: g / off for a in statics if (g := median(a)) is not None and off}
            if not gains:
                continue
            arm = max(gains, key=lambda a: gains[a])
            if gains[arm] < GAIN_BAR:
                continue
            shares: list[float | None] = []
            for r in view.reps:
                runs = [
                    s["classes"][c]["arm_rounds"]
                    for s in segments
                    if s["policy"] == policy and s["phase"] == p and s["repetition"] == r
                ]
                total = sum(sum(a.values()) for a in runs)
                off_rounds = sum(a.get("off", 0.0) for a in runs)
                shares.append(off_rounds / total if total else None)
            out.append(
                {
                    "phase": p,
                    "class": c,
                    "arm": arm.removeprefix("static:"),
                    "gain": _r(gains[arm]),
                    "off_share": stats(shares),
                }
            )
    return out


def sidecar_cores(segments: Sequence[Mapping[str, Any]]) -> float | None:
    """The median over ``segments`` of the sidecar's CPU seconds per wall second (None
    where none recorded them). On a machine the engine keeps busy, each of them is
    taken from the engine: a policy's learning has a price the static arms do not pay."""
    cores = [
        s["sidecar_cpu_s"] / s["window_s"]
        for s in segments
        if "sidecar_cpu_s" in s and s["window_s"] > 0
    ]
    return _r(statistics.median(cores)) if cores else None


def summarize(
    raw: Mapping[str, Any],
    *,
    classes: Sequence[str],
    phases: Sequence[tuple[str, float]],
) -> dict[str, Any]:
    """The benchmark's results from :meth:`EngineBench.run`'s raw measurements.

    ``phases`` are (name, measured seconds), the weights of the phase mean.
    """
    segments = raw["segments"]
    reps = list(range(int(raw["repetitions"])))
    policies = [p["name"] for p in raw["policies"]]
    params = {p["name"]: p.get("params") or {} for p in raw["policies"]}
    statics = [p for p in policies if p.startswith("static:")]
    learning = [p for p in policies if not is_reference(p)]
    result: dict[str, Any] = {
        "oracle": {},
        "policies": {x: {"variant": variant(x, params[x]), "params": params[x]} for x in policies},
    }
    for clock in CLOCKS:
        view = ClockView(segments, clock, classes, phases, reps, statics)
        result["oracle"][clock], entries = _clock_summary(view, policies, statics, learning)
        for x, e in entries.items():
            result["policies"][x][clock] = e

    # what each policy ran: request-rounds per arm, per class, over its measured windows
    for x in policies:
        entry = result["policies"][x]
        runs = [s for s in segments if s["policy"] == x]
        entry["arm_share"] = {}
        entry["off_share"] = {}
        entry["acceptance"] = {}
        entry["off_share_by_phase"] = {p: {} for p, _ in phases}
        entry["sidecar_cores"] = sidecar_cores(runs)
        for c in classes:
            counts: dict[str, float] = {}
            drafted = accepted = 0.0
            for s in runs:
                v = s["classes"][c]
                drafted += v["drafted"]
                accepted += v["accepted"]
                for arm, n in v["arm_rounds"].items():
                    counts[arm] = counts.get(arm, 0.0) + n
            total = sum(counts.values())
            entry["arm_share"][c] = (
                {a: _r(n / total) for a, n in sorted(counts.items())} if total else {}
            )
            entry["off_share"][c] = _r(counts.get("off", 0.0) / total) if total else None
            entry["acceptance"][c] = _r(accepted / drafted) if drafted else None
            for p, _ in phases:
                rounds = off = 0.0
                for s in runs:
                    if s["phase"] == p:
                        v = s["classes"][c]
                        rounds += v["rounds"]
                        off += v["arm_rounds"].get("off", 0.0)
                entry["off_share_by_phase"][p][c] = _r(off / rounds) if rounds else None

    headline: dict[str, Any] = {}
    if SPECCTL in policies:
        for clock in CLOCKS:
            e = result["policies"][SPECCTL][clock]
            headline[clock] = {
                "vs_oracle": e["vs_oracle"],
                "vs_best_static": e["vs_best_static"],
                "vs_no_spec": e["vs_no_spec"],
                "vs_best_measured": e["vs_best_measured"],
                "vs_peers": e["vs_peers"],
            }
        headline["off_share"] = result["policies"][SPECCTL]["off_share"]
        headline["off_where_speculation_wins"] = off_where_speculation_wins(
            ClockView(segments, "wall", classes, phases, reps, statics), segments, statics, SPECCTL
        )
    result["headline"] = headline
    if SPECCTL in policies and raw.get("timeline"):
        result["beliefs"] = beliefs(
            raw["timeline"],
            segments,
            policy=SPECCTL,
            classes=classes,
            phases=[p for p, _ in phases],
        )
    # what hindsight pinned, per phase, in its last repetition
    pinned = {s["phase"]: s.get("pinned", {}) for s in segments if s["policy"] == HINDSIGHT}
    if pinned:
        result["hindsight_arms"] = {p: pinned[p] for p, _ in phases if p in pinned}
    return result
