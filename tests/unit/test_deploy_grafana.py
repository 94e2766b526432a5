"""The dashboard and the rules read only metrics specctl or vLLM export (or that
specctl's recording rules define); the dashboard goes through the datasource
variable and guards its divisions."""

from __future__ import annotations

import json

from deploy_support import (
    DASHBOARD,
    dashboard_queries,
    load_rules,
    panels,
    promql_metric_names,
    recorded_names,
    specctl_metric_names,
    vllm_metric_names,
)


def test_metric_name_extraction() -> None:
    expr = (
        'sum by (workload_class) (rate(a_total{position="1", job=~"$job"}[$__rate_interval]))'
        " / on (workload_class) group_left () (max(b:c:rate5m) > 0) * 1e-3"
    )
    assert promql_metric_names(expr) == {"a_total", "b:c:rate5m"}


def test_every_query_reads_exported_metrics_only() -> None:
    known = specctl_metric_names() | vllm_metric_names() | recorded_names() | {"up"}
    queries = dashboard_queries()
    assert len(queries) > 20
    read: set[str] = set()
    for expr in queries:
        names = promql_metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names - known == set(), f"unknown metrics {names - known} in {expr!r}"
        read |= names
    # what the issue asks the dashboard to show
    for name in (
        "specctl_accepted_tokens_per_position_total",
        "specctl_arm_rounds_total",
        "specctl_chosen_arm_goodput_tokens_per_second",
        "specctl_no_spec_goodput_tokens_per_second",
        "specctl_engines_in_fallback",
        "specctl_reports_dropped_total",
        "specctl_decision_mode_flips_total",
        "specctl_decision_change_tv_total",
        "specctl_decision_mode_dwell_seconds",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    ):
        assert name in read, name


def test_every_fleet_series_has_a_panel() -> None:
    """Each series of fleet-wide learning (``specctl_fleet_*``) is read by a panel of the
    fleet's row: a series added to FleetMetrics without a panel fails here."""
    from prometheus_client import CollectorRegistry

    from specctl.sidecar.fleet_store import FleetMetrics

    registry = CollectorRegistry()
    FleetMetrics(registry)
    suffix = {"counter": "_total", "histogram": "_bucket"}
    wanted = {f.name + suffix.get(f.type, "") for f in registry.collect()}
    assert len(wanted) == 7, wanted
    dashboard = json.loads(DASHBOARD.read_text())
    rows = [p for p in panels(dashboard) if p["type"] == "row"]
    top = next(r["gridPos"]["y"] for r in rows if r["title"].startswith("Fleet"))
    bottom = min((r["gridPos"]["y"] for r in rows if r["gridPos"]["y"] > top), default=1 << 30)
    read_in_row: set[str] = set()
    for panel in dashboard["panels"]:
        if panel["type"] != "row" and top < panel["gridPos"]["y"] < bottom:
            for target in panel["targets"]:
                read_in_row |= promql_metric_names(target["expr"])
    assert wanted - read_in_row == set(), f"no panel for {wanted - read_in_row}"


def test_panels_use_the_datasource_variable_and_rate_interval() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = []
    for panel in panels(dashboard):
        ids.append(panel["id"])
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            for fn in ("rate(", "increase("):
                for part in expr.split(fn)[1:]:
                    assert part.split(")")[0].endswith("[$__rate_interval]"), (
                        f"{panel['title']}: {fn} without $__rate_interval"
                    )
            # every division is guarded against a zero denominator
            if " / " in expr:
                assert "> 0)" in expr.split(" / ", 1)[1], f"{panel['title']}: unguarded division"
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_rules_read_only_metrics_specctl_exports() -> None:
    known = specctl_metric_names() | recorded_names() | {"up"}
    for rule in load_rules():
        unknown = promql_metric_names(str(rule["expr"])) - known
        assert unknown == set(), f"{rule.get('alert') or rule.get('record')}: {unknown}"
