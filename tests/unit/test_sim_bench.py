"""The benchmark's JSON has its documented fields, from a CI-sized run of `specctl bench`;
the peers run both as shipped and tuned in hindsight, labelled, with their params."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specctl.cli import main
from specctl.policy.registry import POLICIES
from specctl.policy.sglang_ema import SglangEmaConfig
from specctl.policy.vllm_table import BatchTableConfig, parse_table
from specctl.sim.bench_params import (
    SGLANG_CANDIDATE_STEPS,
    SGLANG_EMA_DEFAULTS,
    VLLM_DEFAULT_TABLE,
    engine_arm,
    shipped_params,
)
from specctl.sim.bench_policies import TUNABLE, VARIANTS, default_policies, policy_variant
from specctl.sim.scenario import build_scenarios

STEPS = 400
REFERENCES = {"oracle", "static-off", "best-static"}


def _results_table():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "results_table.py"
    spec = importlib.util.spec_from_file_location("results_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_json_and_plots(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    plots = tmp_path / "plots"
    code = main(
        [
            "bench",
            "--scenario", "drift",
            "--steps", str(STEPS),
            "--seed", "7",
            "--json", str(out),
            "--plots", str(plots),
        ]
    )  # fmt: skip
    assert code == 0
    data = json.loads(out.read_text())
    assert data["scenario"] == "drift" and data["steps"] == STEPS and data["seed"] == 7
    policies = data["policies"]
    shipped = {n for n, cls in POLICIES.items() if not cls.stationary}
    tuned = {f"{n}@tuned" for n in TUNABLE}
    assert set(policies) == shipped | tuned | REFERENCES
    for name, p in policies.items():
        assert 0.0 < p["goodput_vs_oracle"] <= 1.2, name
        assert p["goodput_vs_no_spec"] > 0.0, name
        assert set(p["params"]) == {"drift"}, name
        run = p["runs"]["drift"]
        assert set(run["classes"]) == {"gsm8k", "math500", "humaneval", "mbpp"}
        for cls in run["classes"].values():
            assert {"goodput_vs_oracle", "goodput_vs_no_spec", "goodput_vs_best_static"} <= set(cls)
            assert abs(sum(cls["arm_share"].values()) - 1.0) < 0.01
        assert run["regret_over_time"][-1]["step"] == STEPS
        assert [a["event"] for a in run["adaptation"]] == [
            "math500 acceptance x0.5",
            "math500 acceptance x1",
        ]
    # every entry is labelled
    variants = {name: p["variant"] for name, p in policies.items()}
    assert set(variants.values()) == set(VARIANTS)
    assert variants["specctl"] == "learning"
    assert {n for n, v in variants.items() if v == "reference"} == REFERENCES
    assert {n for n, v in variants.items() if v == "tuned-in-hindsight"} == tuned
    assert {n for n, v in variants.items() if v == "as-shipped"} == shipped - {"specctl"}

    assert policies["oracle"]["goodput_vs_oracle"] == 1.0
    assert policies["static-off"]["goodput_vs_no_spec"] == 1.0
    # Kimi-K2.5 gains from speculation: off is far below the oracle
    assert policies["static-off"]["goodput_vs_oracle"] < 0.6
    scenario = data["scenarios"]["drift"]
    assert scenario["best_static_arm"].startswith("dflash/")
    # the engine's configured arm: the first drafter offered (EAGLE-3) at its longest K
    assert scenario["engine_arm"] == "eagle3/k=4"
    params = {name: p["params"]["drift"] for name, p in policies.items()}
    assert params["best-static"] == {"arm": scenario["best_static_arm"]}
    # as shipped: the configured K and the systems' own defaults
    assert params["trtllm-threshold"] == {"arm": "eagle3/k=4", "acceptance_length_threshold": 0.0}
    assert params["sglang-ema"] == {
        "drafter": "eagle3",
        "candidate_steps": [1, 3, 4],
        "initial_steps": 4,
        **SGLANG_EMA_DEFAULTS,
    }
    assert params["vllm-batch-table"] == {"drafter": "eagle3", "table": VLLM_DEFAULT_TABLE}
    assert params["banditspec-ucb"] == params["epsilon-greedy"] == {}
    # tuned in hindsight: the best static arm's drafter, and a profiled cap and table
    for name in TUNABLE:
        assert params[name] != params[f"{name}@tuned"], name
    assert params["trtllm-threshold@tuned"]["arm"] == scenario["best_static_arm"]
    assert "max_concurrency" in params["trtllm-threshold@tuned"]
    assert "max_concurrency" not in params["trtllm-threshold"]
    assert params["sglang-ema@tuned"]["drafter"] == "dflash"
    assert params["vllm-batch-table@tuned"]["table"] != VLLM_DEFAULT_TABLE
    # and they ran with them: the as-shipped gate never trips, the tuned cap (616) is
    # above the batch (32), so each runs its one arm on every class
    for cls in policies["trtllm-threshold"]["runs"]["drift"]["classes"].values():
        assert cls["arm_share"] == {"eagle3/k=4": 1.0}
    for cls in policies["trtllm-threshold@tuned"]["runs"]["drift"]["classes"].values():
        assert cls["arm_share"] == {scenario["best_static_arm"]: 1.0}

    assert sorted(p.name for p in plots.iterdir()) == ["drift_goodput.png", "drift_over_time.png"]
    table = capsys.readouterr().out
    assert "drift" in table and "oracle" in table
    assert "sglang-ema@tuned" in table and "tuned-in-hindsight" in table and "as-shipped" in table

    # the results table (docs/simulator.md) has a column for each variant, shipped next to tuned
    markdown = _results_table().tables(_results_table().merge([out]))
    header = next(line for line in markdown.splitlines() if line.startswith("| run | specctl"))
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    for name in TUNABLE:
        assert columns.index(f"{name}@tuned") == columns.index(name) + 1
    assert columns[-2:] == ["best-static", "static-off"]


def test_results_table_reads_files_from_before_the_variants(tmp_path) -> None:
    """Older JSON ran the tunable peers tuned in hindsight under their bare names."""
    run = {"goodput_vs_oracle": 0.9, "goodput_vs_no_spec": 1.5, "goodput_vs_best_static": 0.95}
    run |= {"goodput_vs_no_spec_where_spec_loses": None, "adaptation": []}
    old = {"policies": {n: {"runs": {"drift": run}} for n in ("specctl", "sglang-ema", "oracle")}}
    new = {
        "policies": {
            "sglang-ema": {"variant": "as-shipped", "runs": {"drift": run}},
            "specctl": {"variant": "learning", "runs": {"qwen3-8b": run}},
        }
    }
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    rt = _results_table()
    merged = rt.merge([tmp_path / "old.json", tmp_path / "new.json"])
    assert set(merged["policies"]) == {"specctl", "sglang-ema@tuned", "sglang-ema", "oracle"}
    assert merged["policies"]["sglang-ema"]["variant"] == "as-shipped"
    lines = rt.tables(merged).splitlines()
    assert "| run | specctl | sglang-ema | sglang-ema@tuned |" in lines
    # a policy a file did not run shows "-"
    assert "| qwen3-8b | 0.900 | - | - |" in lines


def test_shipped_defaults_are_the_policies_documented_ones() -> None:
    sglang = SglangEmaConfig()
    assert tuple(SGLANG_CANDIDATE_STEPS) == sglang.candidate_steps == (1, 3, 7)
    assert SGLANG_EMA_DEFAULTS == {k: getattr(sglang, k) for k in SGLANG_EMA_DEFAULTS}
    assert parse_table(VLLM_DEFAULT_TABLE) == BatchTableConfig().table


def test_shipped_params_use_the_engines_configured_k() -> None:
    seen = set()
    for scenario in build_scenarios("targets", 100):
        drafter, max_k = next(iter(scenario.model.drafters.items()))
        arm = engine_arm(scenario)
        assert (arm.drafter, arm.k) == (drafter, max_k)
        sglang = shipped_params("sglang-ema", scenario)
        assert sglang["drafter"] == drafter and sglang["initial_steps"] == max_k
        # SGLang's tiers capped by the offered K, the configured K among them
        expected = sorted({min(k, max_k) for k in (1, 3, 7)} | {max_k})
        assert sglang["candidate_steps"] == expected
        assert shipped_params("trtllm-threshold", scenario)["arm"] == arm.name
        seen.add(tuple(expected))
    # the study's first drafters go to K=4..7: the cap and the added tier both occur
    assert (1, 3, 7) in seen and (1, 3, 5) in seen and (1, 3, 4) in seen


def test_default_policies_pair_each_tunable_peer_with_its_tuned_variant() -> None:
    names = default_policies()
    assert names[0] == "specctl"
    for name in TUNABLE:
        assert names[names.index(name) + 1] == f"{name}@tuned"
    assert "banditspec-ucb@tuned" not in names and "specctl@tuned" not in names
    assert policy_variant("static:eagle3/k=2") == "reference"


def test_policies_option_accepts_both_names(tmp_path) -> None:
    """On Qwen3-8B the first drafter offered is EAGLE-3, which loses on math500 at every K;
    as shipped TensorRT-LLM runs it there, tuned in hindsight it runs DSpark."""
    out = tmp_path / "bench.json"
    policies = "trtllm-threshold,trtllm-threshold@tuned"
    code = main(
        ["bench", "--scenario", "qwen3-8b", "--steps", "300", "--policies", policies,
         "--quiet", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    data = json.loads(out.read_text())["policies"]
    assert set(data) == {"trtllm-threshold", "trtllm-threshold@tuned"} | REFERENCES
    shipped = data["trtllm-threshold"]["runs"]["qwen3-8b"]["classes"]["math500"]
    tuned = data["trtllm-threshold@tuned"]["runs"]["qwen3-8b"]["classes"]["math500"]
    assert shipped["arm_share"] == {"eagle3/k=7": 1.0}
    assert tuned["arm_share"] == {"dspark/k=7": 1.0}
    assert shipped["goodput_vs_no_spec"] < 1.0 < tuned["goodput_vs_no_spec"]


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ("banditspec-ucb@tuned", "banditspec-ucb has no @tuned variant"),
        ("nope@tuned", "unknown policy 'nope@tuned'"),
        ("static", "unknown policy 'static'"),
    ],
)
def test_bench_rejects_a_policy_it_cannot_run(policies, message, capsys) -> None:
    args = ["bench", "--scenario", "drift", "--steps", "200", "--policies", policies]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_bench_rejects_an_unknown_scenario(capsys) -> None:
    assert main(["bench", "--scenario", "nope", "--steps", "200"]) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err


def test_bench_explains_a_learning_policys_regret(tmp_path, capsys) -> None:
    """`--explain`: per class, the learning policy's tokens and round costs at the run's
    end next to the sweep's, and the arm it would pick with either set corrected."""
    out = tmp_path / "bench.json"
    code = main(
        ["bench", "--scenario", "qwen3-8b", "--steps", "2000", "--policies", "specctl",
         "--explain", "--quiet", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    policies = json.loads(out.read_text())["policies"]
    assert all(
        "explained" not in p["runs"]["qwen3-8b"] for n, p in policies.items() if n in REFERENCES
    )
    explained = policies["specctl"]["runs"]["qwen3-8b"]["explained"]
    (scenario,) = build_scenarios("qwen3-8b", 2000)
    model = scenario.model
    assert [r["workload_class"] for r in explained] == list(model.classes)
    truth = model.expected_tokens()
    cost = model.cost(scenario.batch)
    arm_index = {a.name: i for i, a in enumerate(model.arms)}
    for c, reading in enumerate(explained):
        arms = {a["arm"]: a for a in reading["arms"]}
        assert set(arms) == set(arm_index)
        assert abs(sum(a["share"] for a in arms.values()) - 1.0) < 1e-3
        for name, a in arms.items():
            assert a["true_tokens"] == pytest.approx(truth[c, arm_index[name]], abs=1e-4)
            assert a["true_cost"] == pytest.approx(cost[c, arm_index[name]], abs=1e-4)
        best = arms[reading["best_arm"]]
        assert best["goodput_vs_best"] == 1.0
        assert max(a["goodput_vs_best"] for a in arms.values()) == 1.0
        for pick, loss in [
            ("believed_best", "loss"),
            ("pick_with_true_tokens", "loss_with_true_tokens"),
            ("pick_with_true_cost", "loss_with_true_cost"),
        ]:
            assert reading[loss] == pytest.approx(
                1.0 - arms[reading[pick]]["goodput_vs_best"], abs=2e-4
            )
        # the costs are read in the truth's units at the class's most-run arm, where its
        # tokens are measured best
        most = max(arms.values(), key=lambda a: a["share"])
        assert most["estimated_cost"] == pytest.approx(most["true_cost"], abs=1e-3)
        assert most["estimated_tokens"] == pytest.approx(most["true_tokens"], rel=0.05)
        assert most["arm"] != "off"
    printed = capsys.readouterr().out
    assert f"qwen3-8b specctl {model.classes[0]} (bucket " in printed
    assert "believed" in printed and "with the true cost" in printed
