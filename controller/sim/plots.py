"""PNG plots of a benchmark: goodput vs the oracle per policy, and over time."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from specctl.sim.bench import ScenarioResult
from specctl.sim.bench_policies import policy_variant

# bar colour by variant: ours, peers as shipped, peers tuned in hindsight, references
_COLOURS = {"learning": "C0", "as-shipped": "C1", "tuned-in-hindsight": "C7", "reference": "C2"}


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9.\-]+", "_", name.lower()).strip("_")


def write_plots(results: Sequence[ScenarioResult], directory: Path) -> list[Path]:
    """Per scenario run: a bar chart of goodput vs oracle and a regret-over-time chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for r in results:
        names = list(r.summary)
        values = [r.summary[n]["goodput_vs_oracle"] or 0.0 for n in names]
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.barh(names, values, color=[_COLOURS[policy_variant(n)] for n in names])
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlim(min(0.5, min(values) - 0.05), 1.05)
        ax.set_xlabel("goodput / oracle goodput")
        ax.set_title(f"{r.scenario.name}: {r.scenario.model.target}")
        ax.invert_yaxis()
        fig.tight_layout()
        path = directory / f"{_slug(r.scenario.name)}_goodput.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

        fig, ax = plt.subplots(figsize=(8, 4))
        for n in names:
            curve = r.summary[n]["regret_over_time"]
            ax.plot(
                [p["step"] for p in curve],
                [p["goodput_vs_oracle"] for p in curve],
                label=n,
                lw=2.0 if n == "specctl" else 1.0,
            )
        for e in r.scenario.events:
            ax.axvline(e.step, color="k", lw=0.3, alpha=0.3)
        ax.set_xlabel("engine step")
        ax.set_ylabel("goodput / oracle (window)")
        ax.set_title(f"{r.scenario.name}: over time")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = directory / f"{_slug(r.scenario.name)}_over_time.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
