"""Fleet regret: what learning costs 1, 4 and 16 replicas on the same total traffic, with
and without sharing evidence, in the simulator.

    .venv/bin/python benchmarks/fleet_regret.py [--steps 32000] [--exchange-s 1.0]
        [--seeds 0,1,2] [--jobs 1] [--out DIR]

Each replica is a simulated engine (:mod:`specctl.sim.engine`) with its own
sidecar book and specctl policy, through the production path, on the
``qwen3-8b`` scenario (four classes, three drafters, EAGLE-3 losing on math500
at every K). N replicas run ``--steps / N`` steps each, in lockstep,
so every fleet serves the same request-rounds. Regret is counted against the
oracle from the simulator's ground truth: a request-round of class c on arm
a that takes t seconds of engine time loses ``t * (g*_c - g_c,a)`` committed
tokens, where g is the arm's true goodput and g* the best arm's. The fleet's
regret is the sum over its replicas.

Exploration regret is what a fleet pays because it starts knowing nothing: its
regret over the whole run started cold (every policy at its prior) less its
regret over the same run started warm, every replica's policy restored from what
one replica learned in ``--steps`` steps of the scenario, as a restarted sidecar
restores its snapshot (:mod:`specctl.sidecar.snapshot`: captured, encoded,
decoded, restored). The scenario is stationary: the warm fleet pays only the
steady rate of a fleet that has learned (probes, the control share, residual
uncertainty), so what the cold fleet pays above it is what learning cost. The
warm state is learned on streams of its own (a replica index no fleet has), so
it knows nothing of the draws the fleets then see.

Why paired: the regret a learned replica pays wanders between spans of a run by
more than what its learning costs, so a steady rate fitted on the cold run
itself and subtracted leaves an error as large as the quantity. The cold and the
warm run of a fleet share every random stream instead, and their difference
cancels what the streams put in both. The world draws with
``independent_draws``: the n-th arriving request's class and length, each step's
acceptance uniforms and its step-time noise come from streams of their own,
drawn alike whatever the arms run. Each engine draws one uniform a step for its
arm samples from its own stream, the policy's posterior draws are fixed by its
seed, and the order of the replicas in a round comes from the seed. What differs
is the policy's knowledge, and with it the arms run and so when requests finish.
That is also what the pairing cannot cancel: once the two runs' policies choose
differently, each step's draws fall on other requests, their evidence parts, and
the rate each then pays wanders on its own. The difference carries that wander
for the rest of the run, so one replica's exploration regret still moves by
thousands of tokens between seeds, and with it every ratio of a seed.

A warm sharing fleet pools its replicas' restored states: N copies of what one
replica learned, more than a fleet holds after the run's traffic. It settles
below one warm replica's rate, and its cold run approaches that rate still at the
end: a sharing fleet's exploration regret is counted against a steady state it
does not reach within the traffic.

Over the whole run, because a fleet that still learns late keeps adding to the
difference: the table gives the rate the difference grows at over the last
quarter of the traffic (tokens per step of traffic), which is about 0 once the
cold fleet pays what the warm one pays. A fleet whose late rate is clearly above
0 is still learning when the traffic ends, and its exploration regret is a lower
bound. For a sharing fleet the table also gives the exploration regret paid
before the first merge, which no store can save: no engine has reported yet.

One run is one draw of the requests, the acceptance and the engines' arm
samples: each seed of ``--seeds`` runs every fleet cold and warm, each fleet's
exploration regret is divided by the same seed's one replica's, and the median
of these ratios over the seeds is printed with each seed's and the pooled ratio
(the fleet's sum over the seeds over one replica's sum), which a seed where one
replica learns little moves less than it moves that seed's ratio.

Sharing runs the code the sidecars' store runs, in process: every
``--exchange-s`` seconds of engine time (a round of the store, 1 s by default
as ``fleet.publish_interval_s``; 107 steps of this scenario) each replica's own
evidence is encoded as a fleet entry (:mod:`specctl.sidecar.fleet_entry`),
read back and checked, the others' latest are summed and merged into its book
(:meth:`~specctl.sidecar.book.PolicyBook.merge_shared`), and its engine gets
its sidecar's new policy. The rounds are paced as the store paces them (the
first at a tenth of the interval, then after waits that grow with the time
since the replica's first report up to it), and at each the
replicas take turns in a random order, as rounds out of phase do. A real
Redis round trip per round would add wall time to the benchmark and change
nothing that is merged, so none is made. The goal: 16 sharing replicas pay no
more than 2x the exploration regret of one replica (without sharing, up to 16x).

A second measure takes one mark for every fleet: its regret started cold less one
learned replica's regret on the same traffic (one replica started warm). It asks
what a fleet pays above what a single sidecar that has learned would pay serving
all of the traffic. A sharing fleet that ends better than one learned replica (its
replicas pool more evidence than any one holds) has gained from learning, not paid,
and this measure says so with a number below 0; the first measure counts that gain
as learning still to do, against the fleet's own pooled steady state.

The runs of all seeds are independent once each seed's warm state is learned;
``--jobs`` runs them in that many processes. Prints a table per seed and the
ratios per seed with their median and pooled ratio, and writes
DIR/fleet_regret.json (every fleet of every seed, cold and warm, with their
curves) and DIR/fleet_regret.png (the median ratios by replicas; the first
seed's exploration regret over the traffic).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from specctl.policy.base import Policy
from specctl.policy.registry import make_policy
from specctl.policy.shared import SharedEvidence, sum_acceptance, sum_cost
from specctl.sidecar import snapshot
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.fleet_entry import Entry, EntryHeader, decode_entry, encode_entry
from specctl.sidecar.fleet_store import EVIDENCE_POLL_SHARE, FIRST_ROUND_SHARE, round_wait
from specctl.sim.engine import InProcessLink, SimulatedEngine, World
from specctl.sim.scenario import Scenario, build_scenarios

SCENARIO = "qwen3-8b"
REPLICAS = (1, 4, 16)
MAX_ENTRY_BYTES = 4 * 1024 * 1024
# fleet steps between the points of a run's regret curve
CURVE_TRAFFIC = 64
# the replica index of the run the warm state is learned on: no fleet has it, so its
# streams are its own
TEACHER_INDEX = 999
# the share of the traffic, at its end, over which the exploration regret's late rate is
# measured
LATE_SHARE = 0.25

R = TypeVar("R")


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


def make_replica(
    scenario: Scenario,
    seed: int,
    index: int,
    report_every: int,
    warm: bytes | None = None,
    params: Mapping[str, Any] | None = None,
) -> Replica:
    """Replica ``index`` of a fleet of this seed: its streams depend on the seed and the
    index alone. ``warm``: an encoded snapshot its book starts from (None: the prior);
    ``params``: specctl's parameters (None: its defaults)."""

    def fresh_policy() -> Policy:
        return make_policy("specctl", dict(params or {}))

    world = World(scenario, np.random.default_rng([seed, index, 0]), independent_draws=True)
    book = PolicyBook(fresh_policy(), max_classes=max(64, len(scenario.model.classes) + 1))
    if warm is not None:
        problem = snapshot.restore(book, snapshot.decode(warm), fresh_policy)
        if problem is not None:
            raise RuntimeError(f"the warm state was not restored: {problem}")
    link = InProcessLink(
        book, scenario.model.drafters, engine_id=f"sim-{index}", report_every=report_every
    )
    engine = SimulatedEngine(world, link, seed=seed * 1000 + index)
    return Replica(world, book, link, engine)


def learn_warm_state(
    scenario: Scenario, seed: int, report_every: int, params: Mapping[str, Any] | None = None
) -> bytes:
    """What one replica knows after the scenario's steps, as its sidecar's snapshot file
    holds it."""
    replica = make_replica(scenario, seed, TEACHER_INDEX, report_every, params=params)
    replica.engine.run(scenario.steps)
    return snapshot.encode(snapshot.capture(replica.book, snapshot.IngestWatermarks()))


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


def round_steps(steps: int, exchange_steps: int, first_report: int) -> list[int]:
    """The steps at which the store's rounds come, as FleetStore.run paces them, each at
    the latest its jitter allows: the first at a tenth of the interval, or a poll after
    the replica's first report (at step ``first_report``) if that is sooner; then once
    an interval until that report is learned, the next round a poll after it, then
    after the waits of :func:`~specctl.sidecar.fleet_store.round_wait` from the round
    that first held it."""
    interval = float(exchange_steps)
    poll = EVIDENCE_POLL_SHARE * interval
    out, t = [], min(interval * FIRST_ROUND_SHARE, first_report + poll)
    evidence_from: float | None = None
    while t < steps:
        out.append(min(steps, max(1, round(t))))
        if evidence_from is None and t >= first_report:
            evidence_from = t
        if evidence_from is not None:
            t += round_wait(t - evidence_from, interval)
        elif first_report < t + interval:
            t = first_report + poll
        else:
            t += interval
    return sorted(set(out))


def run_fleet(
    scenario: Scenario,
    replicas: int,
    *,
    share: bool,
    exchange_steps: int,
    seed: int,
    report_every: int,
    warm: bytes | None = None,
    params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One fleet over the scenario's steps of total traffic, started cold or from
    ``warm``; its regret over time and at the end.

    At each round the replicas take their turns in a random order, each writing its
    own entry and then merging the others' latest: as rounds out of phase do, a
    replica reads some entries of this round and some of the previous one.
    """
    fleet = [make_replica(scenario, seed, i, report_every, warm, params) for i in range(replicas)]
    steps = scenario.steps // replicas
    rounds = set(round_steps(steps, exchange_steps, fleet[0].link.first_report_steps))
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
        "start": "cold" if warm is None else "warm",
        "regret_tokens": sum(r.regret() for r in fleet),
        "regret_before_first_merge_tokens": before_first_merge,
        "curve": curve,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def paired(
    cold: dict[str, Any], warm: dict[str, Any], replicas: int, share: bool, total_steps: int
) -> dict[str, Any]:
    """A fleet's exploration regret (module docstring): its cold run less its warm run."""
    c, w = np.array(cold["curve"]), np.array(warm["curve"])
    assert np.array_equal(c[:, 0], w[:, 0]), "cold and warm curves at different steps"
    gap = c[:, 1] - w[:, 1]
    late = LATE_SHARE * total_steps
    late_gap = gap[-1] - float(np.interp(total_steps - late, c[:, 0], gap))
    first = None
    if cold["regret_before_first_merge_tokens"] is not None:
        first = cold["regret_before_first_merge_tokens"] - warm["regret_before_first_merge_tokens"]
    return {
        "replicas": replicas,
        "sharing": share,
        "steps_per_replica": total_steps // replicas,
        "exploration_regret_tokens": cold["regret_tokens"] - warm["regret_tokens"],
        "regret_tokens": cold["regret_tokens"],
        "warm_regret_tokens": warm["regret_tokens"],
        "steady_regret_per_step": warm["regret_tokens"] / total_steps,
        "late_exploration_per_step": late_gap / late,
        "exploration_before_first_merge_tokens": first,
        "cold": cold,
        "warm": warm,
    }


def add_regret_over_one_learned(results: list[dict[str, Any]]) -> None:
    """The second measure (module docstring), in place: each fleet's regret started cold
    less one learned replica's on the same traffic (the first run: one replica)."""
    one = results[0]
    assert one["replicas"] == 1, "the first fleet of a seed is one replica"
    for run in results:
        run["regret_over_one_learned_tokens"] = run["regret_tokens"] - one["warm_regret_tokens"]


def seed_table(results: list[dict[str, Any]], seed: int) -> list[str]:
    """One seed's fleets: exploration regret and total, each x one replica; the warm
    fleet's steady rate, the exploration regret's late rate, and what was paid before
    the first merge."""
    one = results[0]
    lines = [
        f"seed {seed}: tokens (x one replica); steady: the warm fleet's regret per step; "
        f"late: exploration regret per step over the last {LATE_SHARE:.0%} of the traffic",
        f"{'replicas':>9} {'sharing':>8} {'exploration':>19} {'over one learned':>19}"
        f" {'total (cold)':>18} {'total (warm)':>13} {'steady':>7} {'late':>6}"
        f" {'before 1st merge':>17}",
    ]
    for run in results:
        e, t = run["exploration_regret_tokens"], run["regret_tokens"]
        o = run["regret_over_one_learned_tokens"]
        first = run["exploration_before_first_merge_tokens"]
        lines.append(
            f"{run['replicas']:>9} {'yes' if run['sharing'] else 'no':>8} "
            f"{e:>9.0f} ({e / one['exploration_regret_tokens']:6.2f}x) "
            f"{o:>9.0f} ({o / one['regret_over_one_learned_tokens']:6.2f}x) "
            f"{t:>9.0f} ({t / one['regret_tokens']:5.2f}x) "
            f"{run['warm_regret_tokens']:>13.0f} "
            f"{run['steady_regret_per_step']:>7.2f} "
            f"{run['late_exploration_per_step']:>6.2f} "
            f"{'' if first is None else f'{first:.0f}':>17}"
        )
    return lines


def fleet_ratios(
    by_seed: dict[int, list[dict[str, Any]]], replicas: int, share: bool, measure: str
) -> tuple[list[float], float, float]:
    """A fleet's ratio of ``measure`` to one replica's, per seed; their median; and the
    pooled ratio, the fleet's sum over the seeds over one replica's."""
    seeds = sorted(by_seed)
    fleet = [
        next(r for r in by_seed[s] if r["replicas"] == replicas and r["sharing"] == share)[measure]
        for s in seeds
    ]
    one = [by_seed[s][0][measure] for s in seeds]
    ratios = [f / o for f, o in zip(fleet, one, strict=True)]
    return ratios, float(np.median(ratios)), sum(fleet) / sum(one)


def summary_table(by_seed: dict[int, list[dict[str, Any]]]) -> list[str]:
    """Per fleet: each seed's ratio to that seed's one replica, the median and the pooled
    ratio."""
    seeds = sorted(by_seed)
    lines = [
        f"ratios to one replica of the same seed (seeds {', '.join(map(str, seeds))}; "
        "median; pooled: the sums over the seeds):"
    ]
    for measure, label in (
        ("exploration_regret_tokens", "exploration regret"),
        ("regret_over_one_learned_tokens", "regret over one learned replica's"),
        ("regret_tokens", "total regret, cold"),
    ):
        lines.append(f"  {label}:")
        for replicas in REPLICAS[1:]:
            for share in (False, True):
                ratios, median, pooled = fleet_ratios(by_seed, replicas, share, measure)
                each = " ".join(f"{r:6.2f}x" for r in ratios)
                lines.append(
                    f"  {replicas:>4} replicas, {'sharing' if share else 'alone  '}: {each}"
                    f"   median {median:.2f}x   pooled {pooled:.2f}x"
                )
    return lines


def write_plot(by_seed: dict[int, list[dict[str, Any]]], path: Path, exchange_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    first = min(by_seed)
    measure = "exploration_regret_tokens"
    for share, style in ((False, "--"), (True, "-")):
        label = "sharing evidence" if share else "each replica alone"
        medians, pooled = [1.0], [1.0]
        for replicas in REPLICAS[1:]:
            _, median, pool = fleet_ratios(by_seed, replicas, share, measure)
            medians.append(median)
            pooled.append(pool)
        line = left.plot(list(REPLICAS), medians, style, marker="o", label=f"{label}, median")
        left.plot(list(REPLICAS), pooled, "x", color=line[0].get_color(), label=f"{label}, pooled")
        for r in by_seed[first]:
            if (r["replicas"] == 1 and share) or (r["sharing"] != share and r["replicas"] > 1):
                continue
            cold, warm = np.array(r["cold"]["curve"]), np.array(r["warm"]["curve"])
            right.plot(
                cold[:, 0],
                cold[:, 1] - warm[:, 1],
                style,
                label=f"{r['replicas']} replicas, {label}",
            )
    left.axhline(2.0, color="grey", lw=0.8, ls=":", label="2x one replica")
    left.set_xscale("log", base=2)
    left.set_xticks(list(REPLICAS), [str(n) for n in REPLICAS])
    left.set_xlabel("replicas (same total traffic)")
    left.set_ylabel(f"exploration regret, x one replica ({len(by_seed)} seeds)")
    left.legend(fontsize=7)
    right.set_xlabel("steps served by the fleet")
    right.set_ylabel(f"regret cold less warm (tokens, seed {first})")
    right.legend(fontsize=7)
    fig.suptitle(f"specctl on {SCENARIO}, a round every {exchange_s:g} s of engine time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass(frozen=True)
class Setup:
    """What every run of the benchmark shares."""

    steps: int
    exchange_steps: int
    report_every: int
    params: Mapping[str, Any] = field(default_factory=dict)

    def scenario(self) -> Scenario:
        (scenario,) = build_scenarios(SCENARIO, self.steps)
        return scenario


def warm_state_task(setup: Setup, seed: int) -> bytes:
    return learn_warm_state(setup.scenario(), seed, setup.report_every, setup.params)


def fleet_task(
    setup: Setup, seed: int, replicas: int, share: bool, warm: bytes | None
) -> dict[str, Any]:
    return run_fleet(
        setup.scenario(),
        replicas,
        share=share,
        exchange_steps=setup.exchange_steps,
        seed=seed,
        report_every=setup.report_every,
        warm=warm,
        params=setup.params,
    )


def run_all(jobs: int, fn: Callable[..., R], calls: Iterable[tuple[Any, ...]]) -> list[R]:
    """``fn(*call)`` for every call, in ``jobs`` processes (in this one if 1), in order."""
    calls = list(calls)
    if jobs <= 1:
        return [fn(*call) for call in calls]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(fn, *zip(*calls, strict=True)))


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


def parse_params(text: str) -> dict[str, Any]:
    """specctl's parameters from ``--params``: a JSON object, checked by the policy."""
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--params is not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise argparse.ArgumentTypeError(f"--params must be a JSON object, not {text!r}")
    try:
        make_policy("specctl", params)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return params


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
    parser.add_argument("--jobs", type=int, default=1, help="processes to run the runs in")
    parser.add_argument("--out", type=Path, default=Path("fleet-out"))
    parser.add_argument(
        "--params",
        type=parse_params,
        default={},
        help="specctl's parameters for every replica, as JSON, e.g. '{\"fleet_max_rounds\": 8e5}'",
    )
    args = parser.parse_args()
    (scenario,) = build_scenarios(SCENARIO, args.steps)
    step_s = scenario.model.base_step_time_s(scenario.batch)
    exchange_steps = max(1, round(args.exchange_s / step_s))
    setup = Setup(args.steps, exchange_steps, args.report_every, args.params)
    print(
        f"{SCENARIO}: batch {scenario.batch}, a plain step {1000 * step_s:.1f} ms: a round "
        f"every {args.exchange_s:g} s of engine time is every {exchange_steps} steps",
        file=sys.stderr,
    )
    started = time.perf_counter()
    states = dict(
        zip(
            args.seeds,
            run_all(args.jobs, warm_state_task, [(setup, seed) for seed in args.seeds]),
            strict=True,
        )
    )
    print(f"  warm states learned ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    fleets = [(r, s) for r in REPLICAS for s in ((False, True) if r > 1 else (False,))]
    calls = [
        (setup, seed, replicas, share, warm)
        for seed in args.seeds
        for replicas, share in fleets
        for warm in (None, states[seed])
    ]
    runs = iter(run_all(args.jobs, fleet_task, calls))
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for seed in args.seeds:
        results = []
        for replicas, share in fleets:
            cold, warm = next(runs), next(runs)
            run = paired(cold, warm, replicas, share, args.steps)
            run["seed"] = seed
            results.append(run)
            print(
                f"  seed {seed}, {replicas:>2} replicas, {'shared' if share else 'alone '}: "
                f"regret {cold['regret_tokens']:.0f} cold, {warm['regret_tokens']:.0f} warm "
                f"({cold['wall_s']} s, {warm['wall_s']} s)",
                file=sys.stderr,
            )
        add_regret_over_one_learned(results)
        by_seed[seed] = results
        print("\n".join(seed_table(results, seed)), flush=True)
    print(
        f"regret vs the oracle on {SCENARIO}, {args.steps} steps of total traffic, a round "
        f"every {args.exchange_s:g} s; exploration: a fleet's regret started cold less "
        "started warm, over the whole run"
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
                "params": args.params,
                "runs": [run for seed in args.seeds for run in by_seed[seed]],
            },
            indent=1,
        )
    )
    write_plot(by_seed, args.out / "fleet_regret.png", args.exchange_s)
    print(
        f"wrote {args.out}/fleet_regret.json and fleet_regret.png "
        f"({time.perf_counter() - started:.0f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
