"""Write specctl's rules in the two shapes deployments need, from one source file.

    python deploy/prometheus/render.py prometheusrule > deploy/k8s/base/prometheusrule.yaml
    python deploy/prometheus/render.py rules --window 5m=10s --window 6h=2m --for 10m=20s

``prometheusrule`` wraps the groups of specctl.rules.yml in a PrometheusRule for
the Prometheus operator. ``rules`` writes the rules file with range windows and
``for`` durations replaced, for a staging cluster or a test that cannot wait
hours; the names of recorded series stay the same.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

RULES_FILE = Path(__file__).resolve().parent / "specctl.rules.yml"
DURATION_RE = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")

HEADER = """\
# Generated from deploy/prometheus/specctl.rules.yml by deploy/prometheus/render.py:
# edit that file and regenerate this one, do not edit it by hand.
"""


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, descriptions) as literal blocks, like the source."""


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_BlockDumper.add_representer(str, _str_presenter)


def load_groups(path: Path = RULES_FILE) -> list[dict[str, Any]]:
    data = yaml.safe_load(path.read_text())
    groups = data.get("groups") if isinstance(data, dict) else None
    if not isinstance(groups, list) or not groups:
        raise SystemExit(f"{path}: expected a top-level 'groups' list")
    return groups


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, width=100)


def prometheus_rule(groups: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "specctl",
            "labels": {
                "app.kubernetes.io/name": "specctl",
                "app.kubernetes.io/component": "alerting",
            },
        },
        "spec": {"groups": groups},
    }


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        old, sep, new = value.partition("=")
        if not sep or not DURATION_RE.match(old) or not DURATION_RE.match(new):
            raise SystemExit(f"{flag} {value!r}: expected OLD=NEW durations, e.g. 5m=10s")
        out[old] = new
    return out


def with_windows(
    groups: list[dict[str, Any]], windows: dict[str, str], fors: dict[str, str]
) -> list[dict[str, Any]]:
    """Replace range selectors ``[old]`` in expressions and ``for: old`` durations."""
    out = []
    for group in groups:
        rules = []
        for rule in group["rules"]:
            rule = dict(rule)
            expr = str(rule["expr"])
            for old, new in windows.items():
                expr = expr.replace(f"[{old}]", f"[{new}]")
            rule["expr"] = expr
            if "for" in rule and rule["for"] in fors:
                rule["for"] = fors[rule["for"]]
            rules.append(rule)
        out.append({**group, "rules": rules})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("prometheusrule", help="the PrometheusRule for deploy/k8s/base")
    rules = sub.add_parser("rules", help="the rules file, optionally with other windows")
    rules.add_argument("--window", action="append", default=[], metavar="OLD=NEW")
    rules.add_argument("--for", dest="fors", action="append", default=[], metavar="OLD=NEW")
    rules.add_argument("--interval", default="", help="evaluation interval of every group")
    args = parser.parse_args(argv)

    groups = load_groups()
    if args.what == "prometheusrule":
        sys.stdout.write(HEADER + dump(prometheus_rule(groups)))
        return 0
    groups = with_windows(groups, _pairs(args.window, "--window"), _pairs(args.fors, "--for"))
    if args.interval:
        if not DURATION_RE.match(args.interval):
            raise SystemExit(f"--interval {args.interval!r}: expected a duration, e.g. 1s")
        groups = [{**g, "interval": args.interval} for g in groups]
    sys.stdout.write(dump({"groups": groups}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
