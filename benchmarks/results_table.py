"""Turn a `specctl bench --json` file into the README's Markdown results tables.

.venv/bin/python benchmarks/results_table.py benchmarks/results/bench.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REFERENCES = ("oracle", "static-off", "best-static")


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:.1%}" if pct else f"{x:.3f}"


def tables(data: dict[str, Any]) -> str:
    policies = data["policies"]
    names = [n for n in policies if n not in REFERENCES] + ["best-static", "static-off"]
    runs = list(next(iter(policies.values()))["runs"])
    lines = [
        "Goodput relative to the oracle (traffic-weighted over windows and classes):",
        "",
        "| run | " + " | ".join(names) + " |",
        "| --- |" + " ---: |" * len(names),
    ]
    for run in runs:
        cells = [_f(policies[n]["runs"][run]["goodput_vs_oracle"]) for n in names]
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    targets = [r for r in runs if r.startswith("targets/")]
    if targets:
        means = []
        for n in names:
            values = [policies[n]["runs"][r]["goodput_vs_oracle"] for r in targets]
            means.append(_f(sum(values) / len(values)))
        lines.append("| **mean over the nine targets** | " + " | ".join(means) + " |")
    lines += [
        "",
        "Goodput relative to no speculation, and where every arm loses (cells where the oracle"
        " ran `off`):",
        "",
        "| run | policy | vs no spec | vs best static | where spec loses: vs no spec "
        "| steps to adapt |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        for n in names[:-2]:
            r = policies[n]["runs"][run]
            adapt = ", ".join(
                f"{a['event']}: {'never' if a['steps_to_adapt'] is None else a['steps_to_adapt']}"
                for a in r["adaptation"]
            )
            lines.append(
                f"| {run} | {n} | {_f(r['goodput_vs_no_spec'])} | "
                f"{_f(r['goodput_vs_best_static'])} | "
                f"{_f(r['goodput_vs_no_spec_where_spec_loses'])} | {adapt or '-'} |"
            )
    return "\n".join(lines)


def merge(files: list[Path]) -> dict[str, Any]:
    """One bench JSON with every run of ``files`` (the same policies in each)."""
    merged: dict[str, Any] = {"policies": {}}
    for path in files:
        for name, p in json.loads(path.read_text())["policies"].items():
            merged["policies"].setdefault(name, {"runs": {}})["runs"].update(p["runs"])
    return merged


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(tables(merge([Path(a) for a in sys.argv[1:]])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
