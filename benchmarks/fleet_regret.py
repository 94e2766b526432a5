"""Fleet regret: what learning costs 1, 4 and 16 replicas on the same total traffic, with
and without sharing evidence, in the simulator.

    .venv/bin/python benchmarks/fleet_regret.py [--steps 32000] [--exchange-s 1.0]
        [--out DIR] [--seeds 0,1,2]

Each replica is a simulated engine (:mod:`specctl.sim.engine`) with its own
sidecar book and specctl policy, through the production path, on the
``qwen3-8b`` scenario (four classes, three drafters, EAGLE-3 losing on math500
at every K). N replicas run ``--steps / N`` steps each, in lockstep,
so every fleet serves the same request-rounds. Regret is counted against the
oracle from the simulator's ground truth: a request-round of class c on arm
a that takes t seconds of engine time loses ``t * (g*_c - g_c,a)`` committed
tokens, where g is the arm's true goodput and g* the best arm's. The fleet's
regret is the sum over its replicas.

Exploration regret is what a fleet pays while it learns, above what it pays once
it has: the scenario is stationary, and a learned fleet pays a steady rate
(probes, residual uncertainty). It is measured as the fleet's regret over the
first eighth of the traffic (the learning window: 4,000 steps of 32,000) less
the rate it settles at (the slope of its cumulative regret over the second
eighth) times the window. One replica, and every sharing fleet, settles well
within the window. Without sharing, 16 replicas of 2,000 steps each are still
learning past it: theirs is a lower bound. The totals are printed too, and
for a sharing fleet the regret its replicas paid before their first merge,
which no store can save: no engine has reported yet.

Why a window, and the rate right after it: one replica learns for a few
thousand tokens of regret, and its rate then wanders between spans of a run
by more than that over 32,000 steps (seed 0: 6.5, 5.7, 5.7, 5.6 and 5.1 tokens
a step over the first and second eighth and the second, third and last
quarter). The total less the late rate (over the last quarter) times all
32,000 steps puts one replica's transient anywhere from 1,624 tokens (seed 1)
to 20,697 (seed 0), and every ratio to it with it; it is still printed, as
"whole-run transient". Over the second eighth the rate is the one learning
settled at, and its error counts 4,000 times, not 32,000. It still counts:
on seed 1 one replica pays 5.56 a step in the window and 6.11 after it, its
exploration regret comes out at 129 tokens and that seed's ratios are noise.

One run is one draw of the requests, the acceptance and the engines' arm
samples: each seed of ``--seeds`` runs every fleet, each fleet's regret is
divided by the same seed's one replica, and the median over the seeds is
printed with each seed's ratio.

Sharing runs the code the sidecars' store runs, in process: every
``--exchange-s`` seconds of engine time (a round of the store, 1 s by default
as ``fleet.publish_interval_s``; 107 steps of this scenario) each replica's own
evidence is encoded as a fleet entry (:mod:`specctl.sidecar.fleet_entry`),
read back and checked, the others' latest are summed and merged into its book
(:meth:`~specctl.sidecar.book.PolicyBook.merge_shared`), and its engine gets
its sidecar's new policy. The rounds are paced as the store paces them (the
first at a tenth of the interval, then after waits that grow with the time
since the start up to it), and at each the
replicas take turns in a random order, as rounds out of phase do. A real
Redis round trip per round would add wall time to the benchmark and change
nothing that is merged, so none is made. The goal: 16 sharing replicas pay no
more than 2x the regret of one replica (without sharing, up to 16x).

Prints a table per seed and the ratios per seed with their median, and writes
DIR/fleet_regret.json (every run of every seed, with its curve) and
DIR/fleet_regret.png (the median ratios by replicas; the first seed's curves).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specctl.policy.registry import make_policy
from specctl.policy.shared import SharedEvidence, sum_acceptance, sum_cost
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.fleet_entry import Entry, EntryHeader, decode_entry, encode_entry
from specctl.sidecar.fleet_store import FIRST_ROUND_SHARE, round_wait
from specctl.sim.engine import InProcessLink, SimulatedEngine, World
from specctl.sim.scenario import Scenario, build_scenarios

SCENARIO = "qwen3-8b"
REPLICAS = (1, 4, 16)
MAX_ENTRY_BYTES = 4 * 1024 * 1024
# fleet steps between the points of a run's regret curve
CURVE_TRAFFIC = 64
# the learning window, and the end of the span the settled rate is fitted over (from the
# window's end), as shares of the traffic
LEARNING_SHARE = 0.125
SETTLED_UNTIL = 0.25


@dataclass
class Replica:
    """One simulated engine and its sidecar's book."""

    world: World
    book: PolicyBook
    link: InProcessLink
    engine: SimulatedEngine

    def regret(self) -> float:
        """Committed tokens lost to the oracle so far (expected, from the ground truth)."""
        w = self.world
        seconds = w.cost * (w.base_step_time_s / w.batch_size)  # [class, arm] per round
        best = w.goodput.max(axis=1, keepdims=True)
        lost = seconds * (best - w.goodput)
        return float((self.engine.record.rounds * lost).sum())


def make_replica(scenario: Scenario, seed: int, index: int, report_every: int) -> Replica:
    world = World(scenario, np.random.default_rng([seed, index, 0]))
    book = PolicyBook(
        make_policy("specctl", {}), max_classes=max(64, len(scenario.model.classes) + 1)
    )
    link = InProcessLink(
        book, scenario.model.drafters, engine_id=f"sim-{index}", report_every=report_every
    )
    engine = SimulatedEngine(world, link, seed=seed * 1000 + index)
    return Replica(world, book, link, engine)


def publish(replica: Replica, index: int) -> SharedEvidence:
    """The replica's own evidence as its sidecar writes it to the store, and as the
    others read it back: encoded as an entry, decoded and checked."""
    evidence = replica.book.contribution()
    assert evidence is not None
    header = EntryHeader(f"sim-{index}", f"instance-{index}", "sim-pool", "sim-model", 0.0)
    data = encode_entry(Entry(header, evidence))
    return decode_entry(data, max_bytes=MAX_ENTRY_BYTES).evidence


def merge(replica: Replica, others: list[SharedEvidence]) -> None:
    """The replica merges the sum of the others' latest entries; its engine gets the
    policy its sidecar then pushes."""
    shared = SharedEvidence(
        sum_acceptance([e.acceptance for e in others if e.acceptance is not None]),
        sum_cost([e.cost for e in others if e.cost is not None]),
    )
    replica.book.merge_shared(shared)
    replica.link.refresh()


def round_steps(steps: int, exchange_steps: int) -> list[int]:
    """The steps at which the store's rounds come, as FleetStore.run paces them: the first
    at a tenth of the interval (the latest the store's random first round comes), then
    after the waits of :func:`~specctl.sidecar.fleet_store.round_wait`."""
    out, t = [], exchange_steps * FIRST_ROUND_SHARE
    while t < steps:
        out.append(min(steps, max(1, round(t))))
        t += round_wait(t, float(exchange_steps))
    return sorted(set(out))


def run_fleet(
    scenario: Scenario,
    replicas: int,
    *,
    share: bool,
    total_steps: int,
    exchange_steps: int,
    seed: int,
    report_every: int,
) -> dict[str, Any]:
    """One fleet over the total traffic; its regret over time and at the end.

    At each round the replicas take their turns in a random order, each writing its
    own entry and then merging the others' latest: as rounds out of phase do, a
    replica reads some entries of this round and some of the previous one.
    """
    fleet = [make_replica(scenario, seed, i, report_every) for i in range(replicas)]
    steps = total_steps // replicas
    rounds = set(round_steps(steps, exchange_steps))
    order = np.random.default_rng([seed, replicas, 2])
    entries: dict[int, SharedEvidence] = {}
    curve: list[tuple[int, float]] = [(0, 0.0)]
    every = max(1, CURVE_TRAFFIC // replicas)
    before_first_merge: float | None = None
    started = time.perf_counter()
    for step in range(1, steps + 1):
        for r in fleet:
            r.engine.step()
        if share and step in rounds:
            if before_first_merge is None:
                before_first_merge = sum(r.regret() for r in fleet)
            for i in order.permutation(replicas).tolist():
                entries[i] = publish(fleet[i], i)
                merge(fleet[i], [e for j, e in entries.items() if j != i])
        if step % every == 0 or step == steps:
            curve.append((step * replicas, sum(r.regret() for r in fleet)))
    for r in fleet:
        r.link.flush()
    return {
        "replicas": replicas,
        "sharing": share,
        "steps_per_replica": steps,
        "regret_tokens": sum(r.regret() for r in fleet),
        "regret_before_first_merge_tokens": before_first_merge,
        "curve": curve,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def slope(run: dict[str, Any], start: float, end: float) -> float:
    """Regret per step of traffic over ``[start, end]``: the least-squares slope of the
    run's cumulative regret there."""
    curve = np.array(run["curve"])
    span = curve[(curve[:, 0] >= start) & (curve[:, 0] <= end)]
    return float(np.polyfit(span[:, 0], span[:, 1], 1)[0])


def explore(run: dict[str, Any], total_steps: int) -> None:
    """Add the run's exploration regret (module docstring) and the former whole-run
    transient."""
    curve = np.array(run["curve"])
    window = LEARNING_SHARE * total_steps
    settled = slope(run, window, SETTLED_UNTIL * total_steps)
    run["learning_window_steps"] = window
    run["settled_regret_per_step"] = settled
    run["regret_in_window_tokens"] = float(np.interp(window, curve[:, 0], curve[:, 1]))
    run["exploration_regret_tokens"] = run["regret_in_window_tokens"] - settled * window
    late = slope(run, 0.75 * total_steps, total_steps)
    run["late_regret_per_step"] = late
    run["whole_run_transient_tokens"] = run["regret_tokens"] - late * total_steps


def seed_table(results: list[dict[str, Any]], seed: int) -> list[str]:
    """One seed's fleets: exploration regret, settled rate, total and the former whole-run
    transient, each x one replica."""
    one = results[0]
    lines = [
        f"seed {seed}: tokens (x one replica); settled: regret per step after the learning window",
        f"{'replicas':>9} {'sharing':>8} {'exploration':>18} {'settled':>8} {'total':>17}"
        f" {'before 1st merge':>17} {'whole-run transient':>21}",
    ]
    for run in results:
        e, t = run["exploration_regret_tokens"], run["regret_tokens"]
        w = run["whole_run_transient_tokens"]
        first = run.get("regret_before_first_merge_tokens")
        lines.append(
            f"{run['replicas']:>9} {'yes' if run['sharing'] else 'no':>8} "
            f"{e:>9.0f} ({e / one['exploration_regret_tokens']:5.2f}x) "
            f"{run['settled_regret_per_step']:>8.2f} "
            f"{t:>9.0f} ({t / one['regret_tokens']:4.2f}x) "
            f"{'' if first is None else f'{first:.0f}':>17} "
            f"{w:>11.0f} ({w / one['whole_run_transient_tokens']:6.2f}x)"
        )
    return lines


def summary_table(by_seed: dict[int, list[dict[str, Any]]]) -> list[str]:
    """Per fleet: each seed's ratio to that seed's one replica, and the median."""
    seeds = sorted(by_seed)
    lines = [
        f"ratios to one replica of the same seed (seeds {', '.join(map(str, seeds))}; median):"
    ]
    for measure, label in (
        ("exploration_regret_tokens", "exploration regret"),
        ("regret_tokens", "total regret"),
        ("whole_run_transient_tokens", "whole-run transient (the former measure)"),
    ):
        lines.append(f"  {label}:")
        for replicas in REPLICAS[1:]:
            for share in (False, True):
                ratios = []
                for seed in seeds:
                    runs = by_seed[seed]
                    run = next(
                        r for r in runs if r["replicas"] == replicas and r["sharing"] == share
                    )
                    ratios.append(run[measure] / runs[0][measure])
                each = " ".join(f"{r:5.2f}x" for r in ratios)
                lines.append(
                    f"  {replicas:>4} replicas, {'sharing' if share else 'alone  '}: {each}"
                    f"   median {float(np.median(ratios)):.2f}x"
                )
    return lines


def write_plot(by_seed: dict[int, list[dict[str, Any]]], path: Path, exchange_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    first = min(by_seed)
    for share, style in ((False, "--"), (True, "-")):
        label = "sharing evidence" if share else "each replica alone"
        ratios = [
            [
                r["exploration_regret_tokens"] / runs[0]["exploration_regret_tokens"]
                for r in runs
                if r["sharing"] == share or r["replicas"] == 1
            ]
            for runs in by_seed.values()
        ]
        left.plot(list(REPLICAS), np.median(ratios, axis=0), style, marker="o", label=label)
        for r in by_seed[first]:
            if r["replicas"] == 1 and share:
                continue
            if r["sharing"] != share and r["replicas"] > 1:
                continue
            xs, ys = zip(*r["curve"], strict=True)
            right.plot(xs, ys, style, label=f"{r['replicas']} replicas, {label}")
    left.axhline(2.0, color="grey", lw=0.8, ls=":", label="2x one replica")
    left.set_xscale("log", base=2)
    left.set_xticks(list(REPLICAS), [str(n) for n in REPLICAS])
    left.set_xlabel("replicas (same total traffic)")
    left.set_ylabel(f"exploration regret, x one replica (median of {len(by_seed)} seeds)")
    left.legend()
    right.set_xlabel("steps served by the fleet")
    right.set_ylabel(f"cumulative fleet regret (tokens, seed {first})")
    right.legend(fontsize=7)
    fig.suptitle(f"specctl on {SCENARIO}, a round every {exchange_s:g} s of engine time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` -> [0, 1, 2]."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of seeds"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct non-negative seeds")
    return seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=32000, help="total steps of the fleet")
    parser.add_argument(
        "--exchange-s",
        type=float,
        default=1.0,
        help="seconds of engine time between rounds (fleet.publish_interval_s)",
    )
    parser.add_argument("--report-every", type=int, default=8)
    parser.add_argument(
        "--seeds", type=parse_seeds, default=[0, 1, 2], help="comma-separated, e.g. 0,1,2"
    )
    parser.add_argument("--out", type=Path, default=Path("fleet-out"))
    args = parser.parse_args()
    (scenario,) = build_scenarios(SCENARIO, args.steps)
    step_s = scenario.model.base_step_time_s(scenario.batch)
    exchange_steps = max(1, round(args.exchange_s / step_s))
    print(
        f"{SCENARIO}: batch {scenario.batch}, a plain step {1000 * step_s:.1f} ms: a round "
        f"every {args.exchange_s:g} s of engine time is every {exchange_steps} steps",
        file=sys.stderr,
    )
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for seed in args.seeds:
        results = []
        for replicas in REPLICAS:
            for share in (False, True) if replicas > 1 else (False,):
                run = run_fleet(
                    scenario,
                    replicas,
                    share=share,
                    total_steps=args.steps,
                    exchange_steps=exchange_steps,
                    seed=seed,
                    report_every=args.report_every,
                )
                explore(run, args.steps)
                run["seed"] = seed
                results.append(run)
                print(
                    f"  seed {seed}, {replicas:>2} replicas, {'shared' if share else 'alone '}: "
                    f"regret {run['regret_tokens']:.0f} tokens ({run['wall_s']} s)",
                    file=sys.stderr,
                )
        by_seed[seed] = results
        print("\n".join(seed_table(results, seed)), flush=True)
    print(
        f"regret vs the oracle on {SCENARIO}, {args.steps} steps of total traffic, a round "
        f"every {args.exchange_s:g} s; exploration: the regret over the first "
        f"{LEARNING_SHARE * args.steps:.0f} steps less the rate settled at after them"
    )
    print("\n".join(summary_table(by_seed)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet_regret.json").write_text(
        json.dumps(
            {
                "scenario": SCENARIO,
                "steps": args.steps,
                "exchange_s": args.exchange_s,
                "exchange_steps": exchange_steps,
                "seeds": args.seeds,
                "runs": [run for seed in args.seeds for run in by_seed[seed]],
            },
            indent=1,
        )
    )
    write_plot(by_seed, args.out / "fleet_regret.png", args.exchange_s)
    print(f"wrote {args.out}/fleet_regret.json and fleet_regret.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
