"""The posterior draws specctl's policy decides from: each arm's tokens, step time and goodput.

The policy (:mod:`specctl.policy.thompson`) computes the posterior probability
that each arm has the highest goodput by Monte Carlo, with ``num_samples``
draws per context. Each position's Beta posterior is drawn through its
logit-normal (delta-method) approximation, and the cost coefficients from
their Gaussian posterior. Each speculative arm's extra step time over ``off``
is drawn from its posterior conditioned on being non-negative
(:mod:`specctl.policy.truncated`), then each draw is made monotone in K.
Clipping that extra time at zero instead made speculation exactly free in
every draw that put it below zero, where the hair of extra tokens the
acceptance prior still promises at zero acceptance beat ``off``: with a
small, noisy extra cost about half the draws went to speculating arms, a
bias that no amount of data removed. The standard
normal draws are fixed at construction from ``seed`` (common random numbers):
decisions are deterministic given the reports, and a distribution moves only
when the evidence does, not with sampling noise, so the sidecar pushes
(changes beyond its threshold) only on real changes.

Classes that share a batch are drawn together (:meth:`PosteriorDraws._joint_samples`):
per draw, the joint choice of their arms that maximises the batch's committed
tokens per second (:class:`~specctl.policy.joint.JointChoice`) is kept, and each
class's draws are those of its arms while the others run their part of it.

:class:`PosteriorDraws` is mixed into :class:`~specctl.policy.thompson.SpecctlPolicy`:
it reads the policy's evidence, offered arms and versions, lays the offered arms
out on the draws' arrays, and keeps the draws until those versions move.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from specctl.arms import MAX_K, Arm
from specctl.policy.cost import CostModel, arm_features, drafter_feature
from specctl.policy.joint import MIN_STEP_TIME_S, JointChoice
from specctl.policy.thompson_config import SpecctlConfig
from specctl.policy.thompson_evidence import ThompsonEvidence
from specctl.policy.thompson_state import JointProfiles
from specctl.policy.truncated import nonnegative_draws

# a bucket's joint choice is worked out again after this many of its steps (or when its
# classes change): it moves with the evidence, which a handful of steps barely moves
_JOINT_REFRESH_STEPS = 16
_MAX_SPEEDUP_OF_DRAW = 2.0
# rounds, at the prior, that proposed the class's share of K over the drafter's other K
# (see _unproposed_time and AcceptanceModel.drafted_share)
_PROPOSED_PRIOR_ROUNDS = 5.0
# correlation of the standard normal draws of one drafter's positions
_POSITION_CORRELATION = 0.7


@dataclass(frozen=True)
class ContextDraws:
    """Posterior draws for one context: shape (num_samples, num_arms) each."""

    goodput: np.ndarray
    tokens: np.ndarray
    step_time_s: np.ndarray

    def prob_best(self) -> np.ndarray:
        """Per arm, the probability that it is the best (a copy: the caller may write it)."""
        return self._prob_best.copy()

    def prob_best_speculating(self) -> np.ndarray:
        """Per arm, the probability that it is the best of the speculative arms (0 for
        ``off``, the first)."""
        best = np.argmax(self.goodput[:, 1:], axis=1) + 1
        return np.bincount(best, minlength=self.goodput.shape[1]) / self.goodput.shape[0]

    @cached_property
    def _prob_best(self) -> np.ndarray:
        # worked out once: the draws of a context are read by every decision and check
        # until its evidence moves
        best = np.argmax(self.goodput, axis=1)
        return np.bincount(best, minlength=self.goodput.shape[1]) / self.goodput.shape[0]

    def tempered(self, scale: float) -> ContextDraws:
        """The draws with each arm's goodput pulled toward its posterior mean, to ``scale``
        times its spread: the same means, the same correlations between arms, a narrower
        posterior."""
        if scale == 1.0:
            return self
        mean = self.goodput.mean(axis=0, keepdims=True)
        goodput = mean + np.float32(scale) * (self.goodput - mean)
        return ContextDraws(goodput.astype(np.float32), self.tokens, self.step_time_s)


class PosteriorDraws:
    """Posterior draws of the offered arms' tokens, step time and goodput per context, cached."""

    # set by the policy: its configuration and evidence, the offered arms (off first, then
    # each drafter's by K) and the versions that tell whether a cached draw still holds
    config: SpecctlConfig
    learned: ThompsonEvidence
    _arms: tuple[Arm, ...]
    _class_version: np.ndarray
    _bucket_version: np.ndarray
    _arms_version: int

    def _start_draws(self, cfg: SpecctlConfig, cost: CostModel) -> None:
        """Empty caches, and the standard normal draws behind every posterior draw, fixed
        from ``cfg.seed``."""
        self._step_times: dict[int, tuple[tuple[int, int], float, np.ndarray, np.ndarray]] = {}
        # per bucket, draws of the target's cost per token verified, next to _step_times
        self._token_times: dict[int, np.ndarray] = {}
        # per bucket, next to _step_times: each arm's posterior mean step time and the
        # posterior standard deviation of its extra step time over off (0 for off)
        self._off_contrast: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._tokens: dict[int | None, tuple[tuple[int, int], np.ndarray]] = {}
        # a read cache: per (class slot, bucket) decided alone, its draws
        self._alone: dict[tuple[int | None, int], tuple[tuple[int, int, int], ContextDraws]] = {}
        # a read cache: per bucket, the joint goodput draws of its classes
        self._joint: dict[int, tuple[tuple[Any, ...], dict[int, ContextDraws]]] = {}
        # a read cache: per bucket, the control share its joint draws ask (by their versions)
        self._control_needs: dict[int, tuple[tuple[Any, ...], float]] = {}
        # learned: per bucket, (arms and classes, its steps then, best joint choice per draw)
        self._profiles: JointProfiles = {}
        # posterior draws are computed in float32: twice as fast, and far more precise
        # than the Monte Carlo error of num_samples draws
        rng = np.random.default_rng(cfg.seed)
        self._z_acceptance = rng.standard_normal(
            (cfg.num_samples, cfg.max_drafters, MAX_K), dtype=np.float32
        )
        # the arms' own cost columns are never drawn (see cost): no z of their own
        self._z_cost = rng.standard_normal((cfg.num_samples, cost.arm_start), dtype=np.float32)
        self._z_arm_tokens = rng.standard_normal(
            (cfg.num_samples, cfg.max_drafters, MAX_K), dtype=np.float32
        )
        # A drafter's positions are drawn correlated: a draft that matches the target at
        # one position tends to at the next. Independent draws make "every position high"
        # all but impossible under the prior, so long drafts of a drafter a class has not
        # run look far worse than they may be, and it is never tried.
        common = rng.standard_normal((cfg.num_samples, cfg.max_drafters, 1), dtype=np.float32)
        rho = _POSITION_CORRELATION
        self._z_acceptance = np.sqrt(rho) * common + np.sqrt(1.0 - rho) * self._z_acceptance

    def _lay_out_arms(self, offered: list[Arm], spec: list[Arm]) -> None:
        """Lay the offered arms (``off``, then ``spec``: each drafter's by K) out on the
        draws' arrays."""
        drafter_slot = self.learned.drafter_slot
        slots = sorted({drafter_slot[a.drafter] for a in spec})
        self._drafters = np.array(slots, dtype=np.int64)
        position = {s: i for i, s in enumerate(slots)}
        self._max_k = max((a.k for a in spec), default=0)
        self._arm_k = np.array([a.k for a in offered], dtype=np.int64)
        self._arm_drafter_slot = np.array(
            [-1, *(drafter_slot[a.drafter] for a in spec)], dtype=np.int64
        )
        # per speculative arm: its drafter's row in arrays laid out by self._drafters, and
        # its K - 1 (the column of its last position)
        self._arm_row = np.array([position[drafter_slot[a.drafter]] for a in spec], np.int64)
        self._arm_last = np.array([a.k - 1 for a in spec], dtype=np.int64)
        km = self._max_k
        cfg_samples = self.config.num_samples
        width = len(slots) * km
        self._z_negated = -self._z_acceptance[:, self._drafters, :km].reshape(cfg_samples, width)
        # _cumulative_negated sums -(values at positions 1..j) within each drafter's block;
        # _arm_positions sums reach probabilities 1..K of each arm's drafter
        block = np.triu(np.full((km, km), -1.0, dtype=np.float32))
        self._cumulative_negated = np.kron(np.eye(len(slots), dtype=np.float32), block)
        self._arm_positions = np.zeros((width, len(spec)), dtype=np.float32)
        for i, arm in enumerate(spec):
            start = position[drafter_slot[arm.drafter]] * km
            self._arm_positions[start : start + arm.k, i] = 1.0
        # per drafter, off's column then the drafter's columns by K
        self._k_chains = [
            np.array([0, *(i for i, a in enumerate(offered) if a.drafter == d)], dtype=np.int64)
            for d in dict.fromkeys(a.drafter for a in spec)
        ]
        # cost features of each arm run by a whole batch of B requests with e extra tokens:
        # one + B * batch + e * extra (see cost.arm_features)
        nd = self.config.max_drafters
        k = self._arm_k.astype(np.float64)
        kc = self.learned.cost.k_columns
        ncc = self.learned.cost.class_columns
        self._feature_one = arm_features(0.0, 0.0, self._arm_drafter_slot, k, nd, kc, ncc)
        self._feature_batch = arm_features(1.0, 0.0, self._arm_drafter_slot, k, nd, kc, ncc)
        self._feature_batch -= self._feature_one
        self._feature_extra = arm_features(0.0, 1.0, self._arm_drafter_slot, k, nd, kc, ncc)
        self._feature_extra -= self._feature_one
        self._arm_names = tuple(a.name for a in offered)
        self._arm_chain = np.full(len(offered), -1, dtype=np.int64)
        for j, chain in enumerate(self._k_chains):
            self._arm_chain[chain[1:]] = j

    def _samples(self, slot: int | None, bucket: int) -> ContextDraws:
        if slot is not None:
            joint = self._joint_samples(bucket)
            if slot in joint:
                return joint[slot]
        version = (
            int(self._class_version[slot]) if slot is not None else -1,
            int(self._bucket_version[bucket]),
            self._arms_version,
        )
        cached = self._alone.get((slot, bucket))
        if cached is not None and cached[0] == version:
            return cached[1]
        draws = self._alone_samples(slot, bucket)
        self._alone[(slot, bucket)] = (version, draws)
        return draws

    def _alone_samples(self, slot: int | None, bucket: int) -> ContextDraws:
        """The draws of a class decided alone in the bucket (or of no class yet)."""
        tokens = self._token_samples(slot)
        batch_size, step_time, _ = self._step_time_samples(bucket)
        price = self._class_price(slot, bucket)
        if price is not None:
            # the class's own price, per request: never below off's step
            step_time = np.maximum(
                step_time + (batch_size * price).astype(np.float32), step_time[:, :1]
            )
        pair = self._pair_price(slot, bucket)
        if pair is not None:
            step_time = np.maximum(
                step_time + (batch_size * pair).astype(np.float32), step_time[:, :1]
            )
        unproposed = self._unproposed_time(slot, bucket)
        if unproposed is not None:
            step_time = np.maximum(step_time - batch_size * unproposed, step_time[:, :1])
        goodput = tokens / step_time
        goodput *= batch_size
        return ContextDraws(goodput, tokens, step_time)

    def _step_time_samples(self, bucket: int) -> tuple[float, np.ndarray, np.ndarray]:
        """The bucket's batch size, draws of step time, (num_samples, arms), and the part
        of each arm's step time that is batch-wide drafting (see cost); cached."""
        version = (int(self._bucket_version[bucket]), self._arms_version)
        cached = self._step_times.get(bucket)
        if cached is not None and cached[0] == version:
            return cached[1], cached[2], cached[3]
        batch_size = self.learned.load.batch_size(bucket)
        extra = self.learned.load.extra_tokens(bucket)
        # a step in which the whole batch ran each offered arm (see cost.arm_features)
        features = self._feature_one + batch_size * self._feature_batch
        features += extra * self._feature_extra
        features[:, self.learned.cost.unused_columns()] = 0.0
        theta_mean, factor = self.learned.cost.posterior(
            bucket, self.learned.typical_features(bucket)
        )
        # the line's coefficients are drawn; the arms' own columns, taken at their mean
        # (see cost), add a constant per arm
        cs = self.learned.cost.arm_start
        factor = factor[:cs, :cs]
        theta = self._z_cost @ factor.T.astype(np.float32)
        theta += theta_mean[:cs].astype(np.float32)
        step_time = theta @ features[:, :cs].T.astype(np.float32)
        step_time += (features[:, cs:] @ theta_mean[cs:]).astype(np.float32)
        token_s = np.maximum(theta[:, 1], 0.0)
        # each speculative arm's extra step time over off is drawn from its Gaussian
        # posterior conditioned on being >= 0 (see truncated): speculation never makes a
        # step cheaper, and clipping at off instead would make an arm free in every draw
        # that says it is cheaper, where a hair of extra tokens then beats off
        contrast_sd = np.zeros(len(self._arms))
        for chain in self._k_chains:
            spec = chain[1:]
            extra = features[spec] - features[0]
            scale = extra[:, :cs] @ factor
            sd = np.maximum(np.sqrt((scale * scale).sum(axis=1)), 1e-12)
            contrast_sd[spec] = sd
            z = self._z_cost.astype(np.float64) @ (scale / sd[:, None]).T
            step_time[:, spec] = step_time[:, :1] + nonnegative_draws(extra @ theta_mean, sd, z)
        # a draw may not make an arm more than 1/_MAX_SPEEDUP_OF_DRAW times faster than its
        # posterior mean: the Gaussian posterior knows nothing of step times being positive
        floor = np.maximum(features @ theta_mean / _MAX_SPEEDUP_OF_DRAW, MIN_STEP_TIME_S)
        np.maximum(step_time, floor.astype(np.float32), out=step_time)
        # each draw's step time never decreases with K: a monotone envelope rather than
        # clipped coefficients, which would break the cancellations between correlated
        # coefficients and inflate long drafts' cost
        for chain in self._k_chains:
            step_time[:, chain[1:]] = np.maximum.accumulate(step_time[:, chain], axis=1)[:, 1:]
        # the drafter's passes for the whole batch: batch size x K x its batch-wide cost
        # (none for a drafter run per request)
        batch_wide = np.zeros_like(step_time)
        spec = self._arm_drafter_slot[1:]
        runs_batch = self.learned.cost.batch_wide[spec]
        slope = np.maximum(theta[:, drafter_feature(spec, 2)], 0.0) * runs_batch
        second = np.maximum(theta[:, drafter_feature(spec, 3)], 0.0) * runs_batch
        k = self._arm_k[1:]
        batch_wide[:, 1:] = slope * (batch_size * k).astype(np.float32)
        batch_wide[:, 1:] += second * (batch_size * (k >= 2)).astype(np.float32)
        np.minimum(batch_wide, step_time - step_time[:, :1], out=batch_wide)
        self._step_times[bucket] = (version, batch_size, step_time, batch_wide)
        self._token_times[bucket] = token_s
        self._off_contrast[bucket] = (features @ theta_mean, contrast_sd)
        return batch_size, step_time, batch_wide

    def _class_price(self, slot: int | None, bucket: int) -> np.ndarray | None:
        """Per offered arm, what a request of the class costs beyond the arm's price for
        the bucket's mix of classes (0 for ``off``); None where it costs the mix's."""
        if slot is None or len(self._arms) < 2:
            return None
        price = self.learned.cost.class_price(bucket, slot)
        if price is None:
            return None
        out = np.zeros(len(self._arms))
        out[1:] = price[self._arm_drafter_slot[1:]]
        return out

    def _pair_price(self, slot: int | None, bucket: int) -> np.ndarray | None:
        """Per offered arm, what a request of the class costs at it beyond the cost
        model's price (0 for ``off``: see :mod:`specctl.policy.pair_cost`); None where
        nothing is beyond it."""
        pairs = self.learned.cost.pairs
        if pairs is None or slot is None or len(self._arms) < 2:
            return None
        out = np.zeros(len(self._arms))
        out[1:] = pairs.deviations(bucket, slot, self._arm_drafter_slot[1:], self._arm_k[1:])
        return out if out.any() else None

    def _off_contrast_sd(self, bucket: int) -> np.ndarray:
        """Per arm, the posterior standard deviation of its extra step time over ``off``
        at the bucket's typical batch, relative to its mean step time (0 for ``off``)."""
        self._step_time_samples(bucket)
        mean, sd = self._off_contrast[bucket]
        return sd / np.maximum(mean, MIN_STEP_TIME_S)

    def _unproposed_time(self, slot: int | None, bucket: int) -> np.ndarray | None:
        """Per draw and arm, the verification a request of the class does not pay because
        its drafter proposed fewer than the arm's K: (num_samples, arms), or None where
        every round proposes its K.

        An n-gram lookup proposes only where the context repeats, and a round without a
        match verifies nothing. The step time of an arm is a step in which every request
        verifies K drafts; a class whose rounds propose a quarter of that verifies a
        quarter. Only the target's verification of the tokens is taken off: what the
        drafter itself costs per request and per pass over the batch (a model drafter
        runs for every request of a step, matched or not) is charged as learned, per
        round of the arm.
        """
        if slot is None or len(self._arms) < 2:
            return None
        share = self.learned.acceptance.drafted_share(
            slot, self._drafters, self._max_k, _PROPOSED_PRIOR_ROUNDS
        )
        unverified = np.zeros(len(self._arms))
        unverified[1:] = self._arm_k[1:] * (1.0 - share[self._arm_row, self._arm_last])
        if not unverified.any():
            return None
        self._step_time_samples(bucket)
        return self._token_times[bucket][:, None] * unverified.astype(np.float32)[None, :]

    def _joint_samples(self, bucket: int) -> dict[int, ContextDraws]:
        """Per class slot sharing the bucket's batches, the engine's goodput draws for each
        of its arms while the other classes run their part of the best joint choice.

        Classes in one batch share its step: a class's long drafts lengthen the step
        for every request in it, and a model drafter proposes the step's largest K for
        the whole batch whatever each class verifies. Deciding each class as if it
        were the whole batch then lets one class buy a gain that the others pay for
        (a greedy class at K=4 next to two classes that accept little runs slower in
        total than no speculation). So, per posterior draw, the joint choice that gives
        the classes' work the most committed tokens per second of engine time
        (:class:`~specctl.policy.joint.JointChoice`, :meth:`_refresh_joint`) is kept,
        and each class's goodput draws are those of its arms while the others run
        their part of it: Thompson sampling over joint choices, read per class.
        """
        members = self.learned.mix_members(bucket)
        if members.shape[0] < 2 or len(self._arms) < 2:
            return {}
        profile = self._profiles.get(bucket)
        key = (self._arm_names, tuple(int(m) for m in members))
        versions = (
            int(self._bucket_version[bucket]),
            self._arms_version,
            tuple(int(v) for v in self._class_version[members]),
            profile[1] if profile is not None else -1,
        )
        cached = self._joint.get(bucket)
        if cached is not None and cached[0] == versions:
            return cached[1]
        game, tokens = self._joint_game(bucket, members)
        if profile is not None and profile[0] == key:
            best = profile[2]
        else:  # classes the last update did not see together yet
            best = game.best(tokens)
        out: dict[int, ContextDraws] = {}
        game.start(best)
        for i, m in enumerate(members):
            goodput, step = game.response(i)
            out[int(m)] = ContextDraws(
                goodput.astype(np.float32), tokens[i].astype(np.float32), step.astype(np.float32)
            )
        self._joint[bucket] = (versions, out)
        return out

    def _refresh_joint(self, bucket: int) -> None:
        """Work out the bucket's best joint choice per draw again, after an update, when
        its classes changed or ``_JOINT_REFRESH_STEPS`` of its steps have passed: the
        choice moves with the evidence, which a handful of steps barely moves, and the
        search costs a few milliseconds."""
        members = self.learned.mix_members(bucket)
        if members.shape[0] < 2 or len(self._arms) < 2:
            self._profiles.pop(bucket, None)
            return
        key = (self._arm_names, tuple(int(m) for m in members))
        steps = int(self.learned.bucket_steps[bucket])
        profile = self._profiles.get(bucket)
        if profile is not None and profile[0] == key and steps - profile[1] < _JOINT_REFRESH_STEPS:
            return
        game, tokens = self._joint_game(bucket, members)
        self._profiles[bucket] = (key, steps, game.best(tokens))

    def _joint_game(self, bucket: int, members: np.ndarray) -> tuple[JointChoice, list]:
        batch_size, step_time, batch_wide = self._step_time_samples(bucket)
        off = step_time[:, 0].astype(np.float64)
        per_request = (step_time - step_time[:, :1] - batch_wide).astype(np.float64)
        per_request /= batch_size
        per_class = []
        for m in members:
            unproposed = self._unproposed_time(int(m), bucket)
            mine = per_request
            price = self._class_price(int(m), bucket)
            if price is not None:
                mine = np.maximum(mine + price, 0.0)
            pair = self._pair_price(int(m), bucket)
            if pair is not None:
                mine = np.maximum(mine + pair, 0.0)
            per_class.append(mine if unproposed is None else np.maximum(mine - unproposed, 0.0))
        tokens = [self._token_samples(int(m)).astype(np.float64) for m in members]
        game = JointChoice(
            off,
            per_class,
            batch_wide.astype(np.float64),
            self._arm_chain,
            len(self._k_chains),
            batch_size,
            self.learned.token_demand(bucket, members),
            tokens,
            step_time,
        )
        return game, tokens

    def _token_samples(self, slot: int | None) -> np.ndarray:
        """Draws of committed tokens per round, (num_samples, arms); cached per class."""
        version = (int(self._class_version[slot]) if slot is not None else -1, self._arms_version)
        cached = self._tokens.get(slot)
        if cached is not None and cached[0] == version:
            return cached[1]
        alpha, beta = self.learned.acceptance.posterior(slot, self._drafters, self._max_k)
        n = (alpha + beta).ravel()
        mean = alpha.ravel() / n
        sd = 1.0 / np.sqrt((n + 1.0) * mean * (1.0 - mean))
        # each position's rate drawn as logistic(logit(mean) + sd * z); t below is
        # -log(rate) = log1p(exp(-logit(mean) - sd * z))
        t = self._z_negated * sd.astype(np.float32)
        t += (np.log1p(-mean) - np.log(mean)).astype(np.float32)
        np.exp(t, out=t)
        np.log1p(t, out=t)
        # sums of -log(rate) over positions 1..j, by a matmul with a block-triangular
        # matrix (much faster than cumsum on short rows), then reach = prod of rates
        reach = t @ self._cumulative_negated
        np.exp(reach, out=reach)
        tokens = np.ones((self.config.num_samples, len(self._arms)), dtype=np.float32)
        tokens[:, 1:] += reach @ self._arm_positions
        self._correct_by_arm(slot, tokens)
        # a longer draft commits at least what its first K tokens would: each drafter's
        # draws never decrease with K (its own noisy measurement could make them)
        for chain in self._k_chains:
            tokens[:, chain[1:]] = np.maximum.accumulate(tokens[:, chain[1:]], axis=1)
        self._tokens[slot] = (version, tokens)
        return tokens

    def _correct_by_arm(self, slot: int | None, tokens: np.ndarray) -> None:
        """Blend each arm's draws with what the arm itself measured, in place.

        The censored model shares acceptance across K, which is what lets one
        K=5 round inform K=1..4; but where a drafter's acceptance at a
        position depends on the K it was configured with (block drafters), or
        requests differ in ways one curve per class does not capture, its
        prediction for a K is biased however much data it has. So the model's
        draw weighs as ``model_rounds`` rounds against the arm's own mean
        accepted drafts over the rounds it ran (drawn from its normal
        approximation): an arm that ran a lot is judged by its own
        measurement, an arm that never ran by the model.
        """
        w0 = self.config.model_rounds
        if slot is None or len(self._arms) < 2:
            return
        n, mean, var = self.learned.acceptance.arm_posterior(slot, self._drafters, self._max_k)
        rows, ks = self._arm_row, self._arm_last
        n_arm = n[rows, ks]
        if not (n_arm > 0).any():
            return
        # the variance of a mean of correlated rounds: at least that of 1/4 as many rounds
        sd = np.sqrt((var[rows, ks] + 0.05) / np.maximum(n_arm, 1.0) * 4.0)
        z = self._z_arm_tokens[:, self._drafters[rows], ks]
        # a round commits its verified token and at most its K drafts, whatever the noise
        direct = np.clip(1.0 + mean[rows, ks] + sd * z, 1.0, 2.0 + ks)
        weight = (n_arm / (n_arm + w0)).astype(np.float32)
        tokens[:, 1:] = (1.0 - weight) * tokens[:, 1:] + weight * direct.astype(np.float32)
