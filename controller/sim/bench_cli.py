"""Run every policy side by side on a simulated scenario and report goodput.

Per policy and per class: goodput relative to the oracle (the best arm per
class for the current conditions), to no speculation and to the best single
static arm, regret over time, how often each arm ran, and the steps to adapt
after acceptance events. Scenarios: targets (each of the study's targets),
qwen3-8b, drift, load-swing, long-tail, all; or `--table CSV` for your own
sweep in the appendix's columns; or `--scenario trace --trace PATH` to replay
a trace recorded from a real engine (docs/traces.md).

The peers run as shipped (``sglang-ema``: the engine's configured K and the
system's own defaults) and, where they have a configuration to tune, tuned in
hindsight from the same sweep (``sglang-ema@tuned``); see
:mod:`specctl.sim.bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        default="all",
        help="targets, qwen3-8b, drift, load-swing, long-tail, all (default), "
        "table (with --table), or trace (with --trace)",
    )
    parser.add_argument("--steps", type=int, default=20_000, help="engine steps per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--policies",
        default="",
        help="comma-separated policies (default: every registered one, each peer as "
        "shipped and, where it has a configuration to tune, as NAME@tuned, tuned in "
        "hindsight, e.g. sglang-ema,sglang-ema@tuned; static:ARM runs one arm); "
        "oracle, static-off and best-static always run",
    )
    parser.add_argument("--table", type=Path, help="a sweep CSV in the appendix's columns")
    parser.add_argument("--target", help="only this target (e.g. qwen3-8b)")
    parser.add_argument(
        "--trace",
        action="append",
        default=[],
        metavar="PATH",
        help="with --scenario trace: a recorded trace (a Parquet file, a directory of "
        "segments, or a packaged trace's name); repeat for one run per trace. See "
        "docs/traces.md",
    )
    parser.add_argument("--report-every", type=int, default=8, help="steps per step report")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plots", type=Path, help="write PNG plots into this directory")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="after the table, per class: each learning policy's tokens per round and "
        "round cost as it believes them at the run's end, next to the truth, and what "
        "its token and cost estimates each lose (always in the JSON as 'explained')",
    )


def run(args: argparse.Namespace) -> int:
    from specctl.sim.bench import benchmark_json, run_scenario
    from specctl.sim.bench_policies import check_policy_name, default_policies
    from specctl.sim.scenario import build_scenarios

    if args.steps < 100:
        print("specctl bench: --steps must be at least 100", file=sys.stderr)
        return 2
    try:
        scenarios = build_scenarios(
            args.scenario, args.steps, args.table, args.target, trace=args.trace
        )
        policies = (
            [p.strip() for p in args.policies.split(",") if p.strip()]
            if args.policies
            else default_policies()
        )
        for name in policies:
            check_policy_name(name)
    except ValueError as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return 2

    started = time.monotonic()

    def progress(line: str) -> None:
        if not args.quiet:
            elapsed = time.monotonic() - started
            end = "\r" if sys.stderr.isatty() else "\n"
            print(f"[{elapsed:6.1f}s] {line:<70}", end=end, file=sys.stderr, flush=True)

    results = []
    for scenario in scenarios:
        try:
            results.append(
                run_scenario(
                    scenario,
                    policies,
                    seed=args.seed,
                    report_every=args.report_every,
                    progress=progress,
                )
            )
        except ValueError as exc:
            print(f"specctl bench: {scenario.name}: {exc}", file=sys.stderr)
            return 2
    if not args.quiet and sys.stderr.isatty():
        print(file=sys.stderr)
    out = benchmark_json(args.scenario, results, steps=args.steps, seed=args.seed)
    print(format_table(out))
    if args.explain:
        from specctl.sim.bench_explain import format_readings

        for result in results:
            for name, readings in result.explained.items():
                print()
                print(format_readings(name, result.scenario.name, readings))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    if args.plots:
        from specctl.sim.plots import write_plots

        for path in write_plots(results, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def format_table(out: dict) -> str:
    """One line per (scenario run, policy): the headline ratios, and the policy's variant."""
    head = f"{'policy':<24} {'vs oracle':>9} {'vs off':>7}"
    lines = [f"{'run':<34} {head} {'vs static':>9}  variant"]
    for name, p in out["policies"].items():
        for run_name, r in p["runs"].items():
            lines.append(
                f"{run_name:<34} {name:<24} {_fmt(r['goodput_vs_oracle']):>9} "
                f"{_fmt(r['goodput_vs_no_spec']):>7} {_fmt(r['goodput_vs_best_static']):>9}  "
                f"{p['variant']}"
            )
    lines.append("")
    lines.append(f"{'mean over runs':<34} {head}")
    for name, p in out["policies"].items():
        lines.append(
            f"{'':<34} {name:<24} {_fmt(p['goodput_vs_oracle']):>9} "
            f"{_fmt(p['goodput_vs_no_spec']):>7}"
        )
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
