"""Run every policy side by side: on simulated scenarios, or on a real vLLM engine.

Simulated (the default, ``--engine sim``): per policy and per class, goodput
relative to the oracle (the best arm per class for the current conditions),
to no speculation and to the best single static arm, regret over time, how
often each arm ran, and the steps to adapt after acceptance events.
Scenarios: targets (each of the study's targets), qwen3-8b, drift,
load-swing, long-tail, all; or `--table CSV` for your own sweep in the
appendix's columns; or `--scenario trace --trace PATH` to replay a trace
recorded from a real engine (docs/traces.md). The peers run as shipped and,
where they have a configuration to tune, tuned in hindsight
(``sglang-ema@tuned``).

Real engine (``--engine vllm --workload FILE``): one vLLM server with
specctl's scheduler and one sidecar process; every static arm pinned per
class through the sidecar's override, specctl and each peer (the sidecar
restarted with ``--policy NAME``), phase by phase, in rotated orders,
``--repetitions`` times. Goodput per engine CPU second and per wall second,
per class and overall; the oracle is the best static arm per class and phase
in hindsight from the same run. The workload file format is in
docs/engine-bench.md; ``--workload demo`` and ``--workload
testbed-three-classes`` are shipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specctl.sim import bench_cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=["sim", "vllm"],
        default="sim",
        help="sim: the simulator (default); vllm: a real vLLM engine, with --workload",
    )
    bench_cli.add_arguments(parser)
    g = parser.add_argument_group(
        "real engine (--engine vllm)",
        "--policies takes static (every static arm), static:<arm>, hindsight (each class "
        "pinned to its best static arm so far, all at once), specctl and the peers' "
        "names, and <policy>@<label>: the policy with the workload's "
        '[sidecar.params."<policy>@<label>"] over its own (default: the workload\'s '
        "bench.policies, else all); --json and --plots name "
        "where the JSON and the PNGs go (default: in --out); --seed seeds the load",
    )
    g.add_argument("--workload", help="a workload file (TOML), or a packaged one by name")
    g.add_argument("--repetitions", type=int, help="repetitions (default: the workload's)")
    g.add_argument(
        "--warmup-s", type=float, help="unmeasured seconds per learning segment (the workload's)"
    )
    g.add_argument(
        "--out", type=Path, default=Path("engine-bench-out"), help="results and logs directory"
    )
    g.add_argument(
        "--models",
        type=Path,
        default=Path.home() / ".cache" / "specctl" / "models",
        help="where built-in models are built and cached (~/.cache/specctl/models)",
    )
    g.add_argument("--port", type=int, default=0, help="vLLM HTTP port (0: a free one)")


def run(args: argparse.Namespace) -> int:
    if args.engine == "sim":
        if args.workload:
            print("specctl bench: --workload needs --engine vllm", file=sys.stderr)
            return 2
        return bench_cli.run(args)
    return run_engine(args)


def run_engine(args: argparse.Namespace) -> int:
    from specctl.bench.engine_bench import BenchOptions, EngineBench
    from specctl.bench.policy_names import policy_name_problem
    from specctl.bench.processes import ProcessError
    from specctl.bench.report import benchmark_json, format_report
    from specctl.bench.workload_file import load_workload
    from specctl.bench.workload_values import WorkloadError

    if not args.workload:
        print("specctl bench: --engine vllm needs --workload FILE", file=sys.stderr)
        return 2
    try:
        workload = load_workload(args.workload)
        policies = [p.strip() for p in args.policies.split(",") if p.strip()] or None
        for p in policies or []:
            problem = policy_name_problem(p, workload.arms())
            if problem:
                raise WorkloadError(f"--policies {p}: {problem}")
        if args.repetitions is not None and args.repetitions < 1:
            raise WorkloadError("--repetitions must be at least 1")
    except WorkloadError as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return 2

    started = time.monotonic()

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"[{time.monotonic() - started:7.1f}s] {line}", file=sys.stderr, flush=True)

    options = BenchOptions(
        out=args.out,
        models_dir=args.models,
        repetitions=args.repetitions,
        warmup_s=args.warmup_s,
        policies=policies,
        seed=args.seed,
        port=args.port,
        progress=progress,
    )
    try:
        raw = EngineBench(workload, options).run()
    except KeyboardInterrupt:
        print("\nspecctl bench: interrupted; stopped vLLM and the sidecar", file=sys.stderr)
        return 130
    except (ProcessError, FileNotFoundError, ValueError) as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return 1
    out = benchmark_json(workload, raw, args.seed)
    paths = write_outputs(out, args.out, args.json, args.plots)
    print(format_report(out))
    for p in paths:
        print(f"wrote {p}", file=sys.stderr)
    failed = sum(c["failed"] for s in out["segments"] for c in s["classes"].values())
    if failed:
        print(f"specctl bench: {failed} requests failed (see the segments)", file=sys.stderr)
    return 0


def write_outputs(
    out: dict,
    directory: Path,
    json_path: Path | None = None,
    plots: Path | None = None,
    timeline_name: str = "timeline.png",
) -> list[Path]:
    """The JSON, the report text and the PNGs (when matplotlib is installed): ``bench.png``
    (goodput per policy and phase, off shares) and the timeline of specctl's choices."""
    from specctl.bench.report import format_report

    directory.mkdir(parents=True, exist_ok=True)
    json_path = json_path or directory / "bench.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(out, indent=1))
    (directory / "report.txt").write_text(format_report(out) + "\n")
    written = [json_path, directory / "report.txt"]
    try:
        from specctl.bench.plots import plot_bench, plot_timeline
    except ImportError:
        return written
    plot_dir = plots or directory
    try:
        written.append(plot_bench(out, plot_dir / "bench.png"))
        timeline = plot_timeline(
            out["timeline"],
            out["segments"],
            [c["name"] for c in out["workload"]["classes"]],
            out["engine"]["arms"],
            plot_dir / timeline_name,
        )
        if timeline is not None:
            written.append(timeline)
    except ImportError:
        pass
    return written
