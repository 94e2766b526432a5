"""What specctl believed at the end of each phase, next to what the sweep measured.

A learning policy can be sure of the wrong side of a gap: run a class ``off`` with every
speculative arm's probability near 0 where the sweep measures one 10% ahead. Its goodput
ratios alone do not say whether it believed that or only had not looked; its evidence
does. The timeline samples it (:mod:`.timeline`); per (phase, class) this reads the last
measured sample of each repetition in the phase's load bucket, and sets the goodput each
arm is believed to give, over ``off``'s, next to the same ratio from the static sweep's
per-class medians.

The two do not measure the same thing, and the difference is worth reading too: the sweep
runs every class at one arm, so a class's goodput there includes every other class's
drafting; the belief is the class's within the batch the policy actually runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

STATIC_PREFIX = "static:"


def beliefs(
    timeline: Sequence[Mapping[str, Any]],
    segments: Sequence[Mapping[str, Any]],
    *,
    policy: str,
    classes: Sequence[str],
    phases: Sequence[str],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per phase and class: ``sweep`` (per static arm, the median over repetitions of the
    class's tokens per wall second, over ``off``'s), ``sweep_best``, and per repetition
    ``believed`` (per arm of the sweep, the policy's goodput over its ``off``'s) and
    ``believed_best`` (the arm with the highest believed goodput). Empty where the run
    has no static ``off`` or no evidence sample of ``policy``."""
    last: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    for row in timeline:
        if row["policy"] == policy and row.get("measured") and row.get("current"):
            if row.get("estimates"):
                last[(row["phase"], row["class"], int(row["repetition"]))] = row
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for phase in phases:
        for c in classes:
            sweep = _sweep(segments, phase, c)
            rows = sorted(
                (rep, row) for (p, cl, rep), row in last.items() if p == phase and cl == c
            )
            if not sweep or not rows:
                continue
            believed: dict[str, list[float | None]] = {arm: [] for arm in sweep}
            believed_best = []
            for _, row in rows:
                est = row["estimates"]
                off = est.get("off", {}).get("goodput")
                for arm in sweep:
                    g = est.get(arm, {}).get("goodput")
                    believed[arm].append(round(g / off, 3) if g is not None and off else None)
                believed_best.append(max(est, key=lambda a: est[a]["goodput"]))
            out.setdefault(phase, {})[c] = {
                "sweep": sweep,
                "sweep_best": max(sweep, key=lambda a: sweep[a]),
                "believed": believed,
                "believed_best": believed_best,
            }
    return out


def _sweep(segments: Sequence[Mapping[str, Any]], phase: str, c: str) -> dict[str, float]:
    """Per static arm, the median over its segments of class ``c``'s tokens per wall
    second in ``phase``, over ``off``'s; empty without a static ``off``."""
    rates: dict[str, list[float]] = {}
    for s in segments:
        if s["phase"] == phase and s["policy"].startswith(STATIC_PREFIX) and s["window_s"] > 0:
            arm = s["policy"][len(STATIC_PREFIX) :]
            rates.setdefault(arm, []).append(s["classes"][c]["tokens"] / s["window_s"])
    off = statistics.median(rates["off"]) if "off" in rates else 0.0
    if off <= 0:
        return {}
    return {arm: round(statistics.median(v) / off, 3) for arm, v in rates.items()}


def format_beliefs(out: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """The report's lines: per phase and class, the sweep's ratios over ``off`` and the
    policy's, the median over repetitions, with what each puts first."""
    lines = []
    for phase, by_class in out.items():
        for c, b in by_class.items():
            cells = []
            for arm, ratio in b["sweep"].items():
                mine = [r for r in b["believed"][arm] if r is not None]
                believed = f"{statistics.median(mine):.2f}" if mine else "-"
                cells.append(f"{arm} {ratio:.2f}/{believed}")
            firsts = ", ".join(b["believed_best"])
            lines.append(
                f"  {phase} {c}: best {b['sweep_best']}, believed {firsts}; " + ", ".join(cells)
            )
    return lines
