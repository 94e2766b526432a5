"""Helpers for the deploy tests: the metric names specctl and vLLM export, the
metric names a PromQL expression reads, and the dashboard's queries."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
RULES_FILE = DEPLOY / "prometheus" / "specctl.rules.yml"
DASHBOARD = DEPLOY / "grafana" / "specctl.json"

_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(r"(?<![\w.:])[A-Za-z_:][A-Za-z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (Grafana variables allowed)."""
    text = expr.replace("$__rate_interval", "1m")
    text = re.sub(r"\$\{?\w+\}?", "x", text)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or token.lower() in _KEYWORDS:
            continue
        names.add(token)
    return names


def specctl_metric_names() -> set[str]:
    """Every series name the sidecar's registry exports."""
    from specctl.decisionlog import DecisionLogMetrics
    from specctl.sidecar.fleet_store import FleetMetrics
    from specctl.sidecar.metrics import SidecarMetrics
    from specctl.sidecar.snapshot import SnapshotMetrics

    registry = SidecarMetrics().registry
    SnapshotMetrics(registry)
    DecisionLogMetrics(registry)
    FleetMetrics(registry)
    families = list(registry.collect())
    names: set[str] = set()
    for family in families:
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count", "_created")}
        else:
            names.add(family.name)
    return names


def vllm_metric_names() -> set[str]:
    """Series names vLLM's metrics loggers define, read from its source without importing it."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    bases: set[str] = set()
    for path in [*(root / "v1" / "metrics").glob("*.py"), root / "v1/spec_decode/metrics.py"]:
        bases |= set(re.findall(r'"(vllm:[a-z0-9_]+)"', path.read_text()))
    suffixes = ("", "_total", "_created", "_bucket", "_sum", "_count")
    return {base + s for base in bases for s in suffixes}


def load_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in load_rules() if "record" in rule}


def alert_names() -> list[str]:
    return [rule["alert"] for rule in load_rules() if "alert" in rule]


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"]
            exprs.append(query.removeprefix("label_values(").rsplit(",", 1)[0])
    return exprs
