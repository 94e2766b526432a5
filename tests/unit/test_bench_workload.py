"""Workload files of the real-engine benchmark, its schedule and its analysis, without vLLM.

A workload file is the benchmark's whole input, so every mistake in one must
be refused with a message that names the key; and the ratios the benchmark
reports must follow from its measurements by the documented rules.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from specctl.bench.analysis import summarize
from specctl.bench.hindsight import hindsight_arms
from specctl.bench.report import format_report
from specctl.bench.schedule import expand_policies, rotated, schedule
from specctl.bench.workload import split_by_share
from specctl.bench.workload_file import load_workload, packaged_workloads, parse_workload
from specctl.bench.workload_values import WorkloadError

MINIMAL = """
[[class]]
name = "greedy"
sampling = { temperature = 0.0 }

[[class]]
name = "hot"
sampling = { temperature = 1.0 }

[[phase]]
concurrency = 4
seconds = 10
"""


def _parse(text: str, tmp_path: Path | None = None) -> Any:
    return parse_workload(tomllib.loads(text), "w.toml", tmp_path)


def test_packaged_workloads_load() -> None:
    assert {"demo", "testbed-three-classes", "testbed-two-drafters"} <= set(packaged_workloads())
    demo = load_workload("demo")
    assert demo.model.builtin == "testbed"
    assert [c.name for c in demo.classes] == ["greedy", "warm", "hot", "copy"]
    assert {a.split("/")[0] for a in demo.static_arms()} == {"off", "draft_model", "ngram"}
    drafters = load_workload("testbed-two-drafters")
    assert [c.name for c in drafters.classes] == ["copy", "free"]
    assert set(drafters.static_arms()) <= set(drafters.arms())
    swing = load_workload("testbed-three-classes")
    assert len(swing.classes) >= 3
    loads = [p.total_concurrency for p in swing.phases]
    assert loads[0] < max(loads) and loads[-1] < max(loads)  # low -> high -> low
    assert swing.static_arms() == swing.arms()
    assert swing.arms() == ["off"] + [f"draft_model/k={k}" for k in range(1, 5)]


def test_defaults_of_a_minimal_file() -> None:
    w = _parse(MINIMAL)
    assert w.model.builtin == "testbed" and w.drafter == "draft_model" and w.max_k == 4
    assert w.step_clock == "wall"
    assert w.bench.repetitions == 3 and w.bench.carry_state
    assert w.phases[0].clients(w.classes) == {"greedy": 2, "hot": 2}
    assert w.classes[0].output_tokens == (64, 64) and w.classes[0].prompt_tokens is None
    tiny = _parse('[model]\nbuiltin = "tiny"\n' + MINIMAL)
    assert tiny.drafter == "ngram" and tiny.arms()[-1] == "ngram/k=4"
    assert len(tiny.arms()) == 5  # an n-gram engine offers no second n-gram drafter


def test_a_model_drafter_engine_offers_ngram_arms_as_the_engine_does() -> None:
    w = _parse(MINIMAL)
    assert w.drafter == "draft_model" and w.max_k == 4
    assert w.arms() == ["off"] + [f"draft_model/k={k}" for k in range(1, 5)] + [
        f"ngram/k={k}" for k in range(1, 5)
    ]
    one = _parse("[engine]\nenv = { SPECCTL_NGRAM_MAX_K = 1 }\n" + MINIMAL)
    assert one.arms()[-2:] == ["draft_model/k=4", "ngram/k=1"]
    none = _parse("[engine]\nenv = { SPECCTL_NGRAM_MAX_K = '0' }\n" + MINIMAL)
    assert none.arms()[-1] == "draft_model/k=4"
    json.dumps(w.to_json())  # the JSON of the run carries the workload


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("concurency = 3\n" + MINIMAL, "concurency: unknown key"),
        (MINIMAL.replace("sampling =", "temprature = 0\nsampling ="), "class[0].temprature"),
        (MINIMAL.replace("temperature = 1.0", "temperature = -1"), "class[1].sampling.temperature"),
        (MINIMAL.replace("temperature = 1.0", "temp = 1"), "class[1].sampling.temp: unknown key"),
        (MINIMAL.replace("temperature = 1.0", 'temperature = "hot"'), "must be a number"),
        (MINIMAL.replace("seconds = 10", ""), "phase[0].seconds: is required"),
        (MINIMAL.replace("seconds = 10", "seconds = 0"), "phase[0].seconds"),
        (MINIMAL.replace("concurrency = 4", "concurrency = 0"), "concurrency=0: must be >= 1"),
        (MINIMAL.replace("concurrency = 4", "concurrency = 99"), "model.max_num_seqs=32"),
        (MINIMAL.replace("concurrency = 4", "concurrency = 2.5"), "must be an integer"),
        (MINIMAL.replace("concurrency = 4", "concurrency = { greedy = 1, cold = 1 }"),
         "phase[0].concurrency.cold: unknown key"),
        (MINIMAL.replace('name = "hot"', 'name = "greedy"'), "name='greedy': appears twice"),
        (MINIMAL.replace('name = "hot"', 'name = "hot class"'), "class[1].name"),
        (MINIMAL.replace('name = "hot"\n', 'name = "hot"\nshare = -1\n'), "class[1].share"),
        (MINIMAL.replace('name = "hot"\n', 'name = "hot"\noutput_tokens = [8, 4]\n'),
         "class[1].output_tokens"),
        (MINIMAL.replace('name = "hot"\n', 'name = "hot"\noutput_tokens = 600\n'),
         "model.max_model_len=512"),
        (MINIMAL.replace('name = "hot"\n', 'name = "hot"\nprompts = "missing.txt"\n'),
         "class[1].prompts='missing.txt': no such file"),
        (MINIMAL.replace('name = "hot"\n', 'name = "hot"\nprompts = "p.csv"\n'), ".jsonl"),
        ("[bench]\nstatic_arms = ['eagle3/k=2']\n" + MINIMAL, "bench.static_arms[0]"),
        (
            "[engine]\nenv = { SPECCTL_NGRAM_MAX_K = '0' }\n[bench]\nstatic_arms = ['ngram/k=2']\n"
            + MINIMAL,
            "bench.static_arms[0]",
        ),
        ("[engine]\nenv = { SPECCTL_NGRAM_MAX_K = 'two' }\n" + MINIMAL, "SPECCTL_NGRAM_MAX_K"),
        ("[bench]\npolicies = ['specctl', 'sglang']\n" + MINIMAL, "bench.policies[1]='sglang'"),
        ("[bench]\nrepetitions = 0\n" + MINIMAL, "bench.repetitions=0"),
        ("[bench]\nwarmup = 3\n" + MINIMAL, "bench.warmup: unknown key"),
        ("[model]\nbuiltin = 'llama'\n" + MINIMAL, "model.builtin='llama'"),
        ("[model]\nbuiltin = 'tiny'\npath = '/m'\n" + MINIMAL, "either builtin or path"),
        ("[model]\npath = '/m'\n" + MINIMAL, "speculative: is required"),
        ("[model]\ntestbed = { hidden = 64 }\n" + MINIMAL, "model.testbed.hidden: unknown key"),
        ("[model]\ntestbed = { hidden_size = 100 }\n" + MINIMAL, "model.testbed: hidden_size"),
        ("[speculative]\nmethod = 'ngram'\nnum_speculative_tokens = 0\n" + MINIMAL,
         "speculative.num_speculative_tokens=0"),
        ("[speculative]\nmethod = 'Bad/Name'\nnum_speculative_tokens = 2\n" + MINIMAL,
         "speculative.method"),
        ("[engine]\nstep_clock = 'cpu'\n" + MINIMAL, "engine.step_clock='cpu'"),
        ("[sidecar.params.specctl]\ndiscount = 2\n" + MINIMAL, "sidecar.params.specctl"),
        ("[sidecar.params.nope]\nx = 1\n" + MINIMAL, "sidecar.params.nope: unknown policy"),
        ('[sidecar.params."specctl@fast"]\nprobe_budget = 0.9\n' + MINIMAL,
         "sidecar.params.specctl@fast: specctl policy: probe_budget=0.9"),
        ('[sidecar.params."nope@fast"]\nx = 1\n' + MINIMAL, "sidecar.params.nope@fast: unknown"),
        ('[sidecar.params."specctl@a b"]\nseed = 1\n' + MINIMAL, "variant label 'a b'"),
        ("[bench]\npolicies = ['specctl@']\n" + MINIMAL, "bench.policies[0]='specctl@': variant"),
        # a variant's parameters over its policy's: together they contradict each other
        ("[sidecar.params.specctl]\nswitch_on_confidence = 0.9\n"
         '[sidecar.params."specctl@low"]\nswitch_off_confidence = 0.85\n' + MINIMAL,
         "sidecar.params.specctl@low: specctl policy: switch_on_confidence=0.9 must not"),
        ("[sidecar]\nload_bucket_bounds = [8, 4]\n" + MINIMAL, "must increase"),
        ("[[phase]]\nconcurrency = 1\nseconds = 1\n", "class: at least one"),
        ('[[class]]\nname = "a"\n', "phase: at least one"),
    ],
)  # fmt: skip
def test_bad_workloads_name_the_key(text: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(WorkloadError) as info:
        _parse(text, tmp_path)
    assert expected in str(info.value)
    assert str(info.value).startswith("w.toml: ")


def test_files_relative_to_the_workload_and_bad_toml(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hello there"}\n')
    path = tmp_path / "w.toml"
    path.write_text(MINIMAL.replace('name = "hot"\n', 'name = "hot"\nprompts = "prompts.jsonl"\n'))
    w = load_workload(path)
    assert w.classes[1].prompts == str(tmp_path / "prompts.jsonl")
    path.write_text("[[class]\n")
    with pytest.raises(WorkloadError, match="not valid TOML"):
        load_workload(path)
    with pytest.raises(WorkloadError, match="no packaged workload"):
        load_workload("no-such-workload")


def test_split_by_share() -> None:
    assert split_by_share(3, {"a": 1, "b": 1, "c": 1}) == {"a": 1, "b": 1, "c": 1}
    assert split_by_share(24, {"a": 1, "b": 1, "c": 1}) == {"a": 8, "b": 8, "c": 8}
    assert split_by_share(10, {"a": 3, "b": 1}) == {"a": 7, "b": 3}
    assert split_by_share(2, {"a": 1, "b": 1, "c": 1}) == {"a": 1, "b": 1, "c": 0}
    for total in range(1, 40):
        assert sum(split_by_share(total, {"a": 0.2, "b": 0.5, "c": 0.3}).values()) == total


def test_schedule_runs_every_policy_once_per_phase_in_rotated_orders() -> None:
    second = "[[phase]]\nconcurrency = 8\nseconds = 10\n"
    w = _parse('[bench]\nstatic_arms = ["off", "draft_model/k=2"]\n' + MINIMAL + second)
    runs = expand_policies(w, ["static", "specctl", "sglang-ema"])
    assert [r.name for r in runs] == [
        "static:off", "static:draft_model/k=2", "specctl", "sglang-ema"
    ]  # fmt: skip
    assert [r.learning for r in runs] == [False, False, True, True]
    plan = schedule(w, runs, repetitions=2)
    assert len(plan) == 2 * len(w.phases) * len(runs)
    orders = []
    for rep in range(2):
        for p in range(len(w.phases)):
            names = [x.name for r, q, x in plan if (r, q) == (rep, p)]
            assert sorted(names) == sorted(x.name for x in runs)
            orders.append(names)
    assert len({tuple(o) for o in orders}) == len(orders)  # every phase in another order
    assert rotated(runs, 1)[0].name == "static:draft_model/k=2"


def test_a_variant_runs_its_policy_with_its_parameters_over_the_policys() -> None:
    w = _parse(
        "[bench]\npolicies = ['specctl', 'specctl@wide', 'specctl@again']\n"
        "[sidecar.params.specctl]\nprobe_budget = 0.03\nseed = 2\n"
        '[sidecar.params."specctl@wide"]\ncost_class_columns = 16\nseed = 5\n' + MINIMAL
    )
    runs = {r.name: r for r in expand_policies(w)}
    assert list(runs) == ["specctl", "specctl@wide", "specctl@again"]
    assert {runs[n].policy for n in ("specctl", "specctl@wide", "specctl@again")} == {"specctl"}
    assert runs["specctl"].params == {"probe_budget": 0.03, "seed": 2}
    assert runs["specctl@wide"].params == {
        "probe_budget": 0.03, "seed": 5, "cost_class_columns": 16
    }  # fmt: skip
    # a variant without a table of its own runs the policy as configured: an A/A pair
    assert runs["specctl@again"].params == runs["specctl"].params
    assert all(r.learning for n, r in runs.items() if "@" in n)


def test_hindsight_runs_after_the_static_arms_it_chooses_among() -> None:
    second = "[[phase]]\nconcurrency = 8\nseconds = 10\n"
    w = _parse('[bench]\nstatic_arms = ["off", "draft_model/k=2"]\n' + MINIMAL + second)
    runs = expand_policies(w, ["hindsight", "static", "specctl"])
    kinds = {r.name: (r.learning, r.hindsight) for r in runs}
    assert kinds["hindsight"] == (False, True)
    assert kinds["specctl"] == (True, False)
    plan = schedule(w, runs, repetitions=3)
    for rep in range(3):
        for p in range(len(w.phases)):
            names = [x.name for r, q, x in plan if (r, q) == (rep, p)]
            assert names[-1] == "hindsight" and sorted(names[:-1]) == sorted(
                ["static:off", "static:draft_model/k=2", "specctl"]
            )
    with pytest.raises(ValueError, match="run static arms too"):
        expand_policies(w, ["hindsight", "specctl"])
    with pytest.raises(WorkloadError, match=r"bench\.policies.*list static arms too"):
        _parse("[bench]\npolicies = ['hindsight', 'specctl']\n" + MINIMAL)


def test_hindsight_pins_each_class_to_its_best_static_arm_of_the_phase() -> None:
    def seg(policy: str, phase: str, greedy: int, hot: int, window_s: float = 10.0) -> dict:
        return {
            "policy": policy,
            "phase": phase,
            "window_s": window_s,
            "classes": {"greedy": {"tokens": greedy}, "hot": {"tokens": hot}},
        }

    segments = [
        seg("static:off", "low", 100, 100),
        seg("static:k=2", "low", 200, 80),
        # goodput is per second: more tokens over a longer window is less
        seg("static:k=2", "high", 330, 200, window_s=20.0),
        seg("static:off", "high", 300, 300),
        # learning policies and hindsight's own segments are not candidates
        seg("specctl", "low", 900, 900),
        seg("hindsight", "low", 900, 900),
    ]
    assert hindsight_arms(segments, "low", CLASSES) == {"greedy": "k=2", "hot": "off"}
    assert hindsight_arms(segments, "high", CLASSES) == {"greedy": "off", "hot": "off"}
    # the median over the repetitions so far: one lucky segment does not decide
    more = [seg("static:k=2", "low", 90, 80), seg("static:k=2", "low", 95, 80)]
    assert hindsight_arms(segments + more, "low", CLASSES)["greedy"] == "off"
    with pytest.raises(ValueError, match="class 'greedy' in phase 'mid'"):
        hindsight_arms(segments, "mid", CLASSES)


# --- analysis --------------------------------------------------------------------------

CLASSES = ["greedy", "hot"]
PHASES = [("low", 10.0), ("high", 20.0)]
# tokens per (policy, phase, class) in a 10 s window with 5 engine CPU seconds
TOKENS = {
    ("static:off", "low"): {"greedy": 100, "hot": 100},
    ("static:k=2", "low"): {"greedy": 200, "hot": 80},
    ("static:off", "high"): {"greedy": 300, "hot": 300},
    ("static:k=2", "high"): {"greedy": 330, "hot": 200},
    ("specctl", "low"): {"greedy": 190, "hot": 95},
    ("specctl", "high"): {"greedy": 320, "hot": 290},
    ("peer", "low"): {"greedy": 150, "hot": 90},
    ("peer", "high"): {"greedy": 250, "hot": 250},
}


def _raw(reps: int = 2) -> dict[str, Any]:
    segments = []
    for rep in range(reps):
        for (policy, phase), tokens in TOKENS.items():
            arm = "off" if policy == "static:off" else "k=2"
            segments.append(
                {
                    "policy": policy,
                    "repetition": rep,
                    "phase": phase,
                    "window_s": 10.0,
                    "engine_cpu_s": 5.0 * (1 + 0.1 * rep),
                    "classes": {
                        c: {
                            "tokens": n,
                            "rounds": n,
                            "accepted": 0,
                            "drafted": 0,
                            "arm_rounds": {arm: n} if policy.startswith("static") else
                            {"off": n // 2, "k=2": n - n // 2},
                        }
                        for c, n in tokens.items()
                    },
                }
            )  # fmt: skip
    return {
        "segments": segments,
        "repetitions": reps,
        "policies": [{"name": n} for n in ("static:off", "static:k=2", "specctl", "peer")],
    }


def test_the_sidecars_cpu_is_summarized_per_policy_and_reported() -> None:
    raw = _raw(2)
    # specctl's sidecar: 0.3 and 0.5 s of CPU over its 10 s windows; the peer records none
    for s in raw["segments"]:
        if s["policy"] == "specctl":
            s["sidecar_cpu_s"] = 0.3 if s["phase"] == "low" else 0.5
        elif s["policy"].startswith("static"):
            s["sidecar_cpu_s"] = 0.02
    out = summarize(raw, classes=CLASSES, phases=PHASES)
    assert out["policies"]["specctl"]["sidecar_cores"] == pytest.approx(0.04)
    assert out["policies"]["static:off"]["sidecar_cores"] == pytest.approx(0.002)
    assert out["policies"]["peer"]["sidecar_cores"] is None  # a run from before the field
    report = format_report({**out, "workload": {"classes": [{"name": c} for c in CLASSES]}})
    assert "sidecar CPU (cores, median per segment): static:off 0.002" in report
    assert "specctl 0.040, peer -" in report


def test_oracle_and_ratios_follow_from_the_measurements() -> None:
    out = summarize(_raw(), classes=CLASSES, phases=PHASES)
    oracle = out["oracle"]["cpu"]
    assert oracle["arms"] == {"low": {"greedy": "k=2", "hot": "off"},
                              "high": {"greedy": "k=2", "hot": "off"}}  # fmt: skip
    # per CPU second in repetition 0: tokens / 5
    low = (200 + 100) / 5
    high = (330 + 300) / 5
    oracle0 = (low * 10 + high * 20) / 30
    assert oracle["goodput"]["per_repetition"][0] == pytest.approx(oracle0, abs=1e-3)
    spec = out["policies"]["specctl"]["cpu"]
    mine0 = ((190 + 95) / 5 * 10 + (320 + 290) / 5 * 20) / 30
    assert spec["goodput"]["per_repetition"][0] == pytest.approx(mine0, abs=1e-3)
    assert spec["vs_oracle"]["per_repetition"][0] == pytest.approx(mine0 / oracle0, abs=1e-3)
    off0 = ((200 / 5) * 10 + (600 / 5) * 20) / 30
    assert spec["vs_no_spec"]["per_repetition"][0] == pytest.approx(mine0 / off0, abs=1e-3)
    # the best single static arm over the run: off (93.3) beats k=2 (88.9)
    assert oracle["best_static_arm"] == "off"
    assert spec["vs_best_static"]["median"] == spec["vs_no_spec"]["median"]
    peer0 = ((150 + 90) / 5 * 10 + (250 + 250) / 5 * 20) / 30
    assert spec["vs_peers"]["peer"]["per_repetition"][0] == pytest.approx(mine0 / peer0, abs=1e-3)
    # per phase and class
    assert spec["phases"]["low"]["classes"]["hot"]["vs_oracle"]["median"] == pytest.approx(0.95)
    # the CPU clock scales by repetition, the wall clock does not: wall ratios are equal
    wall = out["policies"]["specctl"]["wall"]["vs_oracle"]["per_repetition"]
    assert wall[0] == wall[1]
    assert out["policies"]["specctl"]["off_share"] == pytest.approx(
        {"greedy": 0.5, "hot": 0.5}, abs=0.01
    )
    assert out["policies"]["static:k=2"]["off_share"]["greedy"] == 0.0
    assert out["headline"]["cpu"]["vs_oracle"] == spec["vs_oracle"]
    report = format_report({**out, "workload": {"classes": [{"name": c} for c in CLASSES]}})
    paired = out["policies"]["specctl"]["wall"]["vs_peers"]["peer"]["median"]
    assert paired > 1.0
    assert (
        "specctl over each learning policy, repetition by repetition (median and range per "
        f"wall second): peer {paired:.3f}" in report
    )


def test_static_arms_measure_themselves_against_the_oracle() -> None:
    out = summarize(_raw(1), classes=CLASSES, phases=PHASES)
    for phase in ("low", "high"):
        for c in CLASSES:
            arm = out["oracle"]["cpu"]["arms"][phase][c]
            e = out["policies"][f"static:{arm}"]["cpu"]["phases"][phase]["classes"][c]
            assert e["vs_oracle"]["median"] == 1.0
    # no static arm beats the oracle, which picks per class
    for name in ("static:off", "static:k=2"):
        assert out["policies"][name]["cpu"]["vs_oracle"]["median"] <= 1.0


def test_hindsight_is_a_reference_not_a_peer() -> None:
    raw = _raw(1)
    for phase, tokens in (
        ("low", {"greedy": 190, "hot": 98}),
        ("high", {"greedy": 310, "hot": 300}),
    ):
        raw["segments"].append(
            {
                "policy": "hindsight",
                "repetition": 0,
                "phase": phase,
                "window_s": 10.0,
                "engine_cpu_s": 5.0,
                "pinned": {"greedy": "k=2", "hot": "off"},
                "classes": {
                    c: {"tokens": n, "rounds": n, "accepted": 0, "drafted": 0, "arm_rounds": {}}
                    for c, n in tokens.items()
                },
            }
        )
    raw["policies"].append({"name": "hindsight"})
    out = summarize(raw, classes=CLASSES, phases=PHASES)
    entry = out["policies"]["hindsight"]
    assert entry["variant"] == "reference"
    assert "hindsight" not in out["policies"]["specctl"]["cpu"]["vs_peers"]
    # the oracle's arms are chosen among the static arms only
    assert out["oracle"]["cpu"]["arms"]["high"] == {"greedy": "k=2", "hot": "off"}
    # run together, the oracle's arms fall short of the oracle's sum
    low = entry["wall"]["phases"]["low"]["vs_oracle"]["median"]
    assert low == pytest.approx((190 + 98) / (200 + 100), abs=1e-3)
    assert out["hindsight_arms"]["low"] == {"greedy": "k=2", "hot": "off"}
    assert "hindsight pinned (last repetition): low: greedy k=2" in format_report(
        {**out, "workload": {"classes": [{"name": c} for c in CLASSES]}}
    )


def test_off_is_counted_where_the_sweep_says_speculation_wins() -> None:
    """Per (phase, class) where an arm beats off by 10% or more in the sweep, the share of
    the class's rounds specctl ran off, per repetition."""
    raw = _raw(2)
    # specctl runs greedy off on a quarter of its rounds at low load in repetition 1
    for s in raw["segments"]:
        if s["policy"] == "specctl" and s["phase"] == "low" and s["repetition"] == 1:
            s["classes"]["greedy"]["arm_rounds"] = {"off": 50, "k=2": 150}
    wins = summarize(raw, classes=CLASSES, phases=PHASES)["headline"]["off_where_speculation_wins"]
    # greedy: k=2 200 against off's 100 at low load, 330 against 300 at high (1.10x, the
    # bar); hot gains nowhere
    assert [(w["phase"], w["class"], w["arm"], w["gain"]) for w in wins] == [
        ("low", "greedy", "k=2", 2.0),
        ("high", "greedy", "k=2", 1.1),
    ]
    assert wins[0]["off_share"]["per_repetition"] == [0.5, 0.25]
    assert wins[1]["off_share"]["median"] == 0.5
    out = summarize(raw, classes=CLASSES, phases=PHASES)
    report = format_report({**out, "workload": {"classes": [{"name": c} for c in CLASSES]}})
    assert (
        "run off where an arm beats off by 10% or more in the sweep (per repetition): "
        "low greedy (k=2 2.00x) 50.0% 25.0%; high greedy (k=2 1.10x) 50.0% 50.0%" in report
    )
    # without off in the sweep there is nothing to measure the gain against
    raw["segments"] = [s for s in raw["segments"] if s["policy"] != "static:off"]
    raw["policies"] = [p for p in raw["policies"] if p["name"] != "static:off"]
    out = summarize(raw, classes=CLASSES, phases=PHASES)
    assert out["headline"]["off_where_speculation_wins"] == []


def test_the_best_measured_assignment_is_the_best_static_choice_the_engine_ran() -> None:
    """Per phase, the static arm or hindsight's arms with the highest median: a reference
    an engine reached, next to the oracle's sum of classes measured in other batches."""
    raw = _raw(1)
    # together the oracle's arms lose to a static arm at high load, beat them at low
    together = (("low", {"greedy": 190, "hot": 98}), ("high", {"greedy": 300, "hot": 290}))
    for phase, tokens in together:
        raw["segments"].append(
            {
                "policy": "hindsight", "repetition": 0, "phase": phase, "window_s": 10.0,
                "engine_cpu_s": 5.0, "pinned": {"greedy": "k=2", "hot": "off"},
                "classes": {
                    c: {"tokens": n, "rounds": n, "accepted": 0, "drafted": 0, "arm_rounds": {}}
                    for c, n in tokens.items()
                },
            }
        )  # fmt: skip
    raw["policies"].append({"name": "hindsight"})
    out = summarize(raw, classes=CLASSES, phases=PHASES)
    measured = out["oracle"]["wall"]["best_measured"]
    assert measured["by_phase"] == {"low": "hindsight", "high": "off"}
    # per wall second: low (190 + 98) / 10, high (300 + 300) / 10, weighted 10:20
    m0 = (28.8 * 10 + 60.0 * 20) / 30
    o0 = ((200 + 100) / 10 * 10 + (330 + 300) / 10 * 20) / 30
    assert measured["goodput"]["median"] == pytest.approx(m0, abs=1e-3)
    assert measured["vs_oracle"]["median"] == pytest.approx(m0 / o0, abs=1e-3)
    spec = out["policies"]["specctl"]["wall"]
    mine0 = ((190 + 95) / 10 * 10 + (320 + 290) / 10 * 20) / 30
    assert spec["vs_best_measured"]["median"] == pytest.approx(mine0 / m0, abs=1e-3)
    high = spec["phases"]["high"]["vs_best_measured"]["median"]
    assert high == pytest.approx(610 / 600, abs=1e-3)
    assert out["headline"]["wall"]["vs_best_measured"] == spec["vs_best_measured"]
    report = format_report({**out, "workload": {"classes": [{"name": c} for c in CLASSES]}})
    assert (
        "best measured assignment (per phase, the static arm or hindsight's arms with the "
        f"highest median): low hindsight, high off; {m0 / o0:.3f} of the oracle" in report
    )
    assert f"best measured {mine0 / m0:.3f}" in report
    # without a static segment there is nothing measured to compare with
    bare = summarize(
        {**raw, "segments": [s for s in raw["segments"] if s["policy"] == "specctl"],
         "policies": [{"name": "specctl"}]},
        classes=CLASSES, phases=PHASES,
    )  # fmt: skip
    assert bare["oracle"]["wall"]["best_measured"] is None
    assert bare["headline"]["wall"]["vs_best_measured"]["median"] is None


def _evidence_row(rep: int, phase: str, cls: str, goodput: dict[str, float], **kw: Any) -> dict:
    row = {
        "policy": "specctl", "repetition": rep, "phase": phase, "class": cls,
        "measured": True, "current": True,
        "estimates": {a: {"goodput": g, "tokens": 1.0, "prob_best": 0.5}
                      for a, g in goodput.items()},
    }  # fmt: skip
    return {**row, **kw}


def test_specctls_beliefs_are_set_next_to_the_sweep() -> None:
    """Per phase and class, the last measured evidence of each repetition: what specctl
    believes each swept arm gives over off, next to the sweep's own ratio."""
    raw = _raw(2)
    raw["timeline"] = [
        # the last measured sample in the phase's bucket counts; earlier ones, unmeasured
        # ones and other buckets' do not
        _evidence_row(0, "low", "greedy", {"off": 10.0, "k=2": 5.0}),
        _evidence_row(0, "low", "greedy", {"off": 10.0, "k=2": 16.0}),
        _evidence_row(0, "low", "greedy", {"off": 10.0, "k=2": 1.0}, measured=False),
        _evidence_row(0, "low", "greedy", {"off": 10.0, "k=2": 1.0}, current=False),
        _evidence_row(1, "low", "greedy", {"off": 10.0, "k=2": 9.0}),
        _evidence_row(0, "low", "hot", {"off": 10.0, "k=2": 12.0, "k=3": 13.0}),
        _evidence_row(0, "high", "hot", {"off": 10.0}),
    ]
    out = summarize(raw, classes=CLASSES, phases=PHASES)
    b = out["beliefs"]
    greedy = b["low"]["greedy"]
    assert greedy["sweep"] == {"off": 1.0, "k=2": 2.0}  # 200 against 100 tokens
    assert greedy["sweep_best"] == "k=2"
    assert greedy["believed"] == {"off": [1.0, 1.0], "k=2": [1.6, 0.9]}
    assert greedy["believed_best"] == ["k=2", "off"]
    hot = b["low"]["hot"]
    assert hot["sweep"] == {"off": 1.0, "k=2": 0.8} and hot["sweep_best"] == "off"
    # an arm the sweep did not run is not compared, but can be believed best
    assert hot["believed"] == {"off": [1.0], "k=2": [1.2]} and hot["believed_best"] == ["k=3"]
    # an arm without an estimate has no ratio
    assert b["high"]["hot"]["believed"]["k=2"] == [None]
    assert "greedy" not in b["high"]
    report = format_report({**out, "workload": {"classes": [{"name": c} for c in CLASSES]}})
    assert "specctl's belief at the end of each phase" in report
    assert "  low greedy: best k=2, believed k=2, off; off 1.00/1.00, k=2 2.00/1.25" in report
    # a run without evidence has no beliefs
    assert "beliefs" not in summarize(_raw(2), classes=CLASSES, phases=PHASES)
