"""Trace-driven simulation on a synthetic trace whose requests differ from each other,
whose acceptance moves along each request and whose step times have heavy tails."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from trace_support import ALPHA_PER_REQUEST_S, ALPHA_S, BETA_S, SyntheticTrace, synthetic_trace

from specctl.cli import main
from specctl.sim.engine import World, make_world
from specctl.sim.scenario import LoadChange, Scenario, build_scenarios
from specctl.sim.trace_scenario import TraceScenario, trace_scenario
from specctl.sim.trace_step_time import fit_step_time
from specctl.sim.trace_world import TraceWorld
from specctl.trace.format import read_trace

STEPS = 1500


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> SyntheticTrace:
    return synthetic_trace(tmp_path_factory.mktemp("trace") / "synthetic", steps=STEPS, batch=16)


def _arm(scenario: TraceScenario, name: str) -> int:
    return [a.name for a in scenario.model.arms].index(name)


def _rounds_by_replay_index(syn: SyntheticTrace) -> list[dict[int, tuple[int, int]]]:
    """Recorded rounds (position -> drafted, accepted) of each request, in the replay's order:
    requests numbered as the trace first saw them, those that decoded at least once."""
    return [{p: (d, a) for p, d, a in r.rounds} for r in syn.requests.values() if r.rounds]


def _run(world: TraceWorld, arm: int, steps: int) -> list[tuple[np.ndarray, ...]]:
    out = []
    for _ in range(steps):
        req, pos = world.slot_req.copy(), world.slot_pos.copy()
        arms = np.full(len(req), arm, dtype=np.int64)
        drafted, accepted, _, step_time = world.run_round(arms)
        out.append((req, pos, drafted, accepted, np.full(len(req), step_time)))
    return out


def test_replay_at_the_recorded_k_repeats_every_round(synthetic: SyntheticTrace) -> None:
    trace = read_trace(synthetic.directory)
    scenario = trace_scenario(trace, 600, batch=16)
    world = TraceWorld(scenario, np.random.default_rng(0))
    truth = _rounds_by_replay_index(synthetic)
    checked = 0
    for req, pos, drafted, accepted, _ in _run(world, _arm(scenario, "ngram/k=4"), 600):
        for r, p, d, a in zip(req, pos, drafted, accepted, strict=True):
            assert truth[r][p] == (d, a)  # the same round, at the same position
            checked += 1
    assert checked == 600 * 16
    assert world.rounds_drawn == 0


def test_a_shorter_k_accepts_the_recorded_run_cut_at_k(synthetic: SyntheticTrace) -> None:
    """At K' < K a round drafting where a recorded round started accepts min(a, K');
    inside a recorded round (after a shorter round), what was left of its run."""
    trace = read_trace(synthetic.directory)
    scenario = trace_scenario(trace, 400, batch=16)
    world = TraceWorld(scenario, np.random.default_rng(1))
    truth = _rounds_by_replay_index(synthetic)
    starts = inside = drawn = 0
    for req, pos, drafted, accepted, _ in _run(world, _arm(scenario, "ngram/k=2"), 400):
        for r, p, d2, a2 in zip(req.tolist(), pos.tolist(), drafted, accepted, strict=True):
            start = max(q for q in truth[r] if q <= p)
            d, a = truth[r][start]
            offset = p - start
            assert offset <= a  # K' <= K never leaves the recorded path
            short_drafter = d < 4
            assert d2 == (min(2, d - offset) if short_drafter else 2)
            run = a - offset
            if run >= d2 or short_drafter or a < d:  # the recording decides
                assert a2 == min(run, d2)
                starts += offset == 0
                inside += offset > 0
            else:  # accepted all 4, drafting from inside: the rest is drawn per class
                assert run <= a2 <= d2
                drawn += 1
    assert starts > 1000 and inside > 300
    assert drawn == world.rounds_drawn and drawn < 0.15 * world.rounds_total


def _per_request_acceptance(
    world: World | TraceWorld, arm: int, steps: int
) -> dict[int, np.ndarray]:
    """accepted / drafted of each request that finished with at least 20 drafts, by class."""
    n = len(world.slot_class)
    acc, dra = np.zeros(n), np.zeros(n)
    done: dict[int, list[float]] = {}
    for _ in range(steps):
        cls = world.slot_class.copy()
        if isinstance(world, TraceWorld):
            before = world.replay.req_length[world.slot_req] - world.slot_pos
        else:
            before = world.slot_remaining.copy()
        drafted, accepted, _, _ = world.run_round(np.full(n, arm, dtype=np.int64))
        acc += accepted
        dra += drafted
        for i in np.flatnonzero(before - accepted - 1 <= 0):
            if dra[i] >= 20:
                done.setdefault(int(cls[i]), []).append(acc[i] / dra[i])
            acc[i] = dra[i] = 0
    return {c: np.asarray(v) for c, v in done.items()}


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def test_requests_keep_their_own_acceptance(synthetic: SyntheticTrace) -> None:
    """Within a class, the replayed per-request acceptance is distributed as in the trace;
    a table world with the same per-class rates (independent positions, identical
    requests) is far narrower."""
    trace = read_trace(synthetic.directory)
    recorded: dict[int, list[float]] = {}
    for r in synthetic.requests.values():
        d = sum(x[1] for x in r.rounds)
        if d >= 20 and r.position >= r.length:
            c = trace.classes.index(r.cls)
            recorded.setdefault(c, []).append(sum(x[2] for x in r.rounds) / d)
    scenario = trace_scenario(trace, 3000, batch=16)
    k4 = _arm(scenario, "ngram/k=4")
    replayed = _per_request_acceptance(TraceWorld(scenario, np.random.default_rng(2)), k4, 3000)
    table = Scenario(
        name="same-rates",
        description="",
        model=scenario.model,
        steps=3000,
        batch=16,
        mix=scenario.mix,
        mean_output_tokens=120,
    )
    drawn = _per_request_acceptance(World(table, np.random.default_rng(2)), k4, 3000)
    assert set(recorded) == set(replayed) == set(drawn) == {0, 1}
    for c, values in recorded.items():
        rec = np.asarray(values)
        assert len(rec) > 100 and len(replayed[c]) > 200 and len(drawn[c]) > 200
        assert _ks(rec, replayed[c]) < 0.1, trace.classes[c]
        assert np.std(replayed[c]) == pytest.approx(np.std(rec), rel=0.1)
        assert _ks(rec, drawn[c]) > 0.2, trace.classes[c]
        assert np.std(drawn[c]) < 0.6 * np.std(rec)


def test_step_times_keep_the_traces_residuals(synthetic: SyntheticTrace) -> None:
    trace = read_trace(synthetic.directory)
    model = fit_step_time(trace)
    # the fit finds the synthetic engine's cost (before its noise)
    alpha, beta = model.coefficients(16)
    assert beta == pytest.approx(BETA_S, rel=0.2)
    tokens = 16 * 5  # 16 requests drafting 4 each
    assert alpha + beta * tokens == pytest.approx(
        ALPHA_S + ALPHA_PER_REQUEST_S * 16 + BETA_S * tokens, rel=0.05
    )
    scenario = trace_scenario(trace, STEPS)  # load follows the trace
    world = TraceWorld(scenario, np.random.default_rng(3))
    residuals, times = [], []
    for req, _, drafted, _, step_time in _run(world, _arm(scenario, "ngram/k=4"), STEPS):
        predicted = model.predict(len(req), len(req) + int(drafted.sum()))
        residuals.append(step_time[0] / predicted)
        times.append(step_time[0])
    q = [0.1, 0.5, 0.9, 0.99]
    sim_r, trace_r = np.quantile(residuals, q), np.quantile(model.residuals, q)
    assert sim_r[:3] == pytest.approx(trace_r[:3], rel=0.03)
    assert sim_r[3] == pytest.approx(trace_r[3], rel=0.35)
    assert sim_r[3] / sim_r[1] > 1.5  # heavy tail: a 2% log-normal gives about 1.05
    decode = trace.decode_requests == trace.batch_size
    measured = np.quantile(trace.step_time_s[decode], [0.1, 0.5, 0.9])
    assert np.quantile(times, [0.1, 0.5, 0.9]) == pytest.approx(measured, rel=0.1)


def test_load_follows_the_trace_or_given_phases(tmp_path: Path) -> None:
    syn = synthetic_trace(tmp_path / "swing", steps=800, batch=16, swing=8)
    trace = read_trace(syn.directory)
    scenario = trace_scenario(trace, 800)
    assert len(scenario.events) >= 5
    world = make_world(scenario, np.random.default_rng(4))
    seen: dict[int, int] = {}
    for step in range(800):
        world.apply_events()
        seen[step] = len(world.slot_class)
        world.run_round(np.zeros(len(world.slot_class), dtype=np.int64))
    decode = trace.decode_requests
    for start in range(0, 800, 50):
        window = decode[start : start + 50]
        assert seen[start] == round(float(np.median(window[window > 0])))

    phases = trace_scenario(trace, 300, batch=8, events=[LoadChange(100, 4), LoadChange(200, 8)])
    world = TraceWorld(phases, np.random.default_rng(5))
    sizes = []
    waiting: list[tuple[int, int]] = []
    later: set[tuple[int, int]] = set()
    for _ in range(300):
        if world.step == 100:  # the four over the new batch wait
            over = zip(world.slot_req[4:].tolist(), world.slot_pos[4:].tolist(), strict=True)
            waiting = list(over)
        world.apply_events()
        if world.step > 100:
            later |= set(zip(world.slot_req.tolist(), world.slot_pos.tolist(), strict=True))
        sizes.append(len(world.slot_class))
        world.run_round(np.zeros(len(world.slot_class), dtype=np.int64))
    assert sizes[99] == 8 and sizes[100] == 4 and sizes[200] == 8
    assert len(waiting) == 4 and set(waiting) <= later  # resumed where they stopped


def test_bench_runs_a_trace_through_the_production_path(
    synthetic: SyntheticTrace, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "bench.json"
    args = [
        "bench", "--scenario", "trace", "--trace", str(synthetic.directory),
        "--steps", "300", "--seed", "3", "--policies", "specctl,static:ngram/k=1",
        "--quiet", "--json", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert set(data["scenarios"]) == {"trace/synthetic"}
    scenario = data["scenarios"]["trace/synthetic"]
    assert scenario["classes"] == ["chat", "greedy"]
    assert scenario["engine_arm"] == "ngram/k=4"
    assert "replay of" in scenario["description"]
    assert all(e["kind"] == "load" for e in scenario["events"])
    policies = data["policies"]
    assert set(policies) == {"specctl", "static:ngram/k=1", "oracle", "static-off", "best-static"}
    assert policies["oracle"]["goodput_vs_oracle"] == 1.0
    assert policies["static-off"]["goodput_vs_no_spec"] == 1.0
    # speculation pays on this trace (0.4-0.8 acceptance, cheap drafts)
    assert policies["static-off"]["goodput_vs_oracle"] < 0.9
    run = policies["specctl"]["runs"]["trace/synthetic"]
    assert 0.5 < run["goodput_vs_oracle"] <= 1.2
    assert run["policy_versions"] > 0  # it learned through the policy book
    for cls in run["classes"].values():
        assert abs(sum(cls["arm_share"].values()) - 1.0) < 0.01
    fixed = policies["static:ngram/k=1"]["runs"]["trace/synthetic"]["classes"]
    assert all(c["arm_share"] == {"ngram/k=1": 1.0} for c in fixed.values())
    assert "trace/synthetic" in capsys.readouterr().out

    # the same from Python, with one run per trace
    scenarios = build_scenarios("trace", 200, trace=[synthetic.directory, synthetic.directory])
    assert [type(s) for s in scenarios] == [TraceScenario, TraceScenario]


def test_trace_scenario_needs_a_trace(capsys) -> None:
    assert main(["bench", "--scenario", "trace", "--steps", "200"]) == 2
    assert "scenario 'trace' needs a trace" in capsys.readouterr().err
    assert main(["bench", "--scenario", "trace", "--trace", "nope", "--steps", "200"]) == 2
    assert "is not a file or directory, nor a packaged trace" in capsys.readouterr().err


def test_the_packaged_cpu_engine_trace_is_real_and_differs_by_class() -> None:
    """The shipped trace from vLLM's CPU engine: three classes at the engine's K=4, with
    acceptance that differs by class as the sampling temperature says it should."""
    import numpy as np

    from specctl.trace.format import read_trace

    trace = read_trace("tiny-cpu-ngram")
    assert set(trace.classes) == {"greedy", "warm", "hot"}
    assert int(trace.k.max()) == 4
    accepted = {
        c: float(trace.accepted[trace.class_index == i].mean()) for i, c in enumerate(trace.classes)
    }
    assert accepted["greedy"] > 2 * accepted["hot"], accepted
    assert len(np.unique(trace.batch_size)) >= 3  # several loads for the step-time fit
