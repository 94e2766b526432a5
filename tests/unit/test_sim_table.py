"""The simulator reproduces the table it was given: MAL and speedup per arm."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specctl.sim.bench import run_policy
from specctl.sim.scenario import Scenario, build_scenarios
from specctl.sim.table import (
    REFERENCE_BATCH,
    TableError,
    build_target,
    read_rows,
    targets,
)


def test_every_row_is_the_model_at_the_reference_batch() -> None:
    rows = read_rows()
    assert len(rows) == 400
    assert len(targets(rows)) == 9
    for t in targets(rows):
        model = build_target(rows, t)
        expected = model.expected_tokens()
        cost = model.cost(REFERENCE_BATCH)
        for r in model.rows:
            c = model.classes.index(r.bench)
            a = [arm.name for arm in model.arms].index(f"{r.drafter}/k={r.n}")
            # the table rounds MAL and the marginals to 2-3 digits
            assert expected[c, a] == pytest.approx(r.mal, abs=0.02), (t, r)
            assert expected[c, a] / cost[c, a] == pytest.approx(r.speedup, rel=0.01), (t, r)
        off = [arm.name for arm in model.arms].index("off")
        assert np.all(cost[:, off] == 1.0)


def test_sampled_acceptance_and_speedup_match_the_table() -> None:
    """Through the production path (book, reports, policy view), within sampling error."""
    steps = 300
    base = build_scenarios("qwen3-8b", steps)[0]
    scenario = Scenario(
        name="reproduce", description="", model=base.model, steps=steps, batch=REFERENCE_BATCH
    )
    model = scenario.model
    arm_names = [a.name for a in model.arms]
    off = run_policy(scenario, "static:off", seed=3)
    off_goodput = off.tokens.sum(axis=0) / off.time_s.sum(axis=0)
    for arm in ("eagle3/k=5", "dflash/k=7", "dspark/k=11"):
        run = run_policy(scenario, f"static:{arm}", seed=3)
        a = arm_names.index(arm)
        for c, bench in enumerate(model.classes):
            row = next(r for r in model.rows if r.bench == bench and f"{r.drafter}/k={r.n}" == arm)
            rounds = int(run.rounds[c, a])
            assert rounds == run.rounds[c].sum() > 1000
            mal = run.tokens[:, c].sum() / rounds
            # the accepted length is at most K: its sd is below K / 2
            k = int(model.arm_k[a])
            tol = 4 * (k / 2) / math.sqrt(rounds) + 0.02
            assert mal == pytest.approx(row.mal, abs=tol), (arm, bench)
            speedup = (run.tokens[:, c].sum() / run.time_s[:, c].sum()) / off_goodput[c]
            assert speedup == pytest.approx(row.speedup, rel=tol / row.mal + 0.02), (arm, bench)


def test_bad_tables_are_named(tmp_path) -> None:
    bad = tmp_path / "sweep.csv"
    bad.write_text(
        "target,method,bench,baseline_tok_s,N,speedup,MAL,perpos_marginal\n"
        "m,EAGLE-3,chat,100,2,1.5,2.4,0.8 0.6\n"
        "m,EAGLE-3,chat,100,3,1.6,2.9,0.8 0.6\n"
    )
    with pytest.raises(TableError, match=r"sweep.csv line 3: perpos_marginal has 2 values, N=3"):
        read_rows(bad)
    bad.write_text("target,method,bench,N,speedup,MAL\n")
    with pytest.raises(TableError, match="missing column"):
        read_rows(bad)


def test_a_users_sweep_without_marginals_defines_a_target(tmp_path) -> None:
    own = tmp_path / "own.csv"
    own.write_text(
        "target,method,bench,baseline_tok_s,N,speedup,MAL\n"
        "acme/m,ngram,chat,1000,2,1.3,2.2\n"
        "acme/m,ngram,chat,1000,4,1.4,2.9\n"
        "acme/m,ngram,code,1000,2,1.6,2.6\n"
        "acme/m,ngram,code,1000,4,1.9,3.6\n"
    )
    scenarios = build_scenarios("table", 200, table=own)
    assert [s.name for s in scenarios] == ["table/m"]
    model = scenarios[0].model
    assert model.classes == ("chat", "code") and model.drafters == {"ngram": 4}
    exp = model.expected_tokens()
    assert exp[1, [a.name for a in model.arms].index("ngram/k=4")] == pytest.approx(3.6, abs=1e-6)
