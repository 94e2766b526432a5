"""The real-engine benchmark's JSON document and its text summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specctl.bench.analysis import CLOCKS, SPECCTL, summarize
from specctl.bench.beliefs import format_beliefs
from specctl.bench.workload import Workload

GOODPUT = (
    "committed tokens (per request-round: 1 + accepted drafts, as the engine reported them) "
    "per second: 'cpu' per engine CPU second (vLLM's engine core and model workers), 'wall' "
    "per second of the measured window"
)
WARMUP = (
    "each segment measures its phase's 'seconds' after an unmeasured lead: warmup_s for a "
    "learning policy (ramp-up, reconnect, adapting to the phase), settle_s for a static arm "
    "(ramp-up)"
)


def benchmark_json(workload: Workload, raw: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """Everything the run measured and derived; ``policies`` is keyed by policy name."""
    summary = summarize(
        raw,
        classes=[c.name for c in workload.classes],
        phases=[(p.name, p.seconds) for p in workload.phases],
    )
    return {
        "benchmark": "engine",
        "workload": workload.to_json(),
        "engine": raw["engine"],
        "goodput": GOODPUT,
        "clocks": dict(CLOCKS),
        "measurement": {
            "warmup_s": raw["warmup_s"],
            "settle_s": workload.bench.settle_s,
            "carry_state": workload.bench.carry_state,
            "what": WARMUP,
            "oracle": "per (phase, class) the static arm with the highest median class goodput "
            "over the repetitions, compared per repetition with that arm's own measurement",
            "hindsight": "every class pinned at once, per phase, to its static arm with the "
            "highest median class goodput per wall second over the phase's static segments "
            "so far; run after them in each repetition",
            "best_measured": "per phase, the static assignment the run measured (a static "
            "arm for every class, or hindsight's arms) with the highest median goodput: the "
            "best static choice an engine ran, where the oracle adds up classes measured in "
            "batches they did not share",
        },
        "repetitions": raw["repetitions"],
        "seed": seed,
        "elapsed_s": raw["elapsed_s"],
        "headline": summary["headline"],
        "oracle": summary["oracle"],
        "policies": summary["policies"],
        **({"hindsight_arms": summary["hindsight_arms"]} if "hindsight_arms" in summary else {}),
        **({"beliefs": summary["beliefs"]} if "beliefs" in summary else {}),
        "segments": raw["segments"],
        "timeline": raw["timeline"],
    }


def _f(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _spread(s: Mapping[str, Any]) -> str:
    if s["median"] is None:
        return "-"
    if s["min"] == s["max"]:
        return f"{s['median']:.3f}"
    return f"{s['median']:.3f} ({s['min']:.2f}-{s['max']:.2f})"


def format_report(out: Mapping[str, Any]) -> str:
    """Per policy the medians (and spread over repetitions) per wall second and per engine
    CPU second; the oracle's arms; specctl's per-repetition ratios and off shares."""
    lines = [
        f"{'policy':<24} {'variant':<11} {'tok/s':>8} {'vs oracle':>20} "
        f"{'vs best static':>20} {'vs no spec':>20} {'tok/CPU s':>10} {'CPU vs oracle':>14}"
    ]
    for name, p in out["policies"].items():
        cpu, wall = p["cpu"], p["wall"]
        lines.append(
            f"{name:<24} {p['variant']:<11} {_f(wall['goodput']['median'], '.1f'):>8} "
            f"{_spread(wall['vs_oracle']):>20} {_spread(wall['vs_best_static']):>20} "
            f"{_spread(wall['vs_no_spec']):>20} {_f(cpu['goodput']['median'], '.1f'):>10} "
            f"{_f(cpu['vs_oracle']['median']):>14}"
        )
    o = out["oracle"]["wall"]
    lines.append("")
    lines.append(
        "oracle (best static arm per phase and class, per second): "
        + "; ".join(
            f"{phase}: " + ", ".join(f"{c} {a}" for c, a in arms.items())
            for phase, arms in o["arms"].items()
        )
    )
    lines.append(f"best single static arm: {o['best_static_arm']}")
    m = o.get("best_measured")
    if m:
        lines.append(
            "best measured assignment (per phase, the static arm or hindsight's arms with the "
            "highest median): "
            + ", ".join(f"{phase} {a}" for phase, a in m["by_phase"].items())
            + f"; {_spread(m['vs_oracle'])} of the oracle, which no batch runs"
        )
    if "hindsight_arms" in out:
        lines.append(
            "hindsight pinned (last repetition): "
            + "; ".join(
                f"{phase}: " + ", ".join(f"{c} {a}" for c, a in arms.items())
                for phase, arms in out["hindsight_arms"].items()
            )
        )
    if SPECCTL in out["policies"]:
        h = out["headline"]
        for clock in CLOCKS:
            e = h[clock]
            parts = [
                f"oracle {_reps(e['vs_oracle'])}",
                f"best static {_reps(e['vs_best_static'])}",
                f"no spec {_reps(e['vs_no_spec'])}",
            ]
            if e.get("vs_best_measured", {}).get("median") is not None:
                parts.append(f"best measured {_reps(e['vs_best_measured'])}")
            parts += [f"{peer} {_reps(s)}" for peer, s in e["vs_peers"].items()]
            lines.append(f"specctl per repetition ({clock}) vs: " + "; ".join(parts))
        paired = h["wall"]["vs_peers"]
        if paired:
            # the medians against the oracle come from different repetitions' draws of a
            # noisy machine; a ratio taken within each repetition does not
            lines.append(
                "specctl over each learning policy, repetition by repetition (median and "
                "range per wall second): "
                + ", ".join(f"{peer} {_spread(s)}" for peer, s in paired.items())
            )
        lines.append(
            "request-rounds run off by specctl: "
            + ", ".join(f"{c} {_f(s, '.0%')}" for c, s in h["off_share"].items())
        )
        wins = h.get("off_where_speculation_wins") or []
        if wins:
            lines.append(
                "run off where an arm beats off by 10% or more in the sweep (per repetition): "
                + "; ".join(
                    f"{w['phase']} {w['class']} ({w['arm']} {w['gain']:.2f}x) "
                    + " ".join(_f(v, ".1%") for v in w["off_share"]["per_repetition"])
                    for w in wins
                )
            )
    cores = {name: p.get("sidecar_cores") for name, p in out["policies"].items()}
    if any(c is not None for c in cores.values()):
        lines.append(
            "sidecar CPU (cores, median per segment): "
            + ", ".join(f"{name} {_f(c)}" for name, c in cores.items())
        )
    lines.append("")
    lines.append("phases (tok/s, median; vs oracle)")
    phases = list(out["oracle"]["wall"]["arms"])
    lines.append(f"{'policy':<24} " + " ".join(f"{p:>22}" for p in phases))
    for name, p in out["policies"].items():
        cells = []
        for ph in phases:
            e = p["wall"]["phases"][ph]
            cells.append(
                f"{_f(e['goodput']['median'], '.1f'):>13} {_f(e['vs_oracle']['median']):>8}"
            )
        lines.append(f"{name:<24} " + " ".join(f"{c:>22}" for c in cells))
    if out.get("beliefs"):
        lines.append("")
        lines.append(
            "specctl's belief at the end of each phase: per arm, goodput over off in the "
            "sweep / believed (median over repetitions); believed best per repetition"
        )
        lines.extend(format_beliefs(out["beliefs"]))
    return "\n".join(lines)


def _reps(s: Mapping[str, Any]) -> str:
    return " ".join(_f(v) for v in s["per_repetition"])
