"""PNG plots of a real-engine run: goodput per policy, and a learning policy's choices over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specctl.bench.hindsight import is_reference

# bar colour by variant: ours, peers, references
_CLOCK_LABEL = {"cpu": "engine CPU", "wall": "wall"}
_COLOURS = {"learning": "C0", "as-shipped": "C1", "configured": "C1", "reference": "C2"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def arm_colours(arms: Sequence[str]) -> dict[str, Any]:
    """``off`` grey, the drafter's K from light to dark."""
    import matplotlib

    spec = [a for a in arms if a != "off"]
    cmap = matplotlib.colormaps["viridis_r"]
    out: dict[str, Any] = {"off": "0.6"}
    for i, a in enumerate(spec):
        out[a] = cmap(0.15 + 0.75 * i / max(len(spec) - 1, 1))
    return out


def plot_bench(out: Mapping[str, Any], path: Path) -> Path:
    """Three panels: goodput / oracle per policy (median, min-max over repetitions; per
    engine CPU second and per wall second), goodput per phase, and the share of
    request-rounds each class ran off under each learning policy."""
    plt = _plt()
    policies = out["policies"]
    names = list(policies)
    phases = list(out["oracle"]["cpu"]["arms"])
    classes = [c["name"] for c in out["workload"]["classes"]]
    fig, (ax_r, ax_p, ax_o) = plt.subplots(
        1, 3, figsize=(16, max(4.0, 0.35 * len(names) + 1.5)),
        gridspec_kw={"width_ratios": [1.3, 1.2, 1.0]},
    )  # fmt: skip
    y = list(range(len(names)))
    for offset, clock, hatch in ((-0.18, "cpu", ""), (0.18, "wall", "//")):
        med, lo, hi = [], [], []
        for n in names:
            s = policies[n][clock]["vs_oracle"]
            m = s["median"] or 0.0
            med.append(m)
            lo.append(m - (s["min"] if s["min"] is not None else m))
            hi.append((s["max"] if s["max"] is not None else m) - m)
        ax_r.barh(
            [v + offset for v in y], med, height=0.34, xerr=[lo, hi], hatch=hatch,
            color=[_COLOURS.get(policies[n]["variant"], "C7") for n in names],
            edgecolor="k", linewidth=0.4, label=f"per {_CLOCK_LABEL[clock]} second",
        )  # fmt: skip
    ax_r.axvline(1.0, color="k", lw=0.8)
    ax_r.set_yticks(y, names, fontsize=8)
    ax_r.invert_yaxis()
    ax_r.set_xlabel("goodput / oracle (median, min-max over repetitions)")
    ax_r.legend(fontsize=7, loc="lower right")

    x = list(range(len(phases)))
    for n in names:
        vals = [policies[n]["cpu"]["phases"][p]["goodput"]["median"] or 0.0 for p in phases]
        learning = not is_reference(n)
        ax_p.plot(
            x, vals, marker="o", lw=2.0 if n == "specctl" else (1.2 if learning else 0.8),
            ls="-" if learning else "--", label=n,
        )  # fmt: skip
    oracle = [
        sum(
            policies["static:" + out["oracle"]["cpu"]["arms"][p][c]]["cpu"]["phases"][p]["classes"][
                c
            ]["goodput"]["median"]
            or 0.0
            for c in classes
            if out["oracle"]["cpu"]["arms"][p][c]
        )
        for p in phases
    ]
    if any(oracle):
        ax_p.plot(x, oracle, color="k", lw=1.0, ls=":", marker="x", label="oracle")
    ax_p.set_xticks(x, phases)
    ax_p.set_ylabel("committed tokens per engine CPU second")
    ax_p.set_title("goodput per load phase (median)", fontsize=9)
    ax_p.legend(fontsize=6, ncol=2)

    learners = [n for n in names if not is_reference(n)]
    width = 0.8 / max(len(classes), 1)
    for i, c in enumerate(classes):
        shares = [policies[n]["off_share"].get(c) or 0.0 for n in learners]
        ax_o.bar([j + i * width for j in range(len(learners))], shares, width=width, label=c)
    ax_o.set_xticks(
        [j + 0.4 - width / 2 for j in range(len(learners))], learners, rotation=30, ha="right",
        fontsize=8,
    )  # fmt: skip
    ax_o.set_ylim(0, 1)
    ax_o.set_ylabel("share of request-rounds run off")
    ax_o.legend(fontsize=7)
    fig.suptitle(f"{out['workload']['name']}: policies on one vLLM engine")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_timeline(
    timeline: Sequence[Mapping[str, Any]],
    segments: Sequence[Mapping[str, Any]],
    classes: Sequence[str],
    arms: Sequence[str],
    path: Path,
    policy: str = "specctl",
) -> Path | None:
    """Per class, the learning policy's distribution over arms in the context of the
    current load (stacked, over time), and below, its decision stability: mode flips and
    total TV movement since the sidecar started, per class. Other policies' segments are
    shaded grey; the policy's measured windows are marked."""
    rows = [r for r in timeline if r["policy"] == policy and r["current"]]
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(
        len(classes) + 1, 1, figsize=(11, 2.0 * len(classes) + 2.6), sharex=True
    )
    colours = arm_colours(arms)
    mine_segments = sorted({r["segment"] for r in rows})
    for ax, c in zip(axes, classes, strict=False):
        for seg in mine_segments:
            part = [r for r in rows if r["class"] == c and r["segment"] == seg]
            if not part:
                continue
            t = [r["t"] for r in part]
            stack = [[r["probabilities"].get(a, 0.0) for r in part] for a in arms]
            ax.stackplot(t, stack, colors=[colours[a] for a in arms], step="post")
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"{c}\nP(arm)", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[a]) for a in arms]
    axes[0].legend(
        handles, list(arms), fontsize=7, ncol=len(arms), loc="lower left", bbox_to_anchor=(0, 1.0)
    )
    ax_s = axes[-1]
    for i, c in enumerate(classes):
        for j, seg in enumerate(mine_segments):
            part = [
                r
                for r in rows
                if r["class"] == c and r["segment"] == seg and r["mode_flips_total"] is not None
            ]
            t = [r["t"] for r in part]
            label = j == 0
            ax_s.plot(t, [r["mode_flips_total"] for r in part], color=f"C{i}",
                      label=f"{c}: mode flips" if label else None)  # fmt: skip
            ax_s.plot(t, [r["change_tv_total"] for r in part], color=f"C{i}", ls="--",
                      label=f"{c}: TV moved" if label else None)  # fmt: skip
    ax_s.set_ylabel("since the sidecar\n(re)started", fontsize=8)
    ax_s.set_xlabel("seconds since the benchmark started")
    ax_s.legend(fontsize=7, ncol=len(classes))
    for s in segments:
        start = s["started_s"]
        end = start + s["unmeasured_s"] + s["window_s"]
        for ax in axes:
            if s["policy"] != policy:
                ax.axvspan(start, end, color="0.9", lw=0)
            else:
                ax.axvspan(start + s["unmeasured_s"], end, color="k", alpha=0.07, lw=0)
        if s["policy"] == policy:
            ax_s.text(start, 0.98, s["phase"], fontsize=7, va="top",
                      transform=ax_s.get_xaxis_transform())  # fmt: skip
    fig.suptitle(
        f"{policy}: arm probabilities at the current load and decision stability "
        "(light grey: other policies; shaded: measured)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
