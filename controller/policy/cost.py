"""Step time as a function of what the step did, learned per load bucket.

Per load bucket, a Bayesian linear model:

    step_time_s ~ base + per_token * decode_tokens + per_prefill_token * prefill_tokens
                + sum_d (per_request[d] * requests_d + per_draft_token[d] * draft_tokens_d
                         + per_batch_draft_token[d] * batch_size * step_k_d
                         + second_pass[d] * batch_size * [step_k_d >= 2]
                         + second_verified[d] * requests_d[K >= 2])

``decode_tokens`` are the tokens the step verifies for its decoding
requests (one each, plus their drafts) and ``prefill_tokens`` the rest of its
``num_scheduled_tokens`` (prompt chunks). They are two coefficients because
they cost differently on every backend: a prompt chunk is one dense pass,
a verified token pays its own sampling and rejection, and on a GPU at small
batch decode tokens are nearly free where prompt tokens are not (on the CPU
testbed at a batch of 32, 3.8 ms a decode token against 2.9 a prompt token).
With one coefficient for both, the prompt chunks, which make most of the
variation in a step's tokens, set the price of a verified draft. For each
drafter d, ``requests_d`` is how many requests drafted
with it and ``draft_tokens_d`` the K they asked of it, summed. So the model
tells a fixed per-request cost of running a drafter at all (a draft model's
extra pass, a verification that costs more than a decode step) from the cost
of each draft token. ``step_k_d`` is the K the engine's own drafter ran in the step
(the largest K any request ran with it, where the engine does not report it):
that drafter proposes that many tokens for every request of the batch, and the
scheduler only cuts what each class verifies, so a model drafter's passes cost
``batch_size * step_k_d`` whatever the other classes chose. The two draft terms
are the same number when the whole batch runs one arm; steps whose classes run
different K tell them apart. Only the drafter the engine runs for the whole
batch (its hello's ``batch_drafter``, marked in :attr:`CostModel.batch_wide`
from the reports that name it) has the batch-wide terms: an n-gram lookup that
the scheduler runs beside it, per request, costs per request only. With the
terms for both, steps where the two drafters ran together leave the fit free
to hand the n-gram drafter part of the model drafter's passes, and a class
whose n-gram drafts pay then looks as if they did not (on the testbed at a
batch of 32, 0.35 ms per request per draft that no n-gram lookup costs). ``second_pass`` is
what a second draft token costs beyond the line through K: a draft model's
first token comes with the pass that keeps its KV cache in step, which runs
at ``off`` too, so K=1 costs next to nothing and K=2 a whole pass more
(measured on the testbed at concurrency 3: 57-64 ms a step at K=1, 85-89 ms at
K=2, 58-66 ms without speculation). A line through K fitted where the steps
ran K=3..4 then makes K=1 look as expensive as the line says; with the
second pass a coefficient of its own, what steps at K=3..4 cannot tell stays
uncertain, and Thompson sampling tries the short draft to find out.
``second_verified`` is the same step on the target's side, per request that
verifies two drafts or more (``requests_d[K >= 2]``, from the report's rows:
the drafts a step verifies are those of the arms it names): on the testbed a
target pass over three tokens a request costs more than the line through one
and two says (about 9 ms of the 18 ms that K=2 adds to K=1 at concurrency 3,
read from steps whose drafted and verified K differ). While Thompson sampling
varies K from step to step, the drafted and the verified K of a step differ,
and a model with the jump on one side only halves the cost of K=2. Running arm
``(d, K)`` for a batch of B decoding requests verifies ``B * (1 + K)`` tokens
and drafts ``B * K``. Within a load
bucket the batch size varies little, so a drafter's sequential passes (K of
them) are absorbed in its per-draft-token cost. Under heavy load, where
per-token costs times B dominate, long drafts cost more than they return,
and the policy sees that from measured step times rather than from a
hand-written table.

Arms off the line. A step's cost is not a line in K on every engine:
kernel tiles and captured graph sizes make steps (on the AMD study's sweep
Qwen3.5-27B's MTP costs 0.2-0.35 plain decode steps more per K up to K=6 and
0.5 from 6 to 7). With the line alone, the K next to such a step is priced
wrong in every class that runs near it. So each drafter slot also has a
column per K up to ``k_columns``, after the drafters' features: the
requests of the step that ran that arm, a deviation from the line with prior
mean 0 that the line's own terms leave to be the arm's. The deviations are
taken at their posterior mean less ``_K_COLUMN_Z`` standard deviations (soft
thresholding: zero while the evidence is weaker), never drawn, and the
other coefficients are drawn conditioned on them, so the columns cost no
exploration: an arm costs what the line says until its own steps show
otherwise. The fleet shares them by name (``ngram/k=3``), with the line's terms.

Classes off the mix. Requests of different classes do not cost the same at
one arm: verification attends over the request's context, and a drafter's
own pass grows with it, so a class of long prompts or outputs pays more per
round than a class of short ones (on the AMD study's sweep a round of
Qwen3-8B's DSpark at K=7 costs 3.7 plain decode steps on GSM8K and 5.6 on
MATH500). Without a price of their own, the line and the arms' columns price
the bucket's mix of classes, and that average biases each class's K: a class
whose rounds cost less than the mix's sees each extra draft as a smaller
share of its round than it is, and drafts too long. So, where the policy's
``cost_class_columns`` asks for it (16 by default), the first
``class_columns`` class slots get a column
per drafter after the arms': the class's requests drafting with it, a
deviation from the line's price. They are read as the arms' columns are, but
counted only beyond ``_CLASS_COLUMN_Z`` standard deviations: a class's price
moves every arm of the class at once, and what tells it apart is how the
batch's mix of classes varies from step to step, which is slow. A class
slot that goes to another class drops its columns (:meth:`forget_class`). The fleet
shares them by class and drafter name, so a class's price learned on one replica
holds on every replica that runs the class. Within a class, the shape over K is still
the mix's: :mod:`specctl.policy.pair_cost` reads each class's own, per (class, arm),
from this model's residuals (:attr:`CostModel.pairs`).

The prior is independent per coefficient: mean from configuration (0 for a
drafter's per-request cost, ``prior_token_s`` per draft token), standard
deviation such that the term could move a typical step of the bucket by
``prior_spread`` times the bucket's measured mean step time (``prior_step_s``
until the bucket has steps: a prior in units of the engine's own step, so
that it means the same on a CPU at 9 ms a step and a GPU at 40 ms). It does
not shrink as the fit gets tight, so a direction the data cannot see (a
drafter's per-request cost while every step ran it) stays uncertain, and
Thompson sampling tries ``off`` to find out. The noise variance is
estimated from the residuals (at the previous fit).

Memory and robustness. Wall-clock step times on a shared machine are heavy
tailed (a preempted step takes several times its cost), and an engine's step
cost changes slowly (context lengths, prefill mix), so the statistics keep a
long memory (``discount`` per step in the bucket, the policy's
``cost_discount``) and:

- each step enters with a Huber weight, ``min(1, c * sigma / |r|)`` for its
  residual r at the current fit, so an outlier moves the fit by at most c
  standard deviations' worth instead of dragging the fit and inflating the
  noise estimate for hundreds of steps;
- a two-sided CUSUM on the standardised, clipped residuals detects a change
  in cost; the bucket's statistics are then scaled down to
  ``_STEPS_AFTER_CHANGE`` effective steps, so the fit follows the new cost
  instead of averaging it with the old for the length of the memory.

The fleet's evidence. Replicas of identical engines that share what they
learn (:mod:`specctl.policy.shared`) hand this model the sum of the others'
statistics, kept apart from its own (:meth:`CostModel.set_shared`): only its
own are decayed by its steps, scaled down on a change and shared in turn.
The fit reads its own statistics plus a weighted share of the fleet's
(:meth:`CostModel.weigh_shared`): they fill in what this replica has not
seen, up to the length of its own memory, and are set aside from the moment
its CUSUM detects a change in its own cost until the fleet's fit agrees with
its own again, so that the fleet's older evidence neither outvotes a change
seen here first nor keeps the CUSUM firing against a fit that is not this
engine's.

Non-negative and monotone in K: per posterior draw, the policy draws each
speculative arm's extra step time over ``off`` from its Gaussian posterior
conditioned on being >= 0 (:mod:`specctl.policy.truncated`), then takes
the running maximum of the step time over K = 0 (off), 1, 2, ... of each
drafter.
Clipping each coefficient at zero instead breaks the cancellations between
correlated coefficients (per token and per draft token move together) and
inflates the cost of long drafts; it did worse in the simulator.
"""

from __future__ import annotations

import math

import numpy as np

from specctl.policy.pair_cost import PairCost

# weight, in steps, of the prior on the noise variance (10% of the prior step time)
_NOISE_PRIOR_STEPS = 2.0
# Huber constant, in standard deviations of the step-time noise
_HUBER_C = 4.0
# steps in a bucket before residuals are trusted for weighting and change detection
_ROBUST_AFTER_STEPS = 30.0
# CUSUM on standardised residuals clipped to +-_CUSUM_CLIP: drift allowance and threshold
_CUSUM_CLIP = 4.0
_CUSUM_DRIFT = 1.5
_CUSUM_THRESHOLD = 40.0
# effective steps the statistics keep after a detected change in cost
_STEPS_AFTER_CHANGE = 100.0
# the prior's step-time scale follows the measured mean once this many steps are in
_MEASURED_SCALE_STEPS = 5.0
# the fleet's fit agrees with this replica's own when their typical step times differ by
# at most this share of the step (not a multiple of the noise: right after a change the
# noise estimate is inflated by the change itself)
_SHARED_AGREEMENT_SHARE = 0.1


# an arm's own column counts only beyond this many posterior standard deviations
_K_COLUMN_Z = 1.5
# a class's own price counts only beyond this many: it moves every arm of the class at
# once, so a noisy one costs more than a noisy arm's column
_CLASS_COLUMN_Z = 3.5
# features before the drafters': 1, decode tokens verified, prefill tokens
BASE_FEATURES = 3
# features per drafter: requests drafting, draft tokens asked, batch-wide draft tokens,
# batch-wide second pass, requests verifying a second draft
FEATURES_PER_DRAFTER = 5


def num_features(num_drafters: int) -> int:
    """1, decode tokens verified, prefill tokens, then per drafter: requests drafting,
    draft tokens asked, batch size times the step's K (what the drafter proposed for the
    whole batch), batch size where the step's K is 2 or more (its second pass), and
    requests verifying 2 drafts or more."""
    return BASE_FEATURES + FEATURES_PER_DRAFTER * num_drafters


def drafter_feature(slot: np.ndarray | int, offset: int) -> np.ndarray | int:
    """Index of a drafter slot's feature ``offset`` (0: requests drafting ... 4: requests
    verifying 2 drafts or more)."""
    return BASE_FEATURES + FEATURES_PER_DRAFTER * slot + offset


def arm_features(
    batch_size: float,
    extra_tokens: float,
    drafter_slot: np.ndarray,
    k: np.ndarray,
    num_drafters: int,
    k_columns: int = 0,
    class_columns: int = 0,
) -> np.ndarray:
    """Features of a step in which a batch of ``batch_size`` ran each arm (slot -1: off),
    with ``k_columns`` arm columns per drafter after the drafters' features, then
    ``class_columns`` classes' columns per drafter, left 0: a class's own price is added
    per class where the step is read (see :class:`CostModel`)."""
    start = num_features(num_drafters)
    x = np.zeros((k.shape[0], start + (k_columns + class_columns) * num_drafters))
    x[:, 0] = 1.0
    x[:, 1] = batch_size * (1.0 + k)
    x[:, 2] = extra_tokens
    spec = np.flatnonzero(drafter_slot >= 0)
    base = BASE_FEATURES + FEATURES_PER_DRAFTER * drafter_slot[spec]
    x[spec, base] = batch_size
    x[spec, base + 1] = batch_size * k[spec]
    x[spec, base + 2] = batch_size * k[spec]
    x[spec, base + 3] = batch_size * (k[spec] >= 2)
    x[spec, base + 4] = batch_size * (k[spec] >= 2)
    own = spec[k[spec] <= k_columns]
    x[own, start + k_columns * drafter_slot[own] + k[own].astype(np.int64) - 1] = batch_size
    return x


class CostModel:
    """Discounted least-squares statistics per load bucket, with an independent prior."""

    def __init__(
        self,
        num_buckets: int,
        num_drafters: int,
        *,
        discount: float,
        prior_step_s: float,
        prior_token_s: float,
        prior_spread: float,
        k_columns: int = 0,
        class_columns: int = 0,
    ) -> None:
        self.discount = discount
        self.num_drafters = num_drafters
        # the arms' own columns follow the drafters' features: K = 1..k_columns per slot
        self.k_columns = k_columns
        self.arm_start = num_features(num_drafters)
        # then a column per (class slot, drafter slot) for the first class_columns classes
        self.class_columns = class_columns
        self.class_start = self.arm_start + k_columns * num_drafters
        self.num_features = f = self.class_start + class_columns * num_drafters
        self.prior_mean = np.zeros(f)
        self.prior_mean[0] = prior_step_s
        self.prior_mean[1] = prior_token_s
        self.prior_mean[2] = prior_token_s
        self.prior_mean[BASE_FEATURES + 1 : self.arm_start : FEATURES_PER_DRAFTER] = prior_token_s
        self.prior_step_s = prior_step_s
        # per drafter slot: the engine runs it for the whole batch, so its steps have the
        # batch-wide terms (see the module's docstring); other drafters' columns stay 0
        self.batch_wide = np.zeros(num_drafters, dtype=bool)
        self.prior_spread = prior_spread
        self.xtx = np.zeros((num_buckets, f, f))
        self.xty = np.zeros((num_buckets, f))
        self.yy = np.zeros(num_buckets)
        self.steps = np.zeros(num_buckets)
        # steps in which nothing was drafted or verified (discounted like ``steps``): they
        # are what tells the cost of a step without speculation from a drafter's fixed cost
        self.off_steps = np.zeros(num_buckets)
        sigma0 = 0.1 * prior_step_s
        self.noise_var = np.full(num_buckets, sigma0 * sigma0)
        # the latest posterior mean per bucket: the fit residuals are taken against
        self.fit = np.tile(self.prior_mean, (num_buckets, 1))
        # and a factor of its covariance: a step in a direction the fit has not seen
        # (the first steps of a new arm) has a wide predictive spread, not an outlier
        self.fit_factor = np.zeros((num_buckets, f, f))
        self.fitted = np.zeros(num_buckets, dtype=bool)
        self.cusum = np.zeros((num_buckets, 2))
        # per bucket: changes in cost detected, steps down-weighted as outliers
        self.changes = np.zeros(num_buckets, dtype=np.int64)
        self.outliers = np.zeros(num_buckets)
        # the fleet's statistics (set_shared), never added into the arrays above; the
        # weight each bucket's get now; buckets that set them aside since a change here
        self.shared_xtx = np.zeros_like(self.xtx)
        self.shared_xty = np.zeros_like(self.xty)
        self.shared_yy = np.zeros(num_buckets)
        self.shared_steps = np.zeros(num_buckets)
        self.shared_weight = np.zeros(num_buckets)
        self.shared_held = np.zeros(num_buckets, dtype=bool)
        self.has_shared = False
        # per (class, arm) deviations with a longer memory, where the policy asks for them
        self.pairs: PairCost | None = None

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything learned, by its key in a policy's state: the live arrays, not copies."""
        return {
            "cost_xtx": self.xtx,
            "cost_xty": self.xty,
            "cost_yy": self.yy,
            "cost_steps": self.steps,
            "cost_noise_var": self.noise_var,
            "cost_fit": self.fit,
            "cost_fit_factor": self.fit_factor,
            "cost_fitted": self.fitted,
            "cost_cusum": self.cusum,
            "cost_changes": self.changes,
            "cost_outliers": self.outliers,
            "cost_off_steps": self.off_steps,
            "cost_batch_wide": self.batch_wide,
            **(self.pairs.state_arrays() if self.pairs is not None else {}),
        }

    def unused_columns(self) -> np.ndarray:
        """Feature columns no step fills: the batch-wide terms of the drafters that are
        not run for the whole batch. A read."""
        first = BASE_FEATURES + FEATURES_PER_DRAFTER * np.flatnonzero(~self.batch_wide)
        return np.concatenate([first + 2, first + 3])

    def step_features(
        self,
        decode_tokens: np.ndarray,
        prefill_tokens: np.ndarray,
        requests: np.ndarray,
        draft_tokens: np.ndarray,
        step_k: np.ndarray,
        batch_size: np.ndarray,
        second_verified: np.ndarray,
        arm_requests: np.ndarray | None = None,
    ) -> np.ndarray:
        """(S, F) from per-step decode tokens verified, prefill tokens and batch size, and
        per (step, drafter slot) columns: requests drafting, draft tokens asked, the step's
        K, requests verifying two drafts or more; then the columns past the drafters'
        (``arm_requests``): per (step, drafter slot x K) the requests that ran the arm
        (slot-major, K = 1..k_columns), then per (step, class slot x drafter slot) the
        class's requests drafting with it. The step's K enters only for the drafters in
        :attr:`batch_wide`."""
        x = np.empty((decode_tokens.shape[0], self.num_features))
        x[:, self.arm_start :] = 0.0 if arm_requests is None else arm_requests
        x[:, 0] = 1.0
        x[:, 1] = decode_tokens
        x[:, 2] = prefill_tokens
        f, n, end = BASE_FEATURES, FEATURES_PER_DRAFTER, self.arm_start
        x[:, f:end:n] = requests
        x[:, f + 1 : end : n] = draft_tokens
        x[:, f + 2 : end : n] = step_k * batch_size[:, None]
        x[:, f + 3 : end : n] = (step_k >= 2) * batch_size[:, None]
        x[:, f + 4 : end : n] = second_verified
        x[:, self.unused_columns()] = 0.0
        return x

    def update(
        self,
        bucket: np.ndarray,
        x: np.ndarray,
        step_time_s: np.ndarray,
        pair_requests: np.ndarray | None = None,
    ) -> None:
        """One row of ``x`` (see :meth:`step_features`) and one step time per step; with
        :attr:`pairs`, per step the requests of each of its pair columns."""
        d = self.discount
        for i in range(bucket.shape[0]):
            b = int(bucket[i])
            x1 = x[i]
            y = float(step_time_s[i])
            weight = 1.0
            if self.fitted[b] and self._sums(b)[3] >= _ROBUST_AFTER_STEPS:
                spread = x1 @ self.fit_factor[b]
                sigma = math.sqrt(float(self.noise_var[b]) + float(spread @ spread))
                z = (y - float(x1 @ self.fit[b])) / sigma
                if abs(z) > _HUBER_C:
                    weight = _HUBER_C / abs(z)
                    self.outliers[b] += 1.0
                self._detect_change(b, z)
            self.xtx[b] *= d
            self.xtx[b] += weight * np.outer(x1, x1)
            self.xty[b] *= d
            self.xty[b] += weight * y * x1
            self.yy[b] = self.yy[b] * d + weight * y * y
            self.steps[b] = self.steps[b] * d + weight
            self.off_steps[b] = self.off_steps[b] * d + float(not x1[BASE_FEATURES:].any())
            if self.pairs is not None and pair_requests is not None:
                self.pairs.add(b, x1, y, pair_requests[i], weight)

    def forget_class(self, slot: int) -> np.ndarray:
        """Drop a class's own price in every bucket, this replica's and the fleet's: its
        slot may go to another class. What its steps told the line through K stays.
        Returns the buckets whose fit changed (:meth:`refresh` them: the line takes the
        class's price as its own)."""
        if self.pairs is not None:
            self.pairs.forget_class(slot)
        if slot >= self.class_columns:
            return np.zeros(0, dtype=np.int64)
        nd = self.num_drafters
        cols = slice(self.class_start + slot * nd, self.class_start + (slot + 1) * nd)
        held = np.flatnonzero(
            np.diagonal(self.xtx[:, cols, cols], axis1=1, axis2=2).any(axis=1)
            | np.diagonal(self.shared_xtx[:, cols, cols], axis1=1, axis2=2).any(axis=1)
        )
        for xtx, xty in ((self.xtx, self.xty), (self.shared_xtx, self.shared_xty)):
            xtx[:, cols, :] = 0.0
            xtx[:, :, cols] = 0.0
            xty[:, cols] = 0.0
        self.fit[:, cols] = 0.0
        self.fit_factor[:, cols, :] = 0.0
        self.fit_factor[:, :, cols] = 0.0
        return held

    def class_price(self, bucket: int, slot: int) -> np.ndarray | None:
        """Per drafter slot, what a request of the class in ``slot`` costs beyond the
        line and the arm's column (seconds), as the bucket's fit has it; None where the
        class has no column or its price is 0 throughout. A read."""
        if slot >= self.class_columns:
            return None
        nd = self.num_drafters
        price = self.fit[bucket, self.class_start + slot * nd : self.class_start + (slot + 1) * nd]
        return price if price.any() else None

    def _detect_change(self, b: int, z: float) -> None:
        z = min(max(z, -_CUSUM_CLIP), _CUSUM_CLIP)
        up = max(0.0, self.cusum[b, 0] + z - _CUSUM_DRIFT)
        down = max(0.0, self.cusum[b, 1] - z - _CUSUM_DRIFT)
        if up > _CUSUM_THRESHOLD or down > _CUSUM_THRESHOLD:
            keep = min(1.0, _STEPS_AFTER_CHANGE / max(float(self.steps[b]), 1.0))
            self.xtx[b] *= keep
            self.xty[b] *= keep
            self.yy[b] *= keep
            self.steps[b] *= keep
            self.off_steps[b] *= keep
            if self.pairs is not None:
                self.pairs.scale(b, keep)
            self.changes[b] += 1
            # this engine's cost moved: the fleet's evidence waits until it agrees again
            self.shared_held[b] = True
            self.shared_weight[b] = 0.0
            up = down = 0.0
        self.cusum[b] = (up, down)

    def _sums(self, b: int) -> tuple[np.ndarray, np.ndarray, float, float]:
        """The bucket's statistics the fit reads: its own, plus its share of the fleet's."""
        w = float(self.shared_weight[b]) if self.has_shared else 0.0
        if w == 0.0:
            return self.xtx[b], self.xty[b], float(self.yy[b]), float(self.steps[b])
        return (
            self.xtx[b] + w * self.shared_xtx[b],
            self.xty[b] + w * self.shared_xty[b],
            float(self.yy[b] + w * self.shared_yy[b]),
            float(self.steps[b] + w * self.shared_steps[b]),
        )

    def mean_step_s(self, bucket: int) -> float:
        """The bucket's measured mean step time (the prior's until it has a few steps)."""
        _, xty, _, steps = self._sums(bucket)
        return _mean_step_s(xty, steps, self.prior_step_s)

    def posterior(self, bucket: int, typical_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and a factor ``C`` of its covariance: a draw is ``mean + C @ z``.

        ``typical_x`` is a typical step's features in this bucket; it sets each
        coefficient's prior scale. A read: nothing learned changes.
        """
        mean, factor, _ = self._solve(bucket, typical_x)
        return mean, factor

    def refresh(self, bucket: int, typical_x: np.ndarray) -> None:
        """After an update: the fit that residuals are weighed against, and the noise
        variance from the residuals at it (with a weak prior), for the next posterior."""
        mean, factor, rss = self._solve(bucket, typical_x)
        sigma0 = 0.1 * self.mean_step_s(bucket)
        steps = self._sums(bucket)[3]
        self.noise_var[bucket] = (rss + _NOISE_PRIOR_STEPS * sigma0 * sigma0) / (
            steps + _NOISE_PRIOR_STEPS
        )
        self.fit[bucket] = mean
        self.fit_factor[bucket] = factor
        self.fitted[bucket] = True
        if self.pairs is not None:
            request_s = self.mean_step_s(bucket) / max(float(typical_x[BASE_FEATURES]), 1.0)
            self.pairs.refresh(bucket, mean, float(self.noise_var[bucket]), request_s)

    def _solve(self, bucket: int, typical_x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        xtx, xty, yy, steps = self._sums(bucket)
        return self._solve_sums(xtx, xty, yy, steps, float(self.noise_var[bucket]), typical_x)

    def _solve_sums(
        self,
        xtx: np.ndarray,
        xty: np.ndarray,
        yy: float,
        steps: float,
        sigma2: float,
        typical_x: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, float]:
        step_s = _mean_step_s(xty, steps, self.prior_step_s)
        scale = self.prior_spread * step_s / np.maximum(np.abs(typical_x), 1.0)
        prior_precision = 1.0 / (scale * scale)
        rhs = prior_precision * self.prior_mean + xty / sigma2
        cs = self.arm_start
        # an arm's column that no step has filled holds its prior alone (mean 0,
        # independent of the rest): leaving it out of the solve changes nothing
        cols = np.concatenate([np.arange(cs), cs + np.flatnonzero(np.diagonal(xtx)[cs:] > 0.0)])
        precision = xtx[np.ix_(cols, cols)] / sigma2
        precision[np.diag_indices_from(precision)] += prior_precision[cols]
        # precision = L L^T: the covariance is L^-T L^-1, and a draw mean + L^-T z
        l_inv = np.linalg.inv(np.linalg.cholesky(precision))
        solved = l_inv.T @ (l_inv @ rhs[cols])
        mean = np.zeros(self.num_features)
        factor = np.zeros((self.num_features, self.num_features))
        if cols.size == cs:
            mean[:cs] = solved
            factor[:cs, :cs] = l_inv.T
        else:
            # an arm's own column counts only beyond _K_COLUMN_Z posterior standard
            # deviations (soft thresholding): an arm costs what the line through K says
            # until its steps show otherwise. The other coefficients are taken, and drawn,
            # conditioned on it.
            sd = np.sqrt((l_inv[:, cs:] ** 2).sum(axis=0))
            dev = solved[cs:]
            zs = np.where(cols[cs:] >= self.class_start, _CLASS_COLUMN_Z, _K_COLUMN_Z)
            dev = np.sign(dev) * np.maximum(np.abs(dev) - zs * sd, 0.0)
            l_oo = np.linalg.inv(np.linalg.cholesky(precision[:cs, :cs]))
            mean[:cs] = l_oo.T @ (l_oo @ (rhs[:cs] - precision[:cs, cs:] @ dev))
            mean[cols[cs:]] = dev
            factor[:cs, :cs] = l_oo.T
        rss = max(float(yy - 2.0 * mean @ xty + mean @ xtx @ mean), 0.0)
        return mean, factor, rss

    # -- the fleet's evidence -------------------------------------------------

    def set_shared(
        self, xtx: np.ndarray, xty: np.ndarray, yy: np.ndarray, steps: np.ndarray
    ) -> None:
        """Replace the fleet's statistics: arrays shaped like this model's, in its feature
        layout, summed over the other replicas. :meth:`weigh_shared` then weighs each
        bucket's, and :meth:`refresh` fits with them."""
        self.shared_xtx[...] = xtx
        self.shared_xty[...] = xty
        self.shared_yy[...] = yy
        self.shared_steps[...] = steps
        self.has_shared = bool(steps.any())

    def weigh_shared(self, bucket: int, typical_x: np.ndarray) -> None:
        """How much of the fleet's statistics the bucket's fit takes, after the fleet's
        statistics or this replica's changed.

        They fill in what this replica has not seen, up to the length of its
        memory (``1 / (1 - discount)`` steps, where its own statistics settle):
        a new replica fits on the fleet's steps, a busy one on its own. A bucket
        whose CUSUM detected a change here takes none of them until the fleet's
        own fit and this replica's own predict this replica's mean step
        within ``_SHARED_AGREEMENT_SHARE`` of each other: the mean of its own
        steps' features, where its fit is measured (a typical step at an arm the
        replica rarely runs is an extrapolation, on which two sound fits of
        collinear features disagree).
        """
        b = bucket
        if not self.has_shared or self.shared_steps[b] <= 0.0:
            self.shared_weight[b] = 0.0
            return
        if self.shared_held[b]:
            sigma2 = float(self.noise_var[b])
            own, _, _ = self._solve_sums(
                self.xtx[b], self.xty[b], float(self.yy[b]), float(self.steps[b]), sigma2, typical_x
            )
            fleet, _, _ = self._solve_sums(
                self.shared_xtx[b],
                self.shared_xty[b],
                float(self.shared_yy[b]),
                float(self.shared_steps[b]),
                sigma2,
                typical_x,
            )
            # compared on this replica's own steps (their mean features: the first row of
            # its sums), where its fit is measured rather than extrapolated
            seen = self.xtx[b, 0] / max(float(self.steps[b]), 1e-12)
            step = float(seen @ own)
            if abs(float(seen @ fleet) - step) > _SHARED_AGREEMENT_SHARE * abs(step):
                self.shared_weight[b] = 0.0
                return
            self.shared_held[b] = False
        memory = 1.0 / (1.0 - self.discount) if self.discount < 1.0 else math.inf
        room = memory - float(self.steps[b])
        self.shared_weight[b] = min(max(room / float(self.shared_steps[b]), 0.0), 1.0)


def _mean_step_s(xty: np.ndarray, steps: float, prior_step_s: float) -> float:
    """Measured mean step time from regression sums (the prior's until a few steps)."""
    if steps < _MEASURED_SCALE_STEPS:
        return prior_step_s
    return max(float(xty[0]) / steps, 1e-6)
