"""Drive a running sidecar with a simulated engine, over the real gRPC stream.

The engine samples arms from the policies the sidecar pushes and reports
acceptance drawn from the scenario's table, as a vLLM engine with the
specctl scheduler would. Events change the world mid-run:

  --event 3000:accept:math500=0.5   class math500's acceptance halves at step 3000
  --event 6000:accept:math500=1     and recovers
  --event 4000:load=128             128 concurrent requests from step 4000
  --event 5000:mix:gsm8k=3,mbpp=1   new requests follow this class mix
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", required=True, help="the sidecar: unix:///path or host:port")
    parser.add_argument(
        "--scenario", default="qwen3-8b", help="a scenario of specctl bench (default qwen3-8b)"
    )
    parser.add_argument("--target", help="the target, for scenarios with several")
    parser.add_argument("--table", help="a sweep CSV in the appendix's columns")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=0.0, help="steps per second (0: flat out)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-id", default="sim-0")
    parser.add_argument(
        "--event", action="append", default=[], metavar="STEP:KIND...", help="see above"
    )


def parse_event(text: str) -> object:
    """``3000:accept:math500=0.5``, ``4000:load=128`` or ``5000:mix:a=3,b=1``."""
    from specctl.sim.scenario import AcceptanceChange, LoadChange, MixChange

    step_text, _, rest = text.partition(":")
    try:
        step = int(step_text)
        if rest.startswith("accept:"):
            cls, _, value = rest.removeprefix("accept:").partition("=")
            return AcceptanceChange(step, cls, float(value))
        if rest.startswith("load="):
            return LoadChange(step, int(rest.removeprefix("load=")))
        if rest.startswith("mix:"):
            weights = {}
            for part in rest.removeprefix("mix:").split(","):
                cls, _, value = part.partition("=")
                weights[cls] = float(value)
            return MixChange(step, weights)
    except ValueError as exc:
        raise ValueError(f"--event {text!r}: {exc}") from None
    raise ValueError(
        f"--event {text!r}: expected STEP:accept:CLASS=SCALE, STEP:load=BATCH "
        "or STEP:mix:CLASS=W,..."
    )


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from specctl.sim.grpc_link import simulate_against
    from specctl.sim.scenario import build_scenarios

    try:
        scenario = build_scenarios(args.scenario, args.steps, args.table, args.target)[0]
        events = [parse_event(e) for e in args.event]
        if events:
            scenario = scenario.with_events([*scenario.events, *events])  # type: ignore[list-item]
    except ValueError as exc:
        print(f"specctl simulate: {exc}", file=sys.stderr)
        return 2

    def progress(step: int) -> None:
        print(f"step {step}/{scenario.steps}", file=sys.stderr, flush=True)

    record, link = simulate_against(
        args.address, scenario, seed=args.seed, rate=args.rate, engine_id=args.engine_id,
        progress=progress,
    )  # fmt: skip
    state = link.client.state()
    print(
        f"{scenario.name} ({scenario.model.target}): {scenario.steps} steps, "
        f"{state.reports_sent_total} reports sent, {state.reports_rejected_total} rejected, "
        f"{state.steps_dropped_total} steps dropped, last policy version {state.policy_version}"
    )
    for c, cls in enumerate(record.classes):
        time_s = float(record.time_s[:, c].sum())
        goodput = float(record.tokens[:, c].sum()) / time_s if time_s > 0 else 0.0
        top = int(np.argmax(record.rounds[c]))
        share = record.rounds[c, top] / max(int(record.rounds[c].sum()), 1)
        print(f"  {cls:<16} {goodput:10.1f} tok/s   mostly {record.arms[top]} ({share:.0%})")
    return 0
