"""Replay output: the ranked table, JSON, and a Markdown report with PNG plots."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specctl.decisionlog.reader import LogProblem
from specctl.replay.evaluate import ADAPTIVE_RANK_BY, Evaluation, Result


def _num(x: float, fmt: str) -> str:
    return format(x, fmt) if math.isfinite(x) else "n/a"


def _ordered(evaluation: Evaluation, scope: str) -> list[tuple[int, Result, bool]]:
    """Rows of a scope: each candidate's results, candidates in rank order, primary first."""
    out = []
    for rank, primary in enumerate(evaluation.ranking(scope), start=1):
        out.append((rank, primary, True))
        out.extend(
            (rank, r, False)
            for r in evaluation.results
            if r.scope == scope and r.candidate == primary.candidate and r is not primary
        )
    return out


def format_table(evaluation: Evaluation) -> str:
    """One ranked table per scope; the ranking estimator's row carries the rank."""
    lines: list[str] = []
    for scope in evaluation.scopes:
        rows = _ordered(evaluation, scope)
        if not rows:
            continue
        lines.append(f"== {scope} ==")
        lines.append(
            f"{'rank':>4}  {'policy':<24} {'estimator':<9} {'goodput tok/s':>14} "
            f"{'95% interval':>21} {'tok/round':>9} {'ms/round':>8} {'ess':>8}  notes"
        )
        notes: list[str] = []
        for rank, r, primary in rows:
            e = r.estimate
            marks = ""
            for w in r.warnings:
                notes.append(w)
                marks += f"[{len(notes)}]"
            interval = f"[{_num(e.goodput_low, '.1f')}, {_num(e.goodput_high, '.1f')}]"
            lines.append(
                f"{(str(rank) if primary else ''):>4}  {r.candidate:<24} {r.estimator:<9} "
                f"{_num(e.goodput, '.1f'):>14} "
                f"{interval:>21} "
                f"{_num(e.value.tokens_per_round, '.3f'):>9} "
                f"{_num(e.value.seconds_per_round * 1e3, '.3f'):>8} "
                f"{e.effective_sample_size:>8.0f}  {marks}"
            )
        lines.extend(f"  [{i}] {w}" for i, w in enumerate(notes, start=1))
        lines.append("")
    return "\n".join(lines)


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def to_json(
    evaluation: Evaluation, *, files: list[str], rows: int, problems: list[LogProblem]
) -> dict[str, Any]:
    """Everything the table says, and more, as plain JSON (NaN becomes null)."""
    results = []
    for r in evaluation.results:
        e = r.estimate
        item = asdict(e)
        item.pop("value")
        item.update(
            candidate=r.candidate,
            estimator=r.estimator,
            scope=r.scope,
            goodput=e.goodput,
            tokens_per_round=e.value.tokens_per_round,
            seconds_per_round=e.value.seconds_per_round,
            warnings=list(r.warnings),
            notes=list(e.notes),
        )
        results.append(item)
    ranking = {
        scope: [
            {
                "rank": i,
                "candidate": r.candidate,
                "estimator": r.estimator,
                "goodput": r.estimate.goodput,
            }
            for i, r in enumerate(evaluation.ranking(scope), start=1)
        ]
        for scope in evaluation.scopes
    }
    return _clean(
        {
            "files": files,
            "rows": rows,
            "problems": [asdict(p) for p in problems],
            "rank_by": evaluation.rank_by,
            "reward": "goodput = committed tokens (accepted + 1) per second of engine time",
            "ranking": ranking,
            "results": results,
        }
    )


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _plot(evaluation: Evaluation, scope: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for _rank, r, _p in _ordered(evaluation, scope)]
    labels = [f"{r.candidate}  ({r.estimator})" for r in rows]
    values = [r.estimate.goodput for r in rows]
    lo = [max(v - r.estimate.goodput_low, 0.0) for v, r in zip(values, rows, strict=True)]
    hi = [max(r.estimate.goodput_high - v, 0.0) for v, r in zip(values, rows, strict=True)]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    y = list(range(len(rows)))[::-1]
    ax.errorbar(values, y, xerr=[lo, hi], fmt="o", capsize=3, color="tab:blue", ecolor="tab:gray")
    ax.set_yticks(y, labels)
    ax.set_xlabel("goodput, committed tokens per second of engine time")
    ax.set_title(f"estimated goodput with 95% intervals: {scope}")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(
    directory: Path,
    evaluation: Evaluation,
    *,
    files: list[str],
    rows: int,
    problems: list[LogProblem],
) -> Path:
    """A Markdown report with the tables and one goodput plot per scope; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    parts = [
        "# Offline replay report",
        "",
        f"{rows} logged request-rounds from {len(files)} file(s). Goodput is committed tokens "
        "(accepted + 1) per second of engine time; intervals are 95% bootstrap intervals over "
        f"steps. Ranked by `{evaluation.rank_by}` (adaptive policies by `{ADAPTIVE_RANK_BY}`).",
        "",
    ]
    if problems:
        parts += ["## Input left out", ""] + [f"- {p}" for p in problems] + [""]
    for scope in evaluation.scopes:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in scope)
        png = directory / f"goodput-{safe}.png"
        _plot(evaluation, scope, png)
        parts += [f"## {scope}", "", f"![goodput {scope}]({png.name})", ""]
    parts += ["## Tables", "", "```", format_table(evaluation), "```", ""]
    path = directory / "report.md"
    path.write_text("\n".join(parts))
    return path
