"""How long after a class's draft acceptance drops does SpecctlAcceptanceDrop fire?

Runs the production rules (deploy/prometheus/specctl.rules.yml) under
``promtool test rules`` on synthetic counters: a class with steady traffic
whose first-token acceptance steps from ``--baseline`` down to a fraction of it
after 7h, and reports, per fraction, the first minute at which the alert is
firing (or that it never fires within ``--horizon`` minutes).

    python benchmarks/alert_detection_delay.py
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "specctl.rules.yml"
LABELS = 'namespace="serving",job="specctl",instance="a:9400",workload_class="c",drafter="d"'
DROP_AT = 420  # minutes: the 6h baseline is full by then


def _case(fraction: float, baseline: float, rounds_per_min: int, horizon: int) -> dict:
    accepted_per_min = round(rounds_per_min * baseline)
    dropped_per_min = round(rounds_per_min * baseline * fraction)
    end = DROP_AT + horizon
    at_drop = accepted_per_min * DROP_AT
    return {
        "interval": "1m",
        "input_series": [
            {
                "series": f"specctl_request_rounds_total{{{LABELS}}}",
                "values": f"0+{rounds_per_min}x{end}",
            },
            {
                "series": f'specctl_accepted_tokens_per_position_total{{{LABELS},position="1"}}',
                "values": f"0+{accepted_per_min}x{DROP_AT} "
                f"{at_drop + dropped_per_min}+{dropped_per_min}x{horizon - 1}",
            },
        ],
        # one check per minute after the drop, each expecting silence: promtool
        # reports the ones that fail, i.e. the minutes at which the alert fired
        "alert_rule_test": [
            {"alertname": "SpecctlAcceptanceDrop", "eval_time": f"{m}m", "exp_alerts": []}
            for m in range(DROP_AT, end + 1)
        ],
    }


def first_firing_minute(promtool: str, workdir: Path, case: dict) -> int | None:
    test = workdir / "delay.test.yml"
    test.write_text(yaml.safe_dump({"rule_files": [RULES.name], "tests": [case]}))
    result = subprocess.run(
        [promtool, "test", "rules", test.name], cwd=workdir, capture_output=True, text=True
    )
    out = result.stdout + result.stderr  # failures are printed on stderr
    minutes = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("alertname: SpecctlAcceptanceDrop, time:"):
            text = line.split("time:", 1)[1].strip().rstrip(",")
            hours, _, rest = text.partition("h")
            minutes.append(int(hours or 0) * 60 + int(rest.rstrip("m") or 0))
    return min(minutes) - DROP_AT if minutes else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=float, default=0.8, help="first-token acceptance")
    parser.add_argument("--rounds-per-min", type=int, default=6000)
    parser.add_argument("--horizon", type=int, default=60, help="minutes watched after the drop")
    parser.add_argument(
        "--fractions", default="0.1,0.3,0.5,0.6,0.65,0.7,0.8", help="acceptance after / before"
    )
    args = parser.parse_args()
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool is not installed (Debian package prometheus)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        shutil.copy(RULES, workdir / RULES.name)
        print(f"baseline first-token acceptance {args.baseline}, production windows (5m/6h/10m)")
        print("acceptance after drop | alert firing after")
        for fraction in (float(f) for f in args.fractions.split(",")):
            case = _case(fraction, args.baseline, args.rounds_per_min, args.horizon)
            delay = first_firing_minute(promtool, workdir, case)
            shown = f"{delay} min" if delay is not None else f"never (within {args.horizon} min)"
            print(f"{fraction:>20.0%}  | {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
