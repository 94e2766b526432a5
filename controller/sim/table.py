"""A target model's speculative decoding behaviour, read from a measured sweep table.

The table has the columns of the AMD study's appendix (``target, method, bench,
baseline_tok_s, N, speedup, MAL, perpos_marginal``; see ``data/README.md``).
For one target it defines:

- the workload classes: the distinct ``bench`` values;
- the drafters: one per ``method`` (``Native MTP`` -> ``mtp``, ``EAGLE-3`` ->
  ``eagle3``, ...), offered up to the largest ``N`` measured;
- per (class, drafter, K) the conditional acceptance at positions 1..K,
  ``c_i = p_i / p_(i-1)`` from ``perpos_marginal`` (``p_i`` = P(at least i
  accepted)). A K that was not measured uses the first K positions of the
  smallest measured N above it;
- per (class, drafter, K) the cost of one round in baseline decode steps at
  the table's operating point, ``MAL / speedup``. Unmeasured K interpolate
  linearly between measured ones; below the smallest measured N the cost
  follows a least-squares line ``a + b*N`` through the drafter's rows. ``off``
  costs 1 and commits 1 token.

Load model. A row is one operating point; the table says nothing about batch
size. We take it to be a batch of ``REFERENCE_BATCH`` running requests and
let the *extra* cost of speculation over a plain decode step (intercept and
slope alike) grow with the batch size ``B``::

    cost_K(B) = 1 + (cost_K(B_ref) - 1) * g(B) / g(B_ref),   g(B) = 1 + s * (sqrt(B) - 1)

Larger batches leave less idle compute for verification, so drafts get
dearer. ``s = LOAD_SLOPE`` is fitted to the published DeepSeek-V3 MTP curve on
8x MI300X (speedup 2.11x at concurrency 1, 1.70x at 8, 1.44x at 32, 1.25x at
64) assuming a mean acceptance length of 2.7; the fit gives 2.11, 1.77, 1.42,
1.22. Long proposal lengths fall below no speculation at high concurrency, as
fixed K=7 does at concurrency 256 in vLLM's DeepSeek-V4 measurement. The
absolute time of a plain decode step is ``B_ref / baseline_tok_s`` at the
reference batch and grows as ``(1 + B / 64)``: throughput rises with batch
size and saturates.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from specctl.arms import Arm, arms_for

REFERENCE_BATCH = 32
LOAD_SLOPE = 0.47
BASE_SATURATION_BATCH = 64.0
REQUIRED_COLUMNS = ("target", "method", "bench", "baseline_tok_s", "N", "speedup", "MAL")
DEFAULT_TABLE = "vllm_amd_specdec_appendix.csv"

# The study's method names, as drafter names in arm syntax.
DRAFTER_NAMES = {
    "Native MTP": "mtp",
    "Gemma 4 MTP": "mtp",
    "EAGLE-3": "eagle3",
    "DFlash": "dflash",
    "DSpark": "dspark",
}

FloatArray = npt.NDArray[np.float64]


class TableError(ValueError):
    """A sweep table that cannot define a simulated target; names the row and column."""


@dataclass(frozen=True)
class Row:
    target: str
    drafter: str
    bench: str
    baseline_tok_s: float
    n: int
    speedup: float
    mal: float
    marginals: tuple[float, ...]

    @property
    def cost(self) -> float:
        """One round of N drafts, in baseline decode steps at the table's operating point."""
        return self.mal / self.speedup


def drafter_name(method: str) -> str:
    """The arm-syntax drafter for a table ``method`` (``EAGLE-3`` -> ``eagle3``)."""
    if method in DRAFTER_NAMES:
        return DRAFTER_NAMES[method]
    name = re.sub(r"[^a-z0-9_.\-]+", "-", method.strip().lower()).strip("-")[:32]
    if not name:
        raise TableError(f"method {method!r} gives no usable drafter name")
    return name


def _parse_row(raw: dict[str, str], where: str) -> Row:
    missing = [c for c in REQUIRED_COLUMNS if c not in raw or raw[c] in (None, "")]
    if missing:
        raise TableError(f"{where}: missing value for column(s) {', '.join(missing)}")

    def number(column: str) -> float:
        try:
            value = float(raw[column])
        except ValueError:
            raise TableError(f"{where}: {column}={raw[column]!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise TableError(f"{where}: {column}={raw[column]!r} must be positive")
        return value

    n_value = number("N")
    if n_value != int(n_value) or not 1 <= n_value <= 64:
        raise TableError(f"{where}: N={raw['N']!r} must be an integer in 1..64")
    n = int(n_value)
    speedup, mal = number("speedup"), number("MAL")
    text = (raw.get("perpos_marginal") or "").split()
    if text:
        try:
            marginals = tuple(float(x) for x in text)
        except ValueError:
            raise TableError(f"{where}: perpos_marginal {raw['perpos_marginal']!r}") from None
        if len(marginals) != n:
            raise TableError(f"{where}: perpos_marginal has {len(marginals)} values, N={n}")
        if any(not 0.0 <= p <= 1.0 for p in marginals) or any(
            b > a + 1e-9 for a, b in itertools.pairwise(marginals)
        ):
            raise TableError(
                f"{where}: perpos_marginal {list(marginals)} must be non-increasing in [0, 1]"
            )
    else:
        # No per-position data: a constant conditional rate that reproduces MAL.
        marginals = _marginals_from_mal(mal, n, where)
    return Row(
        target=raw["target"].strip(),
        drafter=drafter_name(raw["method"]),
        bench=raw["bench"].strip(),
        baseline_tok_s=number("baseline_tok_s"),
        n=n,
        speedup=speedup,
        mal=mal,
        marginals=marginals,
    )


def _marginals_from_mal(mal: float, n: int, where: str) -> tuple[float, ...]:
    if not 1.0 <= mal <= n + 1:
        raise TableError(f"{where}: MAL={mal} must be in [1, N+1]")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        if 1 + sum(a**i for i in range(1, n + 1)) < mal:
            lo = a
        else:
            hi = a
    return tuple(lo**i for i in range(1, n + 1))


def read_rows(path: str | Path | None = None) -> list[Row]:
    """Rows of a sweep table; ``None`` reads the AMD study's appendix shipped with specctl."""
    if path is None:
        text = resources.files("specctl.sim").joinpath("data").joinpath(DEFAULT_TABLE).read_text()
        name = DEFAULT_TABLE
    else:
        text = Path(path).read_text()
        name = str(path)
    reader = csv.DictReader(io.StringIO(text))
    absent = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if absent:
        raise TableError(f"{name}: missing column(s) {', '.join(absent)}")
    return [_parse_row(raw, f"{name} line {i + 2}") for i, raw in enumerate(reader)]


def targets(rows: Iterable[Row]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r.target, None)
    return list(seen)


def load_factor(batch_size: float) -> float:
    """g(B): how the extra cost of speculation grows with the batch size."""
    return 1.0 + LOAD_SLOPE * (math.sqrt(max(batch_size, 1.0)) - 1.0)


@dataclass(frozen=True)
class TargetModel:
    """The ground truth of one simulated target, as arrays indexed [class, arm, position].

    ``arms`` is every arm the engine offers (``off`` first, then each drafter at
    K = 1..max K); ``conditional[c, a, i]`` is the acceptance probability of
    draft position i+1 given the previous ones were accepted (0 beyond K);
    ``cost_ref[c, a]`` is one round's cost at the reference batch, in plain
    decode steps.
    """

    target: str
    classes: tuple[str, ...]
    drafters: dict[str, int]
    arms: tuple[Arm, ...]
    arm_k: npt.NDArray[np.int64]
    conditional: FloatArray
    cost_ref: FloatArray
    baseline_tok_s: float
    rows: tuple[Row, ...]

    @property
    def max_k(self) -> int:
        return int(self.arm_k.max()) if len(self.arm_k) else 0

    def arm_index(self, arm: Arm) -> int:
        return self.arms.index(arm)

    def cost(self, batch_size: float) -> FloatArray:
        """cost[c, a] of one round at this batch size, in plain decode steps (off = 1)."""
        scale = load_factor(batch_size) / load_factor(REFERENCE_BATCH)
        return 1.0 + (self.cost_ref - 1.0) * scale

    def base_step_time_s(self, batch_size: float) -> float:
        """Wall time of a plain decode step of ``batch_size`` requests."""
        ref = REFERENCE_BATCH / self.baseline_tok_s
        return (
            ref
            * (1.0 + batch_size / BASE_SATURATION_BATCH)
            / (1.0 + REFERENCE_BATCH / BASE_SATURATION_BATCH)
        )

    def expected_tokens(self, acceptance_scale: FloatArray | None = None) -> FloatArray:
        """E[committed tokens per round][c, a]: 1 + sum of the marginals.

        ``acceptance_scale[c]`` multiplies every conditional rate of class c (events).
        """
        cond = self.conditional
        if acceptance_scale is not None:
            cond = np.clip(cond * acceptance_scale[:, None, None], 0.0, 1.0)
        return 1.0 + np.cumprod(cond, axis=2).sum(axis=2)


def build_target(rows: Iterable[Row], target: str) -> TargetModel:
    """The simulated target ``target`` from a table's rows; raise TableError if incomplete."""
    mine = [r for r in rows if r.target == target]
    if not mine:
        raise TableError(f"target {target!r} is not in the table")
    classes = tuple(dict.fromkeys(r.bench for r in mine))
    drafters: dict[str, int] = {}
    for r in mine:
        drafters[r.drafter] = max(drafters.get(r.drafter, 0), r.n)
    by_key: dict[tuple[str, str], dict[int, Row]] = {}
    for r in mine:
        entry = by_key.setdefault((r.bench, r.drafter), {})
        if r.n in entry:
            raise TableError(f"{target}: two rows for ({r.bench}, {r.drafter}, N={r.n})")
        entry[r.n] = r
    arms = tuple(arms_for(drafters.items()))
    max_k = max(drafters.values())
    cond = np.zeros((len(classes), len(arms), max_k))
    cost = np.ones((len(classes), len(arms)))
    for ci, bench in enumerate(classes):
        for drafter in drafters:
            measured = by_key.get((bench, drafter))
            if not measured:
                raise TableError(
                    f"{target}: no rows for class {bench!r} with drafter {drafter!r}; "
                    "every class needs every drafter"
                )
            ns = sorted(measured)
            costs = np.array([measured[n].cost for n in ns])
            if len(ns) >= 2:
                slope, intercept = np.polyfit(np.array(ns, dtype=float), costs, 1)
            else:
                slope, intercept = 0.0, float(costs[0])
            for ai, arm in enumerate(arms):
                if arm.drafter != drafter:
                    continue
                k = arm.k
                source = measured[next((n for n in ns if n >= k), ns[-1])]
                marg = np.zeros(k)
                known = source.marginals[:k]
                marg[: len(known)] = known
                prev = np.concatenate(([1.0], marg[:-1]))
                cond[ci, ai, :k] = np.divide(marg, prev, out=np.zeros_like(marg), where=prev > 0)
                if k in measured:
                    cost[ci, ai] = measured[k].cost
                elif k < ns[0]:
                    cost[ci, ai] = max(intercept + slope * k, 1.0 + 1e-3)
                else:
                    cost[ci, ai] = float(np.interp(k, ns, costs))
    baseline = float(np.mean([r.baseline_tok_s for r in mine]))
    return TargetModel(
        target=target,
        classes=classes,
        drafters=drafters,
        arms=arms,
        arm_k=np.array([a.k for a in arms], dtype=np.int64),
        conditional=cond,
        cost_ref=cost,
        baseline_tok_s=baseline,
        rows=tuple(mine),
    )
