"""Off-policy estimators of a candidate policy's value from a decision log.

In the manner of Open Bandit Pipeline: each estimator is a small frozen
dataclass with ``estimate_policy_value`` (point estimates) and
``estimate_interval`` (bootstrap confidence intervals). The candidate is given
as ``action_dist``, its probability of each arm (columns, ``data.arms``) in
each logged context (rows, ``data.context_*``): the estimators here evaluate a
*stationary* policy; :mod:`specctl.replay.rejection` handles policies that
learn as they go.

Every estimator estimates, per workload class and overall (scope ``"all"``):

- tokens per round: committed tokens (accepted + 1) per request-round;
- seconds per round: engine time per request-round (see :mod:`specctl.replay.data`);
- goodput: their ratio, committed tokens per second of engine time.

Intervals come from a Poisson bootstrap over steps (every unit of a step gets
the step's weight), so rows that shared a step's time and draw stay together.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from specctl.replay.cost import StepCostFitter, StepCostModel
from specctl.replay.data import LoggedRounds

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

SCOPE_ALL = "all"


@dataclass(frozen=True)
class PolicyValue:
    """Per-round value of a policy in one scope."""

    tokens_per_round: float
    seconds_per_round: float

    @property
    def goodput(self) -> float:
        if not self.seconds_per_round > 0.0:
            return float("nan")
        return self.tokens_per_round / self.seconds_per_round


@dataclass(frozen=True)
class IntervalEstimate:
    """A point estimate with (1 - alpha) bootstrap percentile intervals."""

    value: PolicyValue
    goodput_low: float
    goodput_high: float
    tokens_low: float
    tokens_high: float
    seconds_low: float
    seconds_high: float
    rounds: float  # logged request-rounds in scope
    effective_sample_size: float  # see each estimator
    notes: tuple[str, ...] = ()

    @property
    def goodput(self) -> float:
        return self.value.goodput


def scopes(data: LoggedRounds) -> list[str]:
    return [SCOPE_ALL, *data.classes]


def _by_scope(data: LoggedRounds, unit_values: FloatArray) -> FloatArray:
    """Sum unit values (U,) or (U, m) into scopes: row 0 all, row 1 + c class c."""
    values = unit_values if unit_values.ndim == 2 else unit_values[:, None]
    out = np.zeros((1 + len(data.classes), values.shape[1]))
    out[0] = values.sum(axis=0)
    for j in range(values.shape[1]):
        out[1:, j] = np.bincount(data.unit_class, weights=values[:, j], minlength=len(data.classes))
    return out if unit_values.ndim == 2 else out[:, 0]


def importance_weights(data: LoggedRounds, action_dist: FloatArray) -> FloatArray:
    """pi_e(logged arm | context) / logged propensity, per unit."""
    _check_action_dist(data, action_dist)
    return action_dist[data.unit_context, data.unit_arm] / data.unit_propensity


def _check_action_dist(data: LoggedRounds, action_dist: FloatArray) -> None:
    shape = (data.num_contexts, len(data.arms))
    if action_dist.shape != shape:
        raise ValueError(f"action_dist has shape {action_dist.shape}, expected {shape}")


def _ess(data: LoggedRounds, w: FloatArray) -> FloatArray:
    """Kish's effective sample size of the weights, in units, per scope."""
    sums = _by_scope(data, np.column_stack([w, w * w]))
    return np.divide(sums[:, 0] ** 2, sums[:, 1], out=np.zeros(len(sums)), where=sums[:, 1] > 0)


def _percentiles(samples: FloatArray, alpha: float) -> tuple[FloatArray, FloatArray]:
    """Percentile interval per column, ignoring replicates where the value is undefined."""
    lo = np.full(samples.shape[1], np.nan)
    hi = np.full(samples.shape[1], np.nan)
    for j in range(samples.shape[1]):
        col = samples[:, j]
        col = col[np.isfinite(col)]
        if col.size:
            lo[j], hi[j] = np.quantile(col, [alpha / 2, 1 - alpha / 2])
    return lo, hi


def _intervals(
    data: LoggedRounds,
    point: FloatArray,  # (scopes, 2): tokens, seconds
    replicates: FloatArray,  # (B, scopes, 2)
    alpha: float,
    ess: FloatArray,
    notes: list[tuple[str, ...]] | None = None,
) -> dict[str, IntervalEstimate]:
    with np.errstate(divide="ignore", invalid="ignore"):
        goodput = replicates[:, :, 0] / replicates[:, :, 1]
    g_lo, g_hi = _percentiles(goodput, alpha)
    t_lo, t_hi = _percentiles(replicates[:, :, 0], alpha)
    s_lo, s_hi = _percentiles(replicates[:, :, 1], alpha)
    rounds = _by_scope(data, data.unit_rows)
    out = {}
    for i, scope in enumerate(scopes(data)):
        out[scope] = IntervalEstimate(
            value=PolicyValue(float(point[i, 0]), float(point[i, 1])),
            goodput_low=float(g_lo[i]),
            goodput_high=float(g_hi[i]),
            tokens_low=float(t_lo[i]),
            tokens_high=float(t_hi[i]),
            seconds_low=float(s_lo[i]),
            seconds_high=float(s_hi[i]),
            rounds=float(rounds[i]),
            effective_sample_size=float(ess[i]),
            notes=notes[i] if notes else (),
        )
    return out


def _values_of(point: FloatArray, data: LoggedRounds) -> dict[str, PolicyValue]:
    return {
        scope: PolicyValue(float(point[i, 0]), float(point[i, 1]))
        for i, scope in enumerate(scopes(data))
    }


class _TruncationGroups:
    """Units sorted by (context, drafter), for fast grouped sums in the bootstrap."""

    def __init__(self, data: LoggedRounds) -> None:
        nd = max(len(data.drafters), 1)
        spec = data.unit_drafter >= 0
        key = data.unit_context[spec] * nd + data.unit_drafter[spec]
        order = np.argsort(key, kind="stable")
        self.units = np.flatnonzero(spec)[order]
        sorted_key = key[order]
        self.starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
        if not sorted_key.size:
            self.starts = np.zeros(0, dtype=np.int64)
        self.keys = sorted_key[self.starts]
        k = data.unit_tokens_at_k.shape[1]
        u = self.units
        rows_at_k = data.unit_rows[u, None] * (data.unit_k[u, None] >= np.arange(k)[None, :])
        # (units, 3k): tokens, drafts and rounds at each k
        self.matrix = np.hstack([data.unit_tokens_at_k[u], data.unit_drafted_at_k[u], rows_at_k])
        self.num_k = k


@dataclass(frozen=True)
class Resample:
    """The log as one bootstrap replicate sees it (``step_weights`` None: the log itself)."""

    step_weights: FloatArray | None
    cost: StepCostModel

    def unit_weights(self, data: LoggedRounds) -> FloatArray:
        if self.step_weights is None:
            return np.ones(data.num_units)
        return self.step_weights[data.unit_step]

    def unit_seconds(self, data: LoggedRounds, units: IntArray | None = None) -> FloatArray:
        """Seconds per unit (all, or ``units``) as this replicate splits step time."""
        if self.step_weights is None:
            return data.unit_seconds if units is None else data.unit_seconds[units]
        return data.attribute_seconds(self.cost, units)


class Bootstrap:
    """Poisson bootstrap over steps, shared by every estimator and candidate on one log.

    Replicate ``b`` gives each step a Poisson(1) weight (kept as one byte per
    step and replicate) and refits the step cost model under those weights,
    once, so intervals carry the cost model's uncertainty too.
    """

    def __init__(
        self, data: LoggedRounds, n_bootstrap_samples: int = 200, random_state: int | None = None
    ) -> None:
        if n_bootstrap_samples < 1:
            raise ValueError(f"n_bootstrap_samples={n_bootstrap_samples} must be at least 1")
        self.data = data
        self.n = n_bootstrap_samples
        self.original = Resample(None, data.cost)
        self.groups = _TruncationGroups(data)
        rng = np.random.default_rng(random_state)
        self._weights = np.minimum(
            rng.poisson(1.0, (self.n, data.num_steps)), np.iinfo(np.uint8).max
        ).astype(np.uint8)
        fitter = StepCostFitter(
            data.step_bucket, data.step_time_s, data.step_features, data.num_buckets
        )
        self._costs: list[StepCostModel] = []
        chunk = max(1, 8_000_000 // max(data.num_steps, 1))
        for lo in range(0, self.n, chunk):
            self._costs += fitter.fit_many(self._weights[lo : lo + chunk].astype(np.float64))

    def step_weights(self, b: int) -> FloatArray:
        return self._weights[b].astype(np.float64)

    def __iter__(self) -> Iterator[Resample]:
        for b in range(self.n):
            yield Resample(self.step_weights(b), self._costs[b])


@dataclass(frozen=True)
class _RatioEstimator:
    """An estimator whose value per scope is sum(a) / sum(d) over units, tokens and seconds."""

    estimator_name: str = field(init=False, default="")

    def _terms(
        self,
        data: LoggedRounds,
        action_dist: FloatArray,
        resample: Resample,
        groups: _TruncationGroups | None = None,
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        raise NotImplementedError

    def _value(
        self,
        data: LoggedRounds,
        action_dist: FloatArray,
        resample: Resample,
        groups: _TruncationGroups | None = None,
    ) -> FloatArray:
        tok, sec, den = self._terms(data, action_dist, resample, groups)
        c = resample.unit_weights(data)
        sums = _by_scope(data, np.column_stack([c * tok, c * sec, c * den]))
        with np.errstate(divide="ignore", invalid="ignore"):
            return sums[:, :2] / sums[:, 2:3]

    def estimate_policy_value(
        self, data: LoggedRounds, action_dist: FloatArray
    ) -> dict[str, PolicyValue]:
        _check_action_dist(data, action_dist)
        return _values_of(self._value(data, action_dist, Resample(None, data.cost)), data)

    def estimate_interval(
        self,
        data: LoggedRounds,
        action_dist: FloatArray,
        *,
        alpha: float = 0.05,
        n_bootstrap_samples: int = 200,
        random_state: int | None = None,
        bootstrap: Bootstrap | None = None,
    ) -> dict[str, IntervalEstimate]:
        _check_action_dist(data, action_dist)
        bootstrap = bootstrap or Bootstrap(data, n_bootstrap_samples, random_state)
        groups = bootstrap.groups
        point = self._value(data, action_dist, bootstrap.original, groups)
        reps = np.stack([self._value(data, action_dist, r, groups) for r in bootstrap])
        ess = _ess(data, importance_weights(data, action_dist))
        return _intervals(data, point, reps, alpha, ess)


def _step_class_sums(data: LoggedRounds, values: FloatArray) -> FloatArray:
    """Sum unit values (U, m) into (steps, classes, m)."""
    nc = len(data.classes)
    key = data.unit_step * nc + data.unit_class
    out = np.empty((data.num_steps * nc, values.shape[1]))
    for j in range(values.shape[1]):
        out[:, j] = np.bincount(key, weights=values[:, j], minlength=data.num_steps * nc)
    return out.reshape(data.num_steps, nc, values.shape[1])


@dataclass(frozen=True)
class _WeightedRatioEstimator:
    """IPS-style estimators, computed on per-step sums so the bootstrap costs O(steps).

    Tokens and the denominator are sums of fixed unit terms; a unit's seconds
    are its share of the step under the cost model, ``T_s * (x_u . theta) /
    (X_s . theta)``, so the step's share of weighted seconds is ``T_s * (G_s .
    theta) / (X_s . theta)`` with ``G_s = sum_u w_u x_u``: each replicate's
    refitted ``theta`` applies to steps, not rows.
    """

    estimator_name: str = field(init=False, default="")
    self_normalized = False

    def _step_sums(
        self, data: LoggedRounds, action_dist: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        w = importance_weights(data, action_dist)
        den = w * data.unit_rows if self.self_normalized else data.unit_rows
        fixed = _step_class_sums(data, np.column_stack([w * data.unit_tokens, den]))
        features = _step_class_sums(data, w[:, None] * data.unit_cost_features())
        return fixed, features

    @staticmethod
    def _step_seconds(data: LoggedRounds, features: FloatArray, cost: StepCostModel) -> FloatArray:
        """(steps, classes) weighted seconds under ``cost``; an equal split where it predicts 0."""
        theta = cost.coefficients[data.step_bucket]  # (S, p)
        den = np.einsum("sp,sp->s", data.step_features, theta)
        num = np.einsum("scp,sp->sc", features, theta)
        bad = den <= 0.0
        if bad.any():
            num[bad] = features[bad, :, 1]  # the rows feature: split by rows
            den[bad] = data.step_rows[bad]
        return data.step_time_s[:, None] * num / den[:, None]

    @staticmethod
    def _ratio(c: FloatArray | None, fixed: FloatArray, seconds: FloatArray) -> FloatArray:
        if c is None:
            tok, den, sec = fixed[:, :, 0].sum(0), fixed[:, :, 1].sum(0), seconds.sum(0)
        else:
            tok, den, sec = c @ fixed[:, :, 0], c @ fixed[:, :, 1], c @ seconds
        tok = np.r_[tok.sum(), tok]
        den = np.r_[den.sum(), den]
        sec = np.r_[sec.sum(), sec]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.column_stack([tok / den, sec / den])

    def estimate_policy_value(
        self, data: LoggedRounds, action_dist: FloatArray
    ) -> dict[str, PolicyValue]:
        _check_action_dist(data, action_dist)
        fixed, features = self._step_sums(data, action_dist)
        return _values_of(
            self._ratio(None, fixed, self._step_seconds(data, features, data.cost)), data
        )

    def estimate_interval(
        self,
        data: LoggedRounds,
        action_dist: FloatArray,
        *,
        alpha: float = 0.05,
        n_bootstrap_samples: int = 200,
        random_state: int | None = None,
        bootstrap: Bootstrap | None = None,
    ) -> dict[str, IntervalEstimate]:
        _check_action_dist(data, action_dist)
        bootstrap = bootstrap or Bootstrap(data, n_bootstrap_samples, random_state)
        fixed, features = self._step_sums(data, action_dist)
        point = self._ratio(None, fixed, self._step_seconds(data, features, data.cost))
        reps = np.stack(
            [
                self._ratio(r.step_weights, fixed, self._step_seconds(data, features, r.cost))
                for r in bootstrap
            ]
        )
        ess = _ess(data, importance_weights(data, action_dist))
        return _intervals(data, point, reps, alpha, ess)


@dataclass(frozen=True)
class InverseProbabilityWeighting(_WeightedRatioEstimator):
    """IPS: sum_u w_u R_u / rounds. Unbiased where the log gives every arm the
    candidate plays a positive propensity; variance grows with the weights."""

    estimator_name: str = field(init=False, default="ipw")


@dataclass(frozen=True)
class SelfNormalizedInverseProbabilityWeighting(_WeightedRatioEstimator):
    """SNIPS: sum_u w_u R_u / sum_u w_u n_u. Slightly biased, much lower variance
    than IPS when weights are large. Goodput, a ratio of two IPS estimates with
    the same denominator, is the same under IPS and SNIPS."""

    estimator_name: str = field(init=False, default="snipw")
    self_normalized = True


@dataclass(frozen=True)
class ArmModel:
    """Per (context, arm): expected tokens and seconds per round, and support in rounds."""

    tokens: FloatArray  # (contexts, arms)
    seconds: FloatArray
    support: FloatArray  # logged rounds the estimate rests on
    context_rounds: FloatArray  # (contexts,)


def fit_arm_model(
    data: LoggedRounds,
    resample: Resample | None = None,
    groups: _TruncationGroups | None = None,
) -> ArmModel:
    """The truncation model: what each arm yields per round in each context.

    Tokens for ``<drafter>/k=K'`` come from every logged round of that drafter
    at K >= K' in the context, truncated to K' (no importance weights); ``off``
    commits exactly one token. Seconds come from the step cost model.
    """
    resample = resample or Resample(None, data.cost)
    groups = groups or _TruncationGroups(data)
    c_step = resample.step_weights
    c_unit = resample.unit_weights(data)
    cost = resample.cost
    nc, na, nd, k = data.num_contexts, len(data.arms), max(len(data.drafters), 1), groups.num_k
    sums = np.zeros((nc * nd, 3 * k))
    if groups.units.size:
        weighted = groups.matrix * c_unit[groups.units, None]
        sums[groups.keys] = np.add.reduceat(weighted, groups.starts, axis=0)
    sums = sums.reshape(nc, nd, 3, k)
    tok_sum, dr_sum, rows_sum = sums[:, :, 0], sums[:, :, 1], sums[:, :, 2]
    context_rounds = np.bincount(data.unit_context, weights=c_unit * data.unit_rows, minlength=nc)
    inv_rows = data.context_inverse_rows(c_step)
    b = data.context_bucket
    base = cost.intercept[b] * inv_rows + cost.per_row[b]
    tokens = np.full((nc, na), np.nan)
    seconds = np.full((nc, na), np.nan)
    support = np.zeros((nc, na))
    for a, arm in enumerate(data.arms):
        if arm.is_off:
            tokens[:, a] = 1.0
            seconds[:, a] = base
            support[:, a] = context_rounds  # off needs no data: every round speaks for it
            continue
        d = data.drafters.index(arm.drafter)
        n = rows_sum[:, d, arm.k]
        ok = n > 0
        tokens[ok, a] = tok_sum[ok, d, arm.k] / n[ok]
        seconds[ok, a] = (
            base[ok]
            + cost.per_spec_row[b[ok], d]
            + cost.per_draft[b[ok], d] * dr_sum[ok, d, arm.k] / n[ok]
        )
        support[:, a] = n
    return ArmModel(tokens, seconds, support, context_rounds.astype(np.float64))


def _model_value(data: LoggedRounds, action_dist: FloatArray, model: ArmModel) -> FloatArray:
    """(scopes, 2) tokens and seconds per round; NaN where the candidate needs an
    arm the model has no data for."""
    played = action_dist > 0
    tok = np.where(played, action_dist * model.tokens, 0.0).sum(axis=1)
    sec = np.where(played, action_dist * model.seconds, 0.0).sum(axis=1)
    blind = (played & ~np.isfinite(model.tokens)).any(axis=1)
    n = model.context_rounds
    masks = [np.ones(data.num_contexts, dtype=bool)]
    masks += [data.context_class == c for c in range(len(data.classes))]
    out = np.full((len(masks), 2), np.nan)
    for j, m in enumerate(masks):
        total = n[m].sum()
        if total > 0 and not (blind & m & (n > 0)).any():
            out[j, 0] = (n[m] * tok[m]).sum() / total
            out[j, 1] = (n[m] * sec[m]).sum() / total
    return out


@dataclass(frozen=True)
class TruncationModel:
    """Model-based (direct method) estimate exploiting the structure of speculation.

    A round logged at K reveals exactly what any K' <= K of the same drafter
    would have accepted, min(accepted, K'), so those arms are evaluated from
    every such round with no importance weights: low variance, and trustworthy
    when the drafter's shorter proposal is a prefix of its longer one
    (n-gram, draft models, MTP) and verification is greedy. It cannot say
    anything about a K above the largest logged for a drafter in a context, and
    its time per round rests on the linear step cost model.
    """

    estimator_name: str = field(init=False, default="model")

    def estimate_policy_value(
        self, data: LoggedRounds, action_dist: FloatArray
    ) -> dict[str, PolicyValue]:
        _check_action_dist(data, action_dist)
        return _values_of(_model_value(data, action_dist, fit_arm_model(data)), data)

    def estimate_interval(
        self,
        data: LoggedRounds,
        action_dist: FloatArray,
        *,
        alpha: float = 0.05,
        n_bootstrap_samples: int = 200,
        random_state: int | None = None,
        bootstrap: Bootstrap | None = None,
    ) -> dict[str, IntervalEstimate]:
        _check_action_dist(data, action_dist)
        bootstrap = bootstrap or Bootstrap(data, n_bootstrap_samples, random_state)
        groups = bootstrap.groups
        model = fit_arm_model(data, bootstrap.original, groups)
        point = _model_value(data, action_dist, model)
        reps = np.stack(
            [_model_value(data, action_dist, fit_arm_model(data, r, groups)) for r in bootstrap]
        )
        # Logged rounds behind the candidate's arms, weighted by how often it plays them.
        support = np.where(action_dist > 0, action_dist * model.support, 0.0)
        support_ctx = support.sum(axis=1)
        ess = np.zeros(1 + len(data.classes))
        ess[0] = support_ctx.sum()
        ess[1:] = np.bincount(data.context_class, weights=support_ctx, minlength=len(data.classes))
        return _intervals(data, point, reps, alpha, ess)


@dataclass(frozen=True)
class DoublyRobust(_RatioEstimator):
    """DR: the truncation model's prediction plus an importance-weighted correction
    of its error on the logged arm. Unbiased if either the propensities or the
    model are right; where the candidate plays arms the log never ran (shorter
    K), the model carries the estimate."""

    estimator_name: str = field(init=False, default="dr")

    def _terms(
        self,
        data: LoggedRounds,
        action_dist: FloatArray,
        resample: Resample,
        groups: _TruncationGroups | None = None,
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        w = importance_weights(data, action_dist)
        seconds = resample.unit_seconds(data)
        model = fit_arm_model(data, resample, groups)
        q_tok = np.nan_to_num(model.tokens, nan=0.0)
        q_sec = np.nan_to_num(model.seconds, nan=0.0)
        dm_tok = (action_dist * q_tok).sum(axis=1)[data.unit_context]
        dm_sec = (action_dist * q_sec).sum(axis=1)[data.unit_context]
        own_tok = q_tok[data.unit_context, data.unit_arm]
        own_sec = q_sec[data.unit_context, data.unit_arm]
        n = data.unit_rows
        tok = n * dm_tok + w * (data.unit_tokens - n * own_tok)
        sec = n * dm_sec + w * (seconds - n * own_sec)
        return tok, sec, n


ESTIMATORS: dict[str, type] = {
    "ipw": InverseProbabilityWeighting,
    "snipw": SelfNormalizedInverseProbabilityWeighting,
    "dr": DoublyRobust,
    "model": TruncationModel,
}
