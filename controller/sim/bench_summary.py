"""What the simulator benchmark reports of each run: goodput ratios, regret, adaptation.

Ratios are taken per (window, class) cell, where conditions are the same for
the runs compared, and weighted by the cell's traffic in the oracle's run
(:func:`cell_ratios`); regret is counted against the oracle over time, and
adaptation as the steps after an acceptance change until goodput is back
near the oracle's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from specctl.arms import Arm
from specctl.sim.engine import FloatArray, RunRecord
from specctl.sim.scenario import AcceptanceChange, Scenario

ADAPT_WITHIN = 0.05  # "back within 5% of the oracle"
ADAPT_WINDOW_BLOCKS = 5  # trailing window for time-to-adapt, in accounting blocks
REGRET_WINDOWS = 40
SPEC_LOSES_OFF_SHARE = 0.95  # cells where the oracle ran off this often: speculation loses


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 and math.isfinite(a / b) else None


def _goodput(tokens: np.ndarray, time_s: np.ndarray) -> float:
    t = float(time_s.sum())
    return float(tokens.sum()) / t if t > 0 else float("nan")


def _windows(blocks: int) -> list[tuple[int, int]]:
    n = min(REGRET_WINDOWS, blocks)
    edges = np.linspace(0, blocks, n + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges) if b > a]


def window_goodput(run: RunRecord, windows: Sequence[tuple[int, int]]) -> FloatArray:
    """Goodput per [window, class] (NaN where a class ran no time in a window)."""
    tokens = np.stack([run.tokens[a:b].sum(axis=0) for a, b in windows])
    time_s = np.stack([run.time_s[a:b].sum(axis=0) for a, b in windows])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(time_s > 0, tokens / np.where(time_s > 0, time_s, 1.0), np.nan)


def cell_ratios(mine: FloatArray, ref: FloatArray, weights: FloatArray, axis: int) -> FloatArray:
    """Traffic-weighted mean of goodput ratios over (window, class) cells, along ``axis``
    (0: per class, 1: per window); NaN where no cell has traffic.

    Ratios are taken per cell, where conditions are the same for both runs,
    and weighted by the cell's request-rounds in the oracle run. A pooled
    tokens-over-time ratio would not compare like with like: in a closed loop
    a faster policy shifts the batch's class mix, and with load changing over
    the run a policy that slows high-load steps gives them more weight.
    """
    ratio = mine / ref
    ok = np.isfinite(ratio) & (weights > 0)
    w = np.where(ok, weights, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray((w * np.where(ok, ratio, 0.0)).sum(axis=axis) / w.sum(axis=axis))


def cell_ratio(mine: FloatArray, ref: FloatArray, weights: FloatArray) -> float | None:
    """:func:`cell_ratios` over every cell."""
    return _rounded(
        float(cell_ratios(mine.ravel()[None], ref.ravel()[None], weights.ravel()[None], 1)[0])
    )


def adaptation_steps(
    run: RunRecord, oracle: RunRecord, class_id: int, event_step: int, end_step: int
) -> int | None:
    """Steps from an event until the class's goodput over a trailing window, all after the
    event, is within ADAPT_WITHIN of the oracle's over the same window (None: not
    before ``end_step``). Resolution: one accounting block."""
    first = -(-event_step // run.block_steps)  # first block that starts after the event
    last = min(run.tokens.shape[0], end_step // run.block_steps)
    w = ADAPT_WINDOW_BLOCKS
    for b in range(first + w, last + 1):
        mine = _goodput(run.tokens[b - w : b, class_id], run.time_s[b - w : b, class_id])
        best = _goodput(oracle.tokens[b - w : b, class_id], oracle.time_s[b - w : b, class_id])
        if best > 0 and mine >= (1.0 - ADAPT_WITHIN) * best:
            return b * run.block_steps - event_step
    return None


def summarize_run(
    scenario: Scenario, runs: dict[str, RunRecord], best_static: Arm
) -> dict[str, dict[str, Any]]:
    """Per policy: goodput ratios overall and per class, arm shares, regret, adaptation.

    Ratios are traffic-weighted means over (window, class) cells
    (:func:`cell_ratio`), 40 windows over the run. ``goodput_vs_no_spec_where_spec_loses``
    takes only the cells where the oracle ran ``off`` (every arm loses there).
    """
    oracle, off, static = runs["oracle"], runs["static-off"], runs["best-static"]
    classes = scenario.model.classes
    windows = _windows(oracle.tokens.shape[0])
    weights = np.stack([oracle.block_rounds[a:b].sum(axis=0) for a, b in windows])
    oracle_off = np.stack([oracle.block_off_rounds[a:b].sum(axis=0) for a, b in windows])
    with np.errstate(invalid="ignore", divide="ignore"):
        loses = np.nan_to_num(oracle_off / weights) >= SPEC_LOSES_OFF_SHARE
    loses_weights = np.where(loses, weights, 0.0)
    traffic = weights.sum(axis=0) / max(float(weights.sum()), 1.0)
    oracle_arm = [oracle.arms[int(np.argmax(oracle.rounds[c]))] for c in range(len(classes))]
    refs = {k: window_goodput(r, windows) for k, r in (("o", oracle), ("off", off), ("s", static))}
    events = sorted(scenario.events, key=lambda e: e.step)
    out: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        g = window_goodput(run, windows)
        by_class = {k: cell_ratios(g, ref, weights, 0) for k, ref in refs.items()}
        per_class: dict[str, Any] = {}
        for c, cls in enumerate(classes):
            rounds = run.rounds[c]
            n = max(int(rounds.sum()), 1)
            shares = {
                run.arms[a]: round(float(rounds[a]) / n, 4)
                for a in np.argsort(-rounds)
                if rounds[a] > 0
            }
            time_s = float(run.time_s[:, c].sum())
            per_class[cls] = {
                "traffic_share": round(float(traffic[c]), 4),
                "goodput_tok_s": round(float(run.tokens[:, c].sum()) / time_s, 2)
                if time_s > 0
                else None,
                "goodput_vs_oracle": _rounded(by_class["o"][c]),
                "goodput_vs_no_spec": _rounded(by_class["off"][c]),
                "goodput_vs_best_static": _rounded(by_class["s"][c]),
                "oracle_arm": oracle_arm[c],
                "arm_share": shares,
            }
        by_window = cell_ratios(g, refs["o"], weights, 1)
        regret_curve = []
        cumulative = 0.0
        for w, (a, b) in enumerate(windows):
            time_s = run.time_s[a:b].sum(axis=0)
            tokens = run.tokens[a:b].sum(axis=0)
            cumulative += float(np.nansum(refs["o"][w] * time_s - tokens))
            regret_curve.append(
                {
                    "step": min(b * run.block_steps, scenario.steps),
                    "goodput_vs_oracle": _rounded(by_window[w]),
                    "cumulative_regret_tokens": round(cumulative, 1),
                }
            )
        adapt = []
        for i, e in enumerate(events):
            if isinstance(e, AcceptanceChange):
                end = next(
                    (x.step for x in events[i + 1 :] if isinstance(x, AcceptanceChange)),
                    scenario.steps,
                )
                steps = adaptation_steps(run, oracle, classes.index(e.workload_class), e.step, end)
                adapt.append(
                    {
                        "step": e.step,
                        "event": f"{e.workload_class} acceptance x{e.scale:g}",
                        "steps_to_adapt": steps,
                    }
                )
        out[name] = {
            "goodput_tok_s": round(_goodput(run.tokens, run.time_s), 2),
            "goodput_vs_oracle": cell_ratio(g, refs["o"], weights),
            "goodput_vs_no_spec": cell_ratio(g, refs["off"], weights),
            "goodput_vs_best_static": cell_ratio(g, refs["s"], weights),
            "spec_loses_traffic_share": round(
                float(loses_weights.sum() / max(float(weights.sum()), 1.0)), 4
            ),
            "goodput_vs_no_spec_where_spec_loses": cell_ratio(g, refs["off"], loses_weights),
            "classes": per_class,
            "regret_over_time": regret_curve,
            "adaptation": adapt,
            "policy_versions": run.policy_versions,
        }
    return out


def _rounded(x: float) -> float | None:
    return round(float(x), 4) if math.isfinite(x) else None
