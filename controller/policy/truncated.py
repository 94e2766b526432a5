"""Gaussian posterior draws conditioned on being non-negative, from fixed standard normal draws.

Speculation never makes a step cheaper: the extra cost of speculating is
non-negative. The cost model's posterior is Gaussian and knows nothing of
that. Clipping its draws at zero puts all the negative mass exactly at zero
cost, and an arm that commits a hair more tokens than ``off`` then wins every
such draw: about half of them when the extra cost is small and noisy, even at
zero acceptance. Conditioning on ``>= 0`` instead spreads that mass over
small positive costs, as the truncated normal does, so an arm wins only the
draws in which its extra tokens pay for its extra cost.

The map is by inverse CDF, so a fixed standard normal draw ``z`` gives the
same quantile of the truncated posterior (common random numbers are kept),
and draws keep their joint dependence through ``z``. The normal CDF and its
inverse are read off tables of ``log(-log cdf)`` by linear interpolation at
a computed index: a handful of numpy calls per decision.
"""

from __future__ import annotations

import math

import numpy as np

# standard deviations above zero beyond which conditioning on >= 0 is skipped (P < 1e-9)
_EXACT_BELOW = 6.0
# Tables on uniform grids, read by linear interpolation at a computed index (no search):
# L(x) = log(-log cdf(x)) for x in [-37, 9], and its inverse, x as a function of L.
_X_LO, _X_HI = -37.0, 9.0
_L_LO, _L_HI = -46.0, 6.6


def _log_minus_log_cdf(x: float) -> float:
    cdf_log = (
        math.log(0.5 * math.erfc(-x / math.sqrt(2.0)))
        if x < 0.0
        else math.log1p(-0.5 * math.erfc(x / math.sqrt(2.0)))
    )
    return math.log(-cdf_log)


_DENSE_X = np.linspace(_X_LO, _X_HI, (1 << 16) + 1)
_DENSE_L = np.array([_log_minus_log_cdf(float(x)) for x in _DENSE_X])
_L_OF_X = _DENSE_L[::8].copy()
_X_OF_L = np.interp(np.linspace(_L_LO, _L_HI, (1 << 13) + 1), _DENSE_L[::-1], _DENSE_X[::-1])


def _lerp(table: np.ndarray, lo: float, hi: float, v: np.ndarray) -> np.ndarray:
    n = table.shape[0] - 1
    pos = np.clip((v - lo) * (n / (hi - lo)), 0.0, n - 1e-9)
    i = pos.astype(np.intp)
    frac = pos - i
    return table[i] + frac * (table[i + 1] - table[i])


def log_normal_cdf(x: np.ndarray) -> np.ndarray:
    """log of the standard normal CDF (x clipped to [-37, 9])."""
    return -np.exp(_lerp(_L_OF_X, _X_LO, _X_HI, x))


def normal_ppf_of_log(log_p: np.ndarray) -> np.ndarray:
    """The standard normal quantile of exp(log_p), log_p < 0 (within [-37, 9])."""
    return _lerp(_X_OF_L, _L_LO, _L_HI, np.log(-np.minimum(log_p, -1e-300)))


def nonnegative_draws(mean: np.ndarray, sd: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Draws of N(mean, sd^2) conditioned on >= 0, at the quantile of each standard normal z.

    ``mean`` and ``sd`` are scalars or 1-D along the last axis of ``z``; ``sd``
    must be positive. Where ``mean`` is more than ``_EXACT_BELOW`` standard
    deviations above zero, conditioning changes nothing measurable and the
    draw is ``max(mean + sd * z, 0)``.
    """
    mean = np.asarray(mean, dtype=np.float64)
    sd = np.asarray(sd, dtype=np.float64)
    out = np.maximum(mean + sd * z, 0.0)
    near = mean < _EXACT_BELOW * sd
    if mean.ndim == 0:
        return _conditioned(mean, sd, z) if near else out
    cols = np.flatnonzero(near)
    if cols.shape[0]:
        out[..., cols] = _conditioned(mean[cols], sd[cols], z[..., cols])
    return out


def _conditioned(mean: np.ndarray, sd: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``mean - sd * ppf(cdf(mean / sd) * cdf(-z))``: the upper-tail form of the inverse CDF,
    accurate when ``mean`` is far below zero."""
    log_tail = log_normal_cdf(mean / sd) + log_normal_cdf(-z)
    return np.maximum(mean - sd * normal_ppf_of_log(log_tail), 0.0)
