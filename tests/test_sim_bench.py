"""The benchmark's JSON has its documented fields, from a CI-sized run of `specctl bench`."""

from __future__ import annotations

import json

from controller.cli import main
from controller.policy.registry import POLICIES

STEPS = 400


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
    expected = {n for n in POLICIES if n != "static"} | {"oracle", "static-off", "best-static"}
    assert set(policies) == expected
    for name, p in policies.items():
        assert 0.0 < p["goodput_vs_oracle"] <= 1.2, name
        assert p["goodput_vs_no_spec"] > 0.0, name
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
    assert policies["oracle"]["goodput_vs_oracle"] == 1.0
    assert policies["static-off"]["goodput_vs_no_spec"] == 1.0
    # Kimi-K2.5 gains from speculation: off is far below the oracle
    assert policies["static-off"]["goodput_vs_oracle"] < 0.6
    assert data["scenarios"]["drift"]["best_static_arm"].startswith("dflash/")
    assert sorted(p.name for p in plots.iterdir()) == ["drift_goodput.png", "drift_over_time.png"]
    table = capsys.readouterr().out
    assert "drift" in table and "oracle" in table


def test_bench_rejects_an_unknown_scenario(capsys) -> None:
    assert main(["bench", "--scenario", "nope", "--steps", "200"]) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err
