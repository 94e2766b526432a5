"""Off-policy estimators of a candidate policy's value from a decision log.

In the manner of Open Bandit Pipeline: :class:`BaseOffPolicyEstimator` writes
``estimate_policy_value`` (point estimates) and ``estimate_interval``
(bootstrap confidence intervals) once; each estimator says only how it turns
the log and the candidate's :class:`~specctl.replay.weights.Weights` into
values under one resample of the log. Every estimator estimates, per workload
class and overall (scope ``"all"``):

- tokens per round: committed tokens (accepted + 1) per request-round;
- seconds per round: engine time per request-round (see :mod:`specctl.replay.data`);
- goodput: their ratio, committed tokens per second of engine time.

Intervals come from the Poisson bootstrap over steps (:mod:`specctl.replay.bootstrap`).
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from specctl.replay.bootstrap import Bootstrap, Resample
from specctl.replay.cost import StepCostModel
from specctl.replay.data import LoggedRounds
from specctl.replay.truncation import fit_arm_model, model_scope_values
from specctl.replay.weights import Weights

FloatArray = npt.NDArray[np.float64]

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


def by_scope(data: LoggedRounds, unit_values: FloatArray) -> FloatArray:
    """Sum unit values (U,) or (U, m) into scopes: row 0 all, row 1 + c class c."""
    values = unit_values if unit_values.ndim == 2 else unit_values[:, None]
    out = np.zeros((1 + len(data.classes), values.shape[1]))
    out[0] = values.sum(axis=0)
    for j in range(values.shape[1]):
        out[1:, j] = np.bincount(data.unit_class, weights=values[:, j], minlength=len(data.classes))
    return out if unit_values.ndim == 2 else out[:, 0]


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


class BaseOffPolicyEstimator(ABC):
    """An estimator of tokens and seconds per round; see the module docstring.

    A subclass implements :meth:`_estimate_scope_values`; the class attributes
    say what its estimate rests on, which the evaluation's warnings and its
    choice of estimators per candidate read.
    """

    estimator_name: ClassVar[str] = ""
    # Rests on unit weights: its effective sample size says how thin the support is.
    weighted: ClassVar[bool] = True
    # Rests on the truncation model and the step cost model's prediction at unlogged K.
    model_based: ClassVar[bool] = False
    # Consumes rejection-sampling weights: the estimator for candidates that learn.
    uses_rejection_sampling: ClassVar[bool] = False

    @abstractmethod
    def _estimate_scope_values(
        self, data: LoggedRounds, weights: Weights, resamples: Iterable[Resample]
    ) -> FloatArray:
        """(resamples, scopes, 2): tokens and seconds per round in each scope, per resample."""

    def _effective_sample_size(self, data: LoggedRounds, weights: Weights) -> FloatArray:
        """Kish's effective sample size of the unit weights, in units, per scope."""
        w = weights.unit
        sums = by_scope(data, np.column_stack([w, w * w]))
        return np.divide(sums[:, 0] ** 2, sums[:, 1], out=np.zeros(len(sums)), where=sums[:, 1] > 0)

    def _check(self, data: LoggedRounds, weights: Weights) -> None:
        weights.check(data)
        if self.model_based and weights.action_dist is None:
            raise ValueError(
                f"{self.estimator_name} needs the candidate's action distribution: "
                "it evaluates stationary candidates only"
            )

    def estimate_policy_value(self, data: LoggedRounds, weights: Weights) -> dict[str, PolicyValue]:
        """Tokens and seconds per round, per scope."""
        self._check(data, weights)
        point = self._estimate_scope_values(data, weights, [Resample.of(data)])[0]
        return {
            scope: PolicyValue(float(point[i, 0]), float(point[i, 1]))
            for i, scope in enumerate(scopes(data))
        }

    def estimate_interval(
        self,
        data: LoggedRounds,
        weights: Weights,
        *,
        alpha: float = 0.05,
        n_bootstrap_samples: int = 200,
        random_state: int | None = None,
        bootstrap: Bootstrap | None = None,
    ) -> dict[str, IntervalEstimate]:
        """Point estimates with (1 - alpha) percentile intervals, per scope.

        ``bootstrap``: a plan shared with other estimators and candidates
        (default: a new one of ``n_bootstrap_samples`` replicates).
        """
        self._check(data, weights)
        bootstrap = bootstrap or Bootstrap(data, n_bootstrap_samples, random_state)
        values = self._estimate_scope_values(
            data, weights, itertools.chain([bootstrap.original], bootstrap)
        )
        point, replicates = values[0], values[1:]
        with np.errstate(divide="ignore", invalid="ignore"):
            goodput = replicates[:, :, 0] / replicates[:, :, 1]
        g_lo, g_hi = _percentiles(goodput, alpha)
        t_lo, t_hi = _percentiles(replicates[:, :, 0], alpha)
        s_lo, s_hi = _percentiles(replicates[:, :, 1], alpha)
        rounds = by_scope(data, data.unit_rows)
        ess = self._effective_sample_size(data, weights)
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
                notes=weights.notes if scope == SCOPE_ALL else (),
            )
        return out


def _step_class_sums(data: LoggedRounds, values: FloatArray) -> FloatArray:
    """Sum unit values (U, m) into (steps, classes, m)."""
    nc = len(data.classes)
    key = data.unit_step * nc + data.unit_class
    out = np.empty((data.num_steps * nc, values.shape[1]))
    for j in range(values.shape[1]):
        out[:, j] = np.bincount(key, weights=values[:, j], minlength=data.num_steps * nc)
    return out.reshape(data.num_steps, nc, values.shape[1])


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


def _step_ratio(c: FloatArray | None, fixed: FloatArray, seconds: FloatArray) -> FloatArray:
    """(scopes, 2) from per-(step, class) sums weighted by steps ``c`` (None: all once)."""
    if c is None:
        tok, den, sec = fixed[:, :, 0].sum(0), fixed[:, :, 1].sum(0), seconds.sum(0)
    else:
        tok, den, sec = c @ fixed[:, :, 0], c @ fixed[:, :, 1], c @ seconds
    tok = np.r_[tok.sum(), tok]
    den = np.r_[den.sum(), den]
    sec = np.r_[sec.sum(), sec]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.column_stack([tok / den, sec / den])


@dataclass(frozen=True)
class InverseProbabilityWeighting(BaseOffPolicyEstimator):
    """IPS: sum_u w_u R_u / rounds. Unbiased where the log gives every arm the
    candidate plays a positive propensity; variance grows with the weights.

    Computed on per-step sums, so the bootstrap costs O(steps): tokens and the
    denominator are sums of fixed unit terms; a unit's seconds are its share of
    the step under the cost model, ``T_s * (x_u . theta) / (X_s . theta)``, so
    the step's share of weighted seconds is ``T_s * (G_s . theta) / (X_s .
    theta)`` with ``G_s = sum_u w_u x_u``: each replicate's refitted ``theta``
    applies to steps, not rows.
    """

    estimator_name: ClassVar[str] = "ipw"
    self_normalized: ClassVar[bool] = False

    def _estimate_scope_values(
        self, data: LoggedRounds, weights: Weights, resamples: Iterable[Resample]
    ) -> FloatArray:
        w = weights.unit
        den = w * data.unit_rows if self.self_normalized else data.unit_rows
        fixed = _step_class_sums(data, np.column_stack([w * data.unit_tokens, den]))
        features = _step_class_sums(data, w[:, None] * data.unit_cost_features())
        return np.stack(
            [
                _step_ratio(r.step_weights, fixed, _step_seconds(data, features, r.cost))
                for r in resamples
            ]
        )


@dataclass(frozen=True)
class SelfNormalizedInverseProbabilityWeighting(InverseProbabilityWeighting):
    """SNIPS: sum_u w_u R_u / sum_u w_u n_u. Slightly biased, much lower variance
    than IPS when weights are large. Goodput, a ratio of two IPS estimates with
    the same denominator, is the same under IPS and SNIPS."""

    estimator_name: ClassVar[str] = "snipw"
    self_normalized: ClassVar[bool] = True


@dataclass(frozen=True)
class RejectionReplayEstimator(SelfNormalizedInverseProbabilityWeighting):
    """Replay (Li et al. 2011): SNIPS over the weights rejection sampling gives, 1 for each
    step-context the candidate accepted as it learned and 0 for the rest, which is the
    value of the rounds it accepted. Its effective sample size is the number accepted.
    See :mod:`specctl.replay.rejection`."""

    estimator_name: ClassVar[str] = "replay"
    uses_rejection_sampling: ClassVar[bool] = True


@dataclass(frozen=True)
class TruncationModel(BaseOffPolicyEstimator):
    """Model-based (direct method) estimate exploiting the structure of speculation.

    A round logged at K reveals exactly what any K' <= K of the same drafter
    would have accepted, so those arms are evaluated from every such round with
    no importance weights (:mod:`specctl.replay.truncation`): low variance, and
    trustworthy when the drafter's shorter proposal is a prefix of its longer
    one and verification is greedy. It cannot say anything about a K above the
    largest logged for a drafter in a context, and its time per round rests on
    the linear step cost model. Its effective sample size is the logged rounds
    behind the candidate's arms, weighted by how often it plays them.
    """

    estimator_name: ClassVar[str] = "model"
    weighted: ClassVar[bool] = False
    model_based: ClassVar[bool] = True

    def _estimate_scope_values(
        self, data: LoggedRounds, weights: Weights, resamples: Iterable[Resample]
    ) -> FloatArray:
        dist = _action_dist(weights)
        return np.stack([model_scope_values(data, dist, fit_arm_model(data, r)) for r in resamples])

    def _effective_sample_size(self, data: LoggedRounds, weights: Weights) -> FloatArray:
        dist = _action_dist(weights)
        support = np.where(dist > 0, dist * fit_arm_model(data).support, 0.0)
        support_ctx = support.sum(axis=1)
        ess = np.zeros(1 + len(data.classes))
        ess[0] = support_ctx.sum()
        ess[1:] = np.bincount(data.context_class, weights=support_ctx, minlength=len(data.classes))
        return ess


@dataclass(frozen=True)
class DoublyRobust(BaseOffPolicyEstimator):
    """DR: the truncation model's prediction plus an importance-weighted correction
    of its error on the logged arm. Unbiased if either the propensities or the
    model are right; where the candidate plays arms the log never ran (shorter
    K), the model carries the estimate."""

    estimator_name: ClassVar[str] = "dr"
    model_based: ClassVar[bool] = True

    def _estimate_scope_values(
        self, data: LoggedRounds, weights: Weights, resamples: Iterable[Resample]
    ) -> FloatArray:
        return np.stack([self._scope_values(data, weights, r) for r in resamples])

    @staticmethod
    def _scope_values(data: LoggedRounds, weights: Weights, resample: Resample) -> FloatArray:
        dist = _action_dist(weights)
        w = weights.unit
        seconds = resample.unit_seconds(data)
        model = fit_arm_model(data, resample)
        q_tok = np.nan_to_num(model.tokens, nan=0.0)
        q_sec = np.nan_to_num(model.seconds, nan=0.0)
        dm_tok = (dist * q_tok).sum(axis=1)[data.unit_context]
        dm_sec = (dist * q_sec).sum(axis=1)[data.unit_context]
        own_tok = q_tok[data.unit_context, data.unit_arm]
        own_sec = q_sec[data.unit_context, data.unit_arm]
        n = data.unit_rows
        tok = n * dm_tok + w * (data.unit_tokens - n * own_tok)
        sec = n * dm_sec + w * (seconds - n * own_sec)
        c = resample.unit_weights(data)
        sums = by_scope(data, np.column_stack([c * tok, c * sec, c * n]))
        with np.errstate(divide="ignore", invalid="ignore"):
            return sums[:, :2] / sums[:, 2:3]


def _action_dist(weights: Weights) -> FloatArray:
    if weights.action_dist is None:  # _check refused it already
        raise ValueError("a model-based estimator needs the candidate's action distribution")
    return weights.action_dist


# Every estimator by name: the command line's choices, the evaluation and the report.
ESTIMATORS: dict[str, type[BaseOffPolicyEstimator]] = {
    cls.estimator_name: cls
    for cls in (
        InverseProbabilityWeighting,
        SelfNormalizedInverseProbabilityWeighting,
        DoublyRobust,
        TruncationModel,
        RejectionReplayEstimator,
    )
}
