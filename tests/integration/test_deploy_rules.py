"""The Prometheus rules: promtool accepts them, their unit tests pass and cover
every alert both firing and not, and the PrometheusRule carries the same groups."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import yaml
from deploy_support import (
    DEPLOY,
    ROOT,
    RULES_FILE,
    alert_names,
    load_rules,
)
from docs_support import anchors

PROM_DIR = DEPLOY / "prometheus"
RULES_TEST = PROM_DIR / "specctl.rules.test.yml"
PROMETHEUS_RULE = DEPLOY / "k8s" / "base" / "prometheusrule.yaml"
RENDER = PROM_DIR / "render.py"
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (make system-deps installs Debian's prometheus)"
    return subprocess.run(
        [promtool, *args], cwd=PROM_DIR, capture_output=True, text=True, timeout=120
    )


def _render(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(RENDER), *args], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout


def test_promtool_checks_the_rules() -> None:
    result = _promtool("check", "rules", RULES_FILE.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(load_rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = _promtool("test", "rules", RULES_TEST.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = set(alert_names())
    assert alerts, "no alerts in the rules file"
    assert alerts - firing == set(), "alerts without a firing case"
    assert alerts - quiet == set(), "alerts without a not-firing case"


def test_every_alert_is_documented() -> None:
    runbooks = anchors(RUNBOOKS)
    for rule in load_rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        annotations = rule.get("annotations", {})
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert annotations["runbook_url"] == f"docs/runbooks.md#{name.lower()}", name
        assert name.lower() in runbooks, f"no runbook for {name}"


def test_every_runbook_url_lands_on_a_heading() -> None:
    """The rules, their unit tests and the PrometheusRule all name runbooks by a path
    from the repository root and a heading's anchor: both must exist."""
    urls = [
        (path.name, url)
        for path in (RULES_FILE, RULES_TEST, PROMETHEUS_RULE)
        for url in re.findall(r"runbook_url:\s*\"?([^\"\s]+)", path.read_text())
    ]
    assert len(urls) > len(alert_names()), "the files name fewer runbooks than there are alerts"
    for source, url in urls:
        path, _, anchor = url.partition("#")
        assert (ROOT / path).is_file(), f"{source}: {url}: no file {path}"
        assert anchor in anchors(ROOT / path), f"{source}: {url}: no heading #{anchor}"


def test_prometheus_rule_is_generated_from_the_rules_file() -> None:
    committed = PROMETHEUS_RULE.read_text()
    assert committed == _render("prometheusrule"), (
        "regenerate: python deploy/prometheus/render.py prometheusrule > "
        "deploy/k8s/base/prometheusrule.yaml"
    )
    resource = yaml.safe_load(committed)
    assert resource["kind"] == "PrometheusRule"
    assert resource["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]


def test_short_window_copy_is_valid_and_only_changes_windows(tmp_path) -> None:
    text = _render("rules", "--window", "5m=10s", "--window", "6h=2m", "--for", "10m=20s")
    short = tmp_path / "short.rules.yml"
    short.write_text(text)
    result = _promtool("check", "rules", str(short))
    assert result.returncode == 0, result.stdout + result.stderr
    rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    assert [r.get("record") or r.get("alert") for r in rules] == [
        r.get("record") or r.get("alert") for r in load_rules()
    ]
    exprs = "\n".join(str(r["expr"]) for r in rules)
    assert "[5m]" not in exprs and "[6h]" not in exprs
    assert "[10s]" in exprs and "[2m]" in exprs
    drop = next(r for r in rules if r.get("alert") == "SpecctlAcceptanceDrop")
    assert drop["for"] == "20s"
