"""Turn a `specctl bench --json` file into the Markdown results tables of docs/simulator.md.

.venv/bin/python benchmarks/results_table.py benchmarks/results/bench.json

Each peer gets a column as shipped (`sglang-ema`) and, where it has one, a
column tuned in hindsight (`sglang-ema@tuned`). Files written before the two
variants existed ran the tunable peers tuned in hindsight under their bare
names; they are read as `NAME@tuned`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REFERENCES = ("oracle", "static-off", "best-static")
TUNED_SUFFIX = "@tuned"
TUNABLE = ("sglang-ema", "trtllm-threshold", "vllm-batch-table")


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:.1%}" if pct else f"{x:.3f}"


def _order(policies: dict[str, Any]) -> list[str]:
    """The policies in the files' order, each ``@tuned`` column right after its as-shipped
    one, then the references that have a column (best-static, static-off)."""
    names = [n for n in policies if n not in REFERENCES]
    first = {n: i for i, n in enumerate(names)}
    names.sort(
        key=lambda n: (first.get(n.removesuffix(TUNED_SUFFIX), first[n]), n.endswith(TUNED_SUFFIX))
    )
    return names + [n for n in ("best-static", "static-off") if n in policies]


def _cell(policies: dict[str, Any], name: str, run: str, key: str) -> float | None:
    r = policies[name]["runs"].get(run)
    return None if r is None else r[key]


def tables(data: dict[str, Any]) -> str:
    policies = data["policies"]
    names = _order(policies)
    runs = list(dict.fromkeys(r for p in policies.values() for r in p["runs"]))
    lines = [
        "Goodput relative to the oracle (traffic-weighted over windows and classes);"
        " `NAME` as shipped (the engine's configured K, the system's own defaults),"
        " `NAME@tuned` tuned in hindsight from the same sweep:",
        "",
        "| run | " + " | ".join(names) + " |",
        "| --- |" + " ---: |" * len(names),
    ]
    for run in runs:
        cells = [_f(_cell(policies, n, run, "goodput_vs_oracle")) for n in names]
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    targets = [r for r in runs if r.startswith("targets/")]
    if targets:
        means = []
        for n in names:
            values = [_cell(policies, n, r, "goodput_vs_oracle") for r in targets]
            kept = [v for v in values if v is not None]
            means.append(_f(sum(kept) / len(kept) if len(kept) == len(values) else None))
        lines.append(f"| **mean over the {len(targets)} targets** | " + " | ".join(means) + " |")
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
        for n in names:
            r = policies[n]["runs"].get(run)
            if n in REFERENCES or r is None:
                continue
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
    """One bench JSON with every run of ``files`` (a policy missing from a file gets "-")."""
    merged: dict[str, Any] = {"policies": {}}
    for path in files:
        for name, p in json.loads(path.read_text())["policies"].items():
            if "variant" not in p and name in TUNABLE:
                name += TUNED_SUFFIX  # written before the as-shipped variant existed
            entry = merged["policies"].setdefault(name, {"runs": {}})
            entry["runs"].update(p["runs"])
            if "variant" in p:
                entry["variant"] = p["variant"]
    return merged


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(tables(merge([Path(a) for a in sys.argv[1:]])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
