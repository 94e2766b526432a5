"""The full-size policy benchmark behind the README's results table.

    .venv/bin/python benchmarks/policy_bench.py [--steps 20000] [--seed 0] [--out DIR]

Runs `specctl bench --scenario all` (every scenario, every registered policy,
and the oracle, no-speculation and best-static references) and writes
DIR/bench.json and DIR/plots/. CI runs the same code at a few hundred steps
(tests/test_sim_bench.py). Expect tens of minutes on two cores: the learning
policies dominate the time, the simulator itself runs thousands of steps a
second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from controller.cli import main as specctl


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenario", default="all")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    return specctl(
        [
            "bench",
            "--scenario", args.scenario,
            "--steps", str(args.steps),
            "--seed", str(args.seed),
            "--json", str(args.out / "bench.json"),
            "--plots", str(args.out / "plots"),
        ]
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
