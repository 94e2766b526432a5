"""Step time as a function of what the step did, learned per load bucket.

Per load bucket, a Bayesian linear model with non-negative coefficients:

    step_time_s ~ base + per_token * tokens_verified + sum_d per_pass[d] * depth_d

``tokens_verified`` is the step's ``num_scheduled_tokens`` (prefill, decode
and drafts) and ``depth_d`` is the deepest K that drafter d ran for any
request in the step (its number of sequential draft passes). Running arm
``(d, K)`` for a batch of B decoding requests verifies ``B * (1 + K)`` tokens
and drafts K deep, so with non-negative coefficients the predicted step time
never decreases with K. Under heavy load, where per_token * B dominates, long
drafts cost more than they return, and the policy sees that from measured
step times rather than from a hand-written table.

The prior is a configurable coefficient vector worth ``prior_steps``
observations at the bucket's typical step (ridge toward it); the noise
variance is estimated from the residuals. Sufficient statistics decay like
the acceptance counts (``discount`` per step in the bucket), so the fit
follows a model or hardware change. Coefficient draws are projected onto the
non-negative orthant, which keeps every draw monotone in K.
"""

from __future__ import annotations

import numpy as np


class CostModel:
    """Discounted least-squares statistics per load bucket, with a ridge prior."""

    def __init__(
        self,
        num_buckets: int,
        num_drafters: int,
        *,
        discount: float,
        prior_step_s: float,
        prior_token_s: float,
        prior_draft_pass_s: float,
        prior_steps: float,
    ) -> None:
        self.discount = discount
        self.num_features = 2 + num_drafters
        f = self.num_features
        self.prior_mean = np.array(
            [prior_step_s, prior_token_s] + [prior_draft_pass_s] * num_drafters
        )
        self.prior_steps = prior_steps
        self.xtx = np.zeros((num_buckets, f, f))
        self.xty = np.zeros((num_buckets, f))
        self.yy = np.zeros(num_buckets)
        self.steps = np.zeros(num_buckets)

    def update(
        self, bucket: np.ndarray, tokens: np.ndarray, depth: np.ndarray, step_time_s: np.ndarray
    ) -> None:
        """One row per step: bucket, tokens verified, depth per drafter slot, step time."""
        if bucket.shape[0] == 1:  # the common one-step report, without ufunc.at
            b = int(bucket[0])
            d = self.discount
            y = float(step_time_s[0])
            x1 = np.empty(self.num_features)
            x1[0] = 1.0
            x1[1] = tokens[0]
            x1[2:] = depth[0]
            self.xtx[b] *= d
            self.xtx[b] += np.outer(x1, x1)
            self.xty[b] *= d
            self.xty[b] += y * x1
            self.yy[b] = self.yy[b] * d + y * y
            self.steps[b] = self.steps[b] * d + 1.0
            return
        nb = self.steps.shape[0]
        n = np.bincount(bucket, minlength=nb).astype(np.float64)
        decay = self.discount**n
        x = np.empty((bucket.shape[0], self.num_features))
        x[:, 0] = 1.0
        x[:, 1] = tokens
        x[:, 2:] = depth
        self.xtx *= decay[:, None, None]
        self.xty *= decay[:, None]
        self.yy *= decay
        self.steps = self.steps * decay + n
        np.add.at(self.xtx, bucket, x[:, :, None] * x[:, None, :])
        np.add.at(self.xty, bucket, x * step_time_s[:, None])
        self.yy += np.bincount(bucket, weights=step_time_s * step_time_s, minlength=nb)

    def posterior(self, bucket: int, typical_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and a Cholesky factor of the covariance (draws still need clipping).

        ``typical_x`` is a typical step's feature vector in this bucket: the
        prior counts as ``prior_steps`` observations there, coefficient by
        coefficient.
        """
        scale = np.maximum(np.abs(typical_x), 1.0)
        p0 = self.prior_steps * scale * scale
        precision = self.xtx[bucket] + np.diag(p0)
        rhs = self.xty[bucket] + p0 * self.prior_mean
        # precision = L L^T, so the covariance sigma2 * precision^-1 has the factor
        # sigma * L^-T: a draw is mean + sigma * z @ L^-1
        l_inv = np.linalg.inv(np.linalg.cholesky(precision))
        mean = l_inv.T @ (l_inv @ rhs)
        # noise variance: residuals of the fit, with a prior of 10% of the prior step time
        xtx = self.xtx[bucket]
        rss = self.yy[bucket] - 2.0 * mean @ self.xty[bucket] + mean @ xtx @ mean
        sigma0 = 0.1 * float(self.prior_mean @ typical_x)
        n = self.steps[bucket]
        sigma2 = (max(float(rss), 0.0) + self.prior_steps * sigma0 * sigma0) / (
            n + self.prior_steps
        )
        chol = np.sqrt(sigma2) * l_inv.T
        return mean, chol

    def reset(self) -> None:
        self.xtx[:] = 0.0
        self.xty[:] = 0.0
        self.yy[:] = 0.0
        self.steps[:] = 0.0
