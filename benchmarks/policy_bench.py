"""The full-size policy benchmark behind the results tables of docs/simulator.md.

    .venv/bin/python benchmarks/policy_bench.py [--out DIR] [--seed 0]

Runs `specctl bench` on every scenario (every registered policy, the peers
both as shipped and tuned in hindsight, and the oracle, no-speculation and
best-static references): each target and drift
and load-swing at 20,000 steps, the 100-class long tail at 10,000 steps with
a report every 32 steps (the learning policies' cost grows with the number of
classes). Writes DIR/<run>.json and DIR/plots/, then prints the results
tables. Each run is seeded on its own, so runs can also go in parallel. CI
runs the same code at a few hundred steps (tests/unit/test_sim_bench.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from results_table import merge, tables  # benchmarks/, the script's own directory

from specctl.cli import main as specctl
from specctl.sim.scenario import build_scenarios, short_name

RUNS: list[tuple[str, list[str]]] = [
    *[
        (f"targets_{short_name(s.model.target)}", ["--scenario", "targets", "--target",
                                                   short_name(s.model.target), "--steps", "20000"])
        for s in build_scenarios("targets", 100)
    ],
    ("drift", ["--scenario", "drift", "--steps", "20000"]),
    ("load-swing", ["--scenario", "load-swing", "--steps", "20000"]),
    ("long-tail", ["--scenario", "long-tail", "--steps", "10000", "--report-every", "32"]),
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    files = []
    for name, run_args in RUNS:
        path = args.out / f"{name}.json"
        code = specctl(
            ["bench", *run_args, "--seed", str(args.seed), "--json", str(path),
             "--plots", str(args.out / "plots")]
        )  # fmt: skip
        if code != 0:
            return code
        files.append(path)
    print(tables(merge(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
