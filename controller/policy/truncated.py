"""Gaussian posterior draws conditioned on being non-negative, from fixed standard normal draws.

Speculation never makes a step cheaper: the extra cost of each longer K is
non-negative. The cost model's posterior is Gaussian and knows nothing of
that. Clipping its draws at zero (a running maximum) puts all the negative
mass exactly at zero cost, and an arm that commits a hair more tokens than
``off`` then wins every such draw: about half of them when the extra cost
is small and noisy, even at zero acceptance. Conditioning on ``>= 0``
instead spreads that mass over small positive costs, as the truncated
normal does, so an arm wins only the draws in which its extra tokens pay
for its extra cost.

The map is by inverse CDF, so a fixed standard normal draw ``z`` gives the
same quantile of the truncated posterior (common random numbers are kept),
and draws keep their joint dependence through ``z``.
"""

from __future__ import annotations

import numpy as np

_SQRT_HALF = 0.7071067811865476

# P. J. Acklam's rational approximation of the normal quantile (relative error 1.2e-9)
_A = (-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.3577518672690,
      -30.66479806614716, 2.506628277459239)  # fmt: skip
_B = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972,
      -13.28068155288572)  # fmt: skip
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838, -2.549732539343734,
      4.374664141464968, 2.938163982698783)  # fmt: skip
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996, 3.754408661907416)
_P_LOW = 0.02425
# Numerical Recipes' erfcc polynomial, highest power first
_ERFC = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
         0.37409196, 1.00002368, -1.26551223)  # fmt: skip


def _erfc(x: np.ndarray) -> np.ndarray:
    """Complementary error function (fractional error below 1.2e-7; Numerical Recipes' erfcc)."""
    t = 1.0 / (1.0 + 0.5 * np.abs(x))
    poly = np.polyval(_ERFC, t)
    ans = t * np.exp(-x * x + poly)
    return np.where(x >= 0.0, ans, 2.0 - ans)


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF."""
    return 0.5 * _erfc(-x * _SQRT_HALF)


def normal_ppf(p: np.ndarray) -> np.ndarray:
    """Standard normal quantile for p in (0, 1) (clipped to [1e-300, 1 - 1e-16])."""
    p = np.clip(p, 1e-300, 1.0 - 1e-16)
    out = np.empty_like(p)
    low = p < _P_LOW
    high = p > 1.0 - _P_LOW
    mid = ~(low | high)
    q = p[mid] - 0.5
    r = q * q
    out[mid] = q * np.polyval(_A, r) / np.polyval((*_B, 1.0), r)
    for mask, sign, tail in ((low, 1.0, p[low]), (high, -1.0, 1.0 - p[high])):
        q = np.sqrt(-2.0 * np.log(tail))
        out[mask] = sign * np.polyval(_C, q) / np.polyval((*_D, 1.0), q)
    return out


def nonnegative_draws(mean: np.ndarray, sd: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Draws of N(mean, sd^2) conditioned on >= 0, at the quantile of each standard normal z.

    ``mean`` and ``sd`` broadcast against ``z``; ``sd`` must be positive. In
    upper-tail form, ``mean - sd * ppf(cdf(mean / sd) * cdf(-z))``, which
    stays accurate when ``mean`` is far below zero.
    """
    mass = normal_cdf(mean / sd)
    tail = np.maximum(mass * normal_cdf(-z), 1e-300)
    return np.maximum(mean - sd * normal_ppf(tail), 0.0)
