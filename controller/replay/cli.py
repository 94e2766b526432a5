"""Evaluate candidate policies offline against decision logs.

Examples:
  specctl replay /var/log/specctl/decisions --policy ngram/k=2 --policy ngram/k=4 --policy off
  specctl replay decisions/ --policy static:arm=eagle3/k=3 --policy specctl --json out.json

Every stationary candidate (a static arm) is estimated with inverse propensity
scoring (ipw), self-normalised IPS (snipw), doubly robust (dr), the truncation
model (model) and rejection-sampling replay (replay); adaptive policies with
replay only. The reported value is goodput: committed tokens per second of
engine time, with tokens and time per request-round beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specctl.policy.registry import POLICIES
    from specctl.replay.estimators import ESTIMATORS

    parser.add_argument("logs", nargs="+", metavar="LOG", help="decision log directories or files")
    parser.add_argument(
        "--policy",
        action="append",
        required=True,
        metavar="SPEC",
        help=(
            "a candidate: an arm (ngram/k=4, off), a policy "
            f"({', '.join(sorted(POLICIES))}), or NAME:key=value,..."
        ),
    )
    parser.add_argument(
        "--estimator",
        action="append",
        choices=tuple(ESTIMATORS),
        help="estimators to run (repeatable; default: all)",
    )
    parser.add_argument("--rank-by", choices=tuple(ESTIMATORS), default="dr")
    parser.add_argument("--alpha", type=float, default=0.05, help="1 - interval coverage")
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap replicates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--update-every",
        type=int,
        default=128,
        help="replay: accepted step-contexts between an adaptive candidate's updates",
    )
    parser.add_argument(
        "--min-ess", type=float, default=100.0, help="warn below this effective sample size"
    )
    parser.add_argument(
        "--on-bad-input",
        choices=("fail", "skip"),
        default="fail",
        help="a corrupt file, unknown schema or bad row: stop (fail) or leave it out (skip)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument("--report", type=Path, metavar="DIR", help="write report.md and PNGs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specctl.decisionlog.reader import LogInputError, read_decision_log
    from specctl.replay.candidates import parse_policy_spec
    from specctl.replay.data import prepare
    from specctl.replay.estimators import ESTIMATORS
    from specctl.replay.evaluate import evaluate
    from specctl.replay.report import format_table, to_json, write_json, write_report

    try:
        candidates = [parse_policy_spec(spec) for spec in args.policy]
    except ValueError as exc:
        print(f"specctl replay: {exc}", file=sys.stderr)
        return 2
    progress = not args.no_progress
    try:
        log = read_decision_log(args.logs, on_bad_input=args.on_bad_input, progress=progress)
    except LogInputError as exc:
        print(f"specctl replay: {exc} (--on-bad-input skip leaves it out)", file=sys.stderr)
        return 2
    for problem in log.problems:
        print(f"specctl replay: skipped {problem}", file=sys.stderr)
    if log.num_rows == 0:
        print("specctl replay: no decision log rows to evaluate", file=sys.stderr)
        return 2
    data = prepare(log.table)
    estimators = tuple(args.estimator or ESTIMATORS)
    adaptive = [e for e in estimators if ESTIMATORS[e].uses_rejection_sampling]
    tasks = sum(len(estimators) if c.stationary else len(adaptive) for c in candidates)
    bar = tqdm(
        total=tasks, unit="estimate", desc="replay", disable=None if progress else True, leave=False
    )

    def on_task(label: str) -> None:
        bar.set_postfix_str(label)
        bar.update(1)

    try:
        evaluation = evaluate(
            data,
            candidates,
            estimators=estimators,
            rank_by=args.rank_by,
            alpha=args.alpha,
            n_bootstrap_samples=args.bootstrap,
            random_state=args.seed,
            update_every=args.update_every,
            min_ess=args.min_ess,
            on_task=on_task,
        )
    except ValueError as exc:
        bar.close()
        print(f"specctl replay: {exc}", file=sys.stderr)
        return 2
    bar.close()
    print(
        f"{log.num_rows} request-rounds, {data.num_steps} steps, {data.num_units} step-contexts "
        f"from {len(log.files)} file(s); goodput in committed tokens per second of engine time"
    )
    print(format_table(evaluation))
    files = [str(p) for p in log.files]
    if args.json:
        write_json(
            args.json, to_json(evaluation, files=files, rows=log.num_rows, problems=log.problems)
        )
    if args.report:
        path = write_report(
            args.report, evaluation, files=files, rows=log.num_rows, problems=log.problems
        )
        print(f"report: {path}")
    return 0
