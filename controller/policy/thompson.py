"""specctl's own policy: Thompson sampling on goodput, per (workload class, load bucket).

What is optimised is goodput, committed tokens per second of engine time. For
arm ``(d, K)`` in class c at load bucket b::

    goodput = B_b * E[tokens | c, d, K] / E[step time | b, d, K]

``E[tokens]`` comes from the censored per-position acceptance model of
(c, d) (:mod:`specctl.policy.acceptance`), shared across K; the step time
from the per-bucket cost model (:mod:`specctl.policy.cost`), monotone in
K; ``B_b`` is the bucket's typical batch size. It reads "if the whole batch at
this load ran this arm", which is what a class alone in its batches gets;
classes that share batches are compared on the batch's goodput instead (see
:class:`~specctl.policy.joint.JointChoice`). ``off`` commits one token per request-round.

Decision rule. The distribution pushed to engines is the posterior
probability that each arm has the highest goodput: Thompson sampling's
probability matching, with the sampling done by the engines. Why this rule:

- it explores in proportion to the chance of being best, so a clearly worse
  arm stops being played and a close call keeps being tested; UCB instead
  plays one arm deterministically (no propensities to replay, and every
  engine herds onto the same arm between pushes), EXP3 is built for
  adversarial rewards and explores far more than needed here, and
  epsilon-greedy spends a fixed share on arms known to be bad (long K under
  heavy load is the expensive case);
- the probabilities are exact propensities for offline replay;
- structure enters through the posterior, not the rule: one K=5 round
  sharpens K=1..4, and one step time sharpens every arm's cost.

Tempered draws. The choice among the speculative arms can be made from
draws tempered to ``posterior_scale`` times the posterior's spread (each arm's
goodput draws pulled toward its posterior mean; 1 by default). The posterior
is deliberately wide where it cannot be exact: a drafter's positions are drawn
correlated, an arm's own measurement as if it held a quarter of its rounds, a
cost coefficient no step separates at its prior; probability matching on it
keeps arms within a few percent of each other sharing the distribution for a
long time, and each is paid. ``off`` keeps its untempered probability of being
best, and the switch-off and the probes read the untempered posterior: a
narrower posterior there switches a class off on less evidence, and a class
that speculation helps is then left to its probes. Only how the speculating
share splits over drafters and K is tempered (docs/learning.md, "Tempered
draws").

The posterior probabilities are computed by Monte Carlo with ``num_samples``
draws per context, from standard normal draws fixed at construction from
``seed``: decisions are deterministic given the reports
(:mod:`specctl.policy.thompson_draws`).

Memory. A steady workload must get a steady decision, and the evidence
behind it must be long: with a memory of a hundred steps the posterior stays
wide, and probability matching then moves mass between arms on noise.
Acceptance evidence is not discounted by default (``discount`` 1 per step that
carried the class) and is capped at ``max_rounds`` (50,000) rounds per (class,
drafter) and per arm, scaled down as more arrive; step-time evidence is
discounted by ``cost_discount`` (0.999) per step in the bucket. In a steady
workload forgetting only keeps the posterior from narrowing: with 0.999 and
5,000 rounds, arms within 1-2% of each other kept sharing the distribution
for as long as the workload lasted, and what drifts is caught by the change
detection. Change is detected rather than waited out: acceptance keeps a
recent window as well
(``recent_discount``, 0.99) and a position whose recent rate has moved from
the long one by ``change_min_shift`` and ``change_z`` standard errors replaces
the long counts with the recent ones (:mod:`specctl.policy.acceptance`);
step time has Huber-weighted updates and a CUSUM on its residuals
(:mod:`specctl.policy.cost`). After a step change in acceptance, old
evidence therefore keeps at most ``recent_discount ** n`` of its weight in the
recent window after n of the class's steps, and once the shift is detected
the posterior reads only that window: the documented bound for the choice to
follow is that of the recent window, 230 of the class's steps at 0.99
(:func:`tracking_bound_steps`); the tests show a drop from 0.9 to 0.3
acceptance followed well within it.

Switch-off. When ``P(off is best) >= switch_off_confidence`` the context
switches off and stays so until ``P(off is best)`` falls below
``switch_on_confidence`` (hysteresis, so a close call does not flap). Which
contexts are off moves as the policy learns, after each update
(:mod:`specctl.policy.switch_off`), never when a decision is read. Off,
it still runs speculation on at least ``probe_budget`` of its request-rounds
for its first ``probe_decay_steps`` steps off, then on a share that shrinks
as 1/steps down to ``probe_floor``, or to what keeps a change visible in a
small class's recent window (:meth:`SpecctlPolicy._probe_floor`); more while
``P(off is best)`` is lower, and back at the budget when a change in the
class's acceptance or the bucket's cost is detected. The probes are spread
over the speculative arms by their posterior probability of being the best
of them: where a long draft's cost or acceptance is uncertain enough to win,
some probes go there, and a fixed probe at one short K would leave the rest
at its prior. The probes keep acceptance and cost measured, so a recovery is
found and off is never permanent.

Classes that share a batch are decided together
(:meth:`~specctl.policy.thompson_draws.PosteriorDraws._joint_samples`):
the step's deepest K sets its cost for every request in it, and a class's
requests hold their slots for as long as its tokens take, so what is
maximised is the engine's goodput over the work the classes bring
(:class:`~specctl.policy.joint.JointChoice`).

Cold start. A class with fewer than ``cold_start_rounds`` (decayed)
request-rounds runs ``prior_arm`` (for example the engine's configured K)
with weight ``1 - rounds / cold_start_rounds``, mixed with what the rule above
decides (the Thompson distribution, or off and its probes), so a new class does
not start by exploring wildly.

Fleet. Replicas of one model can share what they learn
(:mod:`specctl.policy.shared`): :meth:`SpecctlPolicy.contribution` is this
replica's own evidence, and :meth:`SpecctlPolicy.merge_shared` takes the sum
of the others', which the models keep apart from their own and weigh into
the posterior; the decision rule above is unchanged, it reads a posterior
that rests on more evidence.

This module is the decision rule and the order of learning: its parameters are
:class:`~specctl.policy.thompson_config.SpecctlConfig`; the evidence it decides
from is kept and updated by :mod:`specctl.policy.thompson_evidence`, drawn from
by :mod:`specctl.policy.thompson_draws`, and saved and restored by
:mod:`specctl.policy.thompson_state`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Self

import numpy as np

from specctl.arms import OFF, Arm, parse_arm
from specctl.policy.acceptance import MIN_RECENT_OBSERVATIONS, AcceptanceModel
from specctl.policy.base import ArmEstimate, Decision, Evidence, Policy
from specctl.policy.cost import CostModel
from specctl.policy.load import BucketLoad
from specctl.policy.pair_cost import PairCost
from specctl.policy.params import parse_config
from specctl.policy.shared import MergeReport, SharedEvidence
from specctl.policy.state import PolicyState, StateValue
from specctl.policy.switch_off import SwitchOff
from specctl.policy.thompson_config import SpecctlConfig
from specctl.policy.thompson_draws import ContextDraws, PosteriorDraws
from specctl.policy.thompson_evidence import ThompsonEvidence
from specctl.policy.thompson_state import load_evidence, policy_state, read_state
from specctl.steps import StepBatch


class SpecctlPolicy(PosteriorDraws, Policy):
    """Censored acceptance x measured cost, Thompson probabilities, switch-off with probes."""

    policy_name = "specctl"
    # 2: the cost model's features gained each drafter's requests verifying a second draft
    # 3: each bucket's committed tokens per class and its steps without speculation, and
    # each switched-off context's steps off
    # 4: the cost model's decode and prefill tokens as two features
    # 6: a step-cost column per drafter and K (cost_k_columns)
    # 7: a step-cost column per class and drafter (cost_class_columns)
    # 8: per (class, arm) step-cost deviations (cost_pair_columns)
    state_version = 8

    def __init__(self, config: SpecctlConfig | None = None) -> None:
        self.config = cfg = config or SpecctlConfig()
        self.prior_arm = parse_arm(cfg.prior_arm) if cfg.prior_arm is not None else None
        self.load_bucket_bounds = tuple(cfg.load_bucket_bounds)
        self.num_buckets = len(self.load_bucket_bounds) + 1
        acceptance = AcceptanceModel(
            cfg.max_classes,
            cfg.max_drafters,
            discount=cfg.discount,
            prior_mean=cfg.prior_acceptance,
            prior_strength=cfg.prior_strength,
            max_rounds=cfg.max_rounds,
            fleet_max_rounds=cfg.fleet_max_rounds,
            recent_discount=cfg.recent_discount,
            change_z=cfg.change_z,
            change_min_shift=cfg.change_min_shift,
        )
        cost = CostModel(
            self.num_buckets,
            cfg.max_drafters,
            discount=cfg.cost_discount,
            prior_step_s=cfg.prior_step_s,
            prior_token_s=cfg.prior_token_s,
            prior_spread=cfg.prior_cost_spread,
            k_columns=cfg.cost_k_columns,
            class_columns=min(cfg.cost_class_columns, cfg.max_classes),
        )
        if cfg.cost_pair_columns:
            cost.pairs = PairCost(
                self.num_buckets,
                cost.num_features,
                cfg.max_classes,
                cfg.max_drafters,
                capacity=cfg.cost_pair_columns,
                discount=cfg.cost_pair_discount,
                z=cfg.cost_pair_z,
                by_drafter=cfg.cost_pair_centring == "class-drafter",
            )
        # the bucket's typical batch size is kept as long as its step cost
        load = BucketLoad(self.load_bucket_bounds, cfg.cost_discount)
        # the evidence: the models, the class and drafter slots, each bucket's class mix
        self.learned = ThompsonEvidence(acceptance, cost, load, cfg.max_classes, cfg.max_drafters)
        # versions: a cached decision is valid while its inputs' versions are unchanged
        self._tick = 0
        self._class_version = np.zeros(cfg.max_classes, dtype=np.int64)
        self._bucket_version = np.zeros(self.num_buckets, dtype=np.int64)
        self._arms_version = 0
        self._decisions: dict[tuple[str | None, int], tuple[tuple[int, ...], Decision]] = {}
        # contexts switched off (learned), and the versions each was last observed at
        self.switch_off = SwitchOff(cfg.switch_off_confidence, cfg.switch_on_confidence)
        self._observed: dict[tuple[str, int], tuple[int, ...]] = {}
        self._start_draws(cfg, cost)
        self.set_arms([OFF])

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        return cls(parse_config(SpecctlConfig, params, cls.policy_name))

    # -- arms and slots -------------------------------------------------------

    def set_arms(self, arms: Sequence[Arm]) -> None:
        offered = [OFF, *dict.fromkeys(a for a in arms if not a.is_off)]
        for arm in offered[1:]:
            if self.learned.slot_of_drafter(arm.drafter) < 0:
                raise ValueError(
                    f"specctl policy: drafter {arm.drafter!r} exceeds max_drafters="
                    f"{self.config.max_drafters} (known: {sorted(self.learned.drafter_slot)})"
                )
        # off first, then each drafter's arms by K: the draws' cost envelope relies on it
        drafter_slot = self.learned.drafter_slot
        spec = sorted(offered[1:], key=lambda a: (drafter_slot[a.drafter], a.k))
        offered = [OFF, *spec]
        self._arms = tuple(offered)
        self._lay_out_arms(offered, spec)
        self._prior_index = self._prior_arm_index()
        self._arms_version = self._next_tick()

    @property
    def arms(self) -> tuple[Arm, ...]:
        return self._arms

    def _forget_decisions(self, name: str, slot: int) -> None:
        """Drop what was worked out for a class the evidence has forgotten (its own price
        in the step cost too, so every bucket's draws change)."""
        self._tokens.pop(slot, None)
        for b in range(self.num_buckets):
            self._alone.pop((slot, b), None)
        self._class_version[slot] = self._bucket_version[:] = self._next_tick()
        for b in range(self.num_buckets):
            self._decisions.pop((name, b), None)
            self._observed.pop((name, b), None)
        self.switch_off.forget(name)

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def _prior_arm_index(self) -> int | None:
        prior = self.prior_arm
        if prior is None:
            return None
        if prior.is_off:
            return 0
        ks = [(i, a.k) for i, a in enumerate(self._arms) if a.drafter == prior.drafter]
        if not ks:
            return None
        # the configured K, or the longest the engines offer below it
        below = [(k, i) for i, k in ks if k <= prior.k]
        return max(below)[1] if below else min((k, i) for i, k in ks)[1]

    # -- learning -------------------------------------------------------------

    def update_params(self, batch: StepBatch) -> None:
        tick = self._next_tick()
        acceptance_changes = self.learned.acceptance.changes.copy()
        cost_changes = self.learned.cost.changes.copy()
        batch_wide = self.learned.cost.batch_wide.copy()
        update = self.learned.update(batch)
        if (self.learned.cost.batch_wide != batch_wide).any():
            # a drafter now has batch-wide cost terms: every bucket's draws change
            self._bucket_version[:] = tick
        for name, slot in update.evicted:
            self._forget_decisions(name, slot)
        self._class_version[update.class_slots] = tick
        self._bucket_version[update.buckets] = tick
        for b in np.unique(update.buckets).tolist():
            self._refresh_joint(b)
        self._count_steps_off(batch, update.class_slots)
        for slot in np.flatnonzero(self.learned.acceptance.changes != acceptance_changes):
            self.switch_off.restart_probes(workload_class=self.learned.slot_class[int(slot)])
        for b in np.flatnonzero(self.learned.cost.changes != cost_changes):
            self.switch_off.restart_probes(bucket=int(b))
        self._observe_switch_off()

    def _count_steps_off(self, batch: StepBatch, class_slots: np.ndarray) -> None:
        """Each switched-off context's steps in the report: its probes shrink with them."""
        if not self.switch_off.off_steps or batch.num_rows == 0:
            return
        num_classes = class_slots.shape[0]
        pairs = np.unique(batch.request_step * num_classes + batch.class_index)
        step, index = np.divmod(pairs, num_classes)
        bucket = np.minimum(batch.load_bucket[step], self.num_buckets - 1)
        contexts, counts = np.unique(index * self.num_buckets + bucket, return_counts=True)
        names = batch.classes
        self.switch_off.count_steps(
            {
                (names[int(c) // self.num_buckets], int(c) % self.num_buckets): int(n)
                for c, n in zip(contexts.tolist(), counts.tolist(), strict=True)
            }
        )

    def _observe_switch_off(self) -> None:
        """Let each class's switch-off follow its P(off is best), in every bucket whose
        decision inputs moved since it was last observed."""
        if len(self._arms) == 1:
            return
        for b in range(self.num_buckets):
            members = self.learned.mix_members(b)
            for name, slot in self.learned.class_slot.items():
                versions = self._versions(slot, b, members)
                if self._observed.get((name, b)) != versions:
                    self._observed[(name, b)] = versions
                    p_off_best = float(self._samples(slot, b).prob_best()[0])
                    self.switch_off.observe((name, b), p_off_best)

    def reset_class(self, workload_class: str) -> None:
        if workload_class in self.learned.class_slot:
            self._forget_decisions(workload_class, self.learned.forget(workload_class))

    # -- the fleet ------------------------------------------------------------

    def contribution(self) -> SharedEvidence:
        """This replica's own evidence, to share with the fleet (a read)."""
        return self.learned.contribution()

    def merge_shared(self, shared: SharedEvidence | None) -> MergeReport:
        """Decide from the fleet's evidence ``shared`` (the sum of the other replicas'
        contributions) as well as this replica's own, in place of what was merged
        before; None merges nothing. What the merge had to leave out."""
        batch_wide = self.learned.cost.batch_wide.copy()
        update = self.learned.merge_shared(shared)
        for name, slot in update.forgotten:
            self._forget_decisions(name, slot)
        tick = self._next_tick()
        self._class_version[update.class_slots] = tick
        self._bucket_version[update.buckets] = tick
        if (self.learned.cost.batch_wide != batch_wide).any():
            self._bucket_version[:] = tick
        self._observe_switch_off()
        return update.left_out

    # -- deciding -------------------------------------------------------------

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        self._check_bucket(load_bucket)
        slot = self.learned.class_slot.get(workload_class)
        key = (workload_class if slot is not None else None, load_bucket)
        versions = self._versions(slot, load_bucket, self.learned.mix_members(load_bucket))
        context = (workload_class, load_bucket)
        versions += (
            int(context in self.switch_off.contexts),
            int(self.switch_off.off_steps.get(context, -1.0)),
        )
        cached = self._decisions.get(key)
        if cached is not None and cached[0] == versions:
            return cached[1]
        decision = self._decide(slot, load_bucket, key[0])
        self._decisions[key] = (versions, decision)
        return decision

    def _versions(self, slot: int | None, bucket: int, members: np.ndarray) -> tuple[int, ...]:
        """The versions of what a context's posterior rests on: it is unchanged while they are."""
        return (
            int(self._class_version[slot]) if slot is not None else -1,
            int(self._bucket_version[bucket]),
            self._arms_version,
            # a class decided with others depends on their evidence too
            int(self._class_version[members].max())
            if slot is not None and bool((members == slot).any())
            else -1,
        )

    def _check_bucket(self, load_bucket: int) -> None:
        if not 0 <= load_bucket < self.num_buckets:
            raise ValueError(
                f"load_bucket={load_bucket} must be in 0..{self.num_buckets - 1} "
                f"(bounds {list(self.load_bucket_bounds)})"
            )

    def _decide(self, slot: int | None, bucket: int, workload_class: str | None) -> Decision:
        arms = self._arms
        if len(arms) == 1:
            return Decision.point(OFF, "off: no speculative arm offered")
        samples = self._samples(slot, bucket)
        p_best = samples.prob_best()
        p_loses = float(p_best[0])
        cfg = self.config
        context = (workload_class or "", bucket)
        if self.switch_off.is_off(context, p_loses):
            probe = self._probe_distribution(samples)
            share = self.switch_off.probe_share(
                context, cfg.probe_budget, self._probe_floor(slot, bucket), cfg.probe_decay_steps
            )
            budget = max(share, 1.0 - p_loses)
            if probe is None or cfg.probe_budget == 0.0:
                probs = np.zeros(len(arms))
                probs[0] = 1.0
                explanation = f"off: P(spec loses)={p_loses:.2f}"
            else:
                probs = budget * probe
                probs[0] = 1.0 - budget
                top = int(np.argmax(probe))
                explanation = (
                    f"off: P(spec loses)={p_loses:.2f}, probing {_percent(budget)}, "
                    f"mostly {arms[top]}"
                )
        else:
            probs = self._speculating_shares(samples, p_best)
            mode = int(np.argmax(probs))
            explanation = f"thompson: {arms[mode]} P(best)={probs[mode]:.2f}"
            control = self._control_share(slot, bucket, samples, mode)
            if control > 0.0 and probs[0] < control:
                probs = probs * (1.0 - control)
                probs[0] += control
                explanation += f"; off {_percent(control)} as control"
        return self._with_cold_start(slot, probs, explanation)

    def _speculating_shares(self, samples: ContextDraws, p_best: np.ndarray) -> np.ndarray:
        """The distribution of a context that speculates: ``off`` at its posterior
        probability of being best, the rest split among the speculative arms by their
        probability of being best in draws tempered to ``posterior_scale`` (see the module
        docstring, "Tempered draws"). At 1 it is ``p_best`` itself."""
        scale = self.config.posterior_scale
        if scale == 1.0:
            return p_best
        tempered = samples.tempered(scale)
        split = tempered.prob_best()[1:]
        if split.sum() <= 0.0:  # every tempered draw has off ahead: split by the best of the rest
            split = tempered.prob_best_speculating()[1:]
        probs = np.empty_like(p_best)
        probs[0] = p_best[0]
        probs[1:] = (1.0 - p_best[0]) * split / split.sum()
        return probs

    def _with_cold_start(self, slot: int | None, probs: np.ndarray, explanation: str) -> Decision:
        """The decision mixed with ``prior_arm`` while the class is young, whichever way it
        was reached: a class switched off on its first rounds still runs the prior arm at
        the cold start's weight, as the operator who configured it expects."""
        cfg, arms = self.config, self._arms
        prior = self._prior_index
        rounds = self.learned.acceptance.total_rounds(slot) if slot is not None else 0.0
        if prior is not None and rounds < cfg.cold_start_rounds:
            weight = 1.0 - rounds / cfg.cold_start_rounds
            probs = probs * (1.0 - weight)
            probs[prior] += weight
            explanation = (
                f"cold start: {arms[prior]} at {_percent(weight)} "
                f"({rounds:.0f} of {cfg.cold_start_rounds:.0f} rounds); {explanation}"
            )
        return Decision(arms, probs / probs.sum(), explanation)

    def _probe_floor(self, slot: int | None, bucket: int) -> float:
        """The least share of a switched-off context's rounds that probe, however long it
        has been off: ``probe_floor``, or more where the class runs few requests a step.

        A change in the class's acceptance is seen in its recent window, which holds
        about ``1 / (1 - recent_discount)`` of the class's steps (100) and needs
        ``MIN_RECENT_OBSERVATIONS`` (20) rounds at a position to judge it. At 0.5% of
        its rounds a class of fewer than 40 requests a step never holds that many
        probes there; with its acceptance kept until it changes, it then comes back
        only once its probes outweigh what it learned before. So the floor is at least
        the share that keeps twice those 20 probes in the window, which at its mean
        would fall short half the time. ``probe_share`` caps it at the budget, where a
        class of fewer than 10 requests a step never holds 20 probes in the window and
        is brought back by its probes alone.
        """
        cfg = self.config
        if slot is None:
            return cfg.probe_floor
        requests = self.learned.requests_per_step(bucket, slot)
        window = 2.0 * MIN_RECENT_OBSERVATIONS * (1.0 - cfg.recent_discount)
        return max(cfg.probe_floor, window / max(requests, 1e-12))

    def _control_share(
        self, slot: int | None, bucket: int, samples: ContextDraws, mode: int
    ) -> float:
        """The share of rounds a speculating context runs ``off`` so that the bucket
        keeps steps without speculation in its memory.

        A drafter's fixed cost (its pass over the batch, the verification's first
        draft) is told from the cost of a step without speculation only by steps that
        have none: where every class speculates, the two move together in every step,
        the split rests on the prior, and speculation looks cheaper than it is (on the
        testbed at concurrency 30, with 10 of 401 steps free of speculation, the policy
        put a greedy class's K=1 at 13% over ``off`` where it was 23%). Each class
        draws its arm with the step's one uniform over arms ordered ``off`` first, so
        a share of ``off`` in every context makes whole steps without speculation.

        The share is what the decision needs, no more. It fades as the bucket's
        memory fills with such steps (``control_steps``), and it fades as the
        posterior of the chosen arm's extra step time over ``off`` narrows against
        its gain over ``off``: with ``s`` that standard deviation relative to the
        arm's step and ``g`` the arm's relative gain in goodput, the share is full
        while ``control_z * s >= 2 g`` and none once ``control_z * s <= g``. An arm far
        ahead of ``off`` needs few such steps to be known ahead; one close to it needs
        many, and there Thompson sampling runs ``off`` anyway. Classes decided together
        share their steps, and a step is free of speculation only where all of them
        run ``off``: they keep the share the neediest of them asks. A fixed count of such
        steps in a memory of ``1 / (1 - cost_discount)`` steps would spend a fixed
        share of every context's rounds on ``off`` for as long as it runs, however
        far behind ``off`` is.
        """
        cfg = self.config
        if cfg.control_share == 0.0 or cfg.control_steps == 0.0 or mode == 0:
            return 0.0
        held = float(self.learned.cost.off_steps[bucket]) / cfg.control_steps
        if held >= 1.0:
            return 0.0
        joint = self._joint_samples(bucket) if slot is not None else {}
        if slot in joint:
            needed = self._joint_control_need(bucket, joint)
        else:
            needed = self._control_need(bucket, samples, mode)
        return cfg.control_share * (1.0 - held) * needed

    def _joint_control_need(self, bucket: int, joint: dict[int, ContextDraws]) -> float:
        """What the neediest of the classes decided together asks (see
        :meth:`_control_share`): the same for each of them, so worked out once per draw
        of the bucket."""
        versions = self._joint[bucket][0]
        cached = self._control_needs.get(bucket)
        if cached is not None and cached[0] == versions:
            return cached[1]
        needed = max(
            self._control_need(bucket, draws, int(np.argmax(draws.prob_best())))
            for draws in joint.values()
        )
        self._control_needs[bucket] = (versions, needed)
        return needed

    def _control_need(self, bucket: int, samples: ContextDraws, mode: int) -> float:
        """How much of the control share a context's choice of ``mode`` needs, 0 to 1
        (see :meth:`_control_share`)."""
        if mode == 0:
            return 0.0
        off_goodput = float(samples.goodput[:, 0].mean())
        gain = float(samples.goodput[:, mode].mean()) / max(off_goodput, 1e-12) - 1.0
        if gain <= 0.0:
            return 1.0
        spread = self.config.control_z * float(self._off_contrast_sd(bucket)[mode])
        return min(max(spread / gain - 1.0, 0.0), 1.0)

    def _probe_distribution(self, samples: ContextDraws) -> np.ndarray | None:
        """How a switched-off context's probes spread over the speculative arms.

        Each arm gets its posterior probability of being the best speculative
        arm (Thompson sampling among them), so probes go where speculation
        could win, at every K: a fixed probe at K=1 measures only ``c + t``
        of the cost ``c + K t``, and the cost of longer drafts then stays at
        its prior, and pessimistic, for as long as the context is off.
        """
        if len(self._arms) < 2:
            return None
        return samples.prob_best_speculating()

    # -- explaining -----------------------------------------------------------

    def evidence(self, workload_class: str, load_bucket: int) -> Evidence:
        decision = self.select_action(workload_class, load_bucket)
        slot = self.learned.class_slot.get(workload_class)
        acceptance_model = self.learned.acceptance
        rounds = acceptance_model.total_rounds(slot) if slot is not None else 0.0
        if len(self._arms) == 1:
            return Evidence(
                workload_class, load_bucket, rounds=rounds, explanation=decision.explanation
            )
        samples = self._samples(slot, load_bucket)
        p_best = samples.prob_best()
        low, high = np.quantile(samples.goodput, [0.05, 0.95], axis=0)
        estimates = tuple(
            ArmEstimate(
                arm=arm,
                expected_tokens=float(samples.tokens[:, i].mean()),
                expected_step_time_s=float(samples.step_time_s[:, i].mean()),
                goodput=float(samples.goodput[:, i].mean()),
                goodput_low=float(low[i]),
                goodput_high=float(high[i]),
                prob_best=float(p_best[i]),
            )
            for i, arm in enumerate(self._arms)
        )
        acceptance: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {}
        alpha, beta = acceptance_model.posterior(slot, self._drafters, self._max_k)
        prior_n = acceptance_model.prior_success + acceptance_model.prior_failure
        for drafter, d in self.learned.drafter_slot.items():
            where = np.flatnonzero(self._drafters == d)
            if where.size == 0:
                continue
            i = int(where[0])
            k = max(a.k for a in self._arms if a.drafter == drafter)
            n = alpha[i, :k] + beta[i, :k]
            acceptance[drafter] = (
                tuple(float(v) for v in alpha[i, :k] / n),
                tuple(float(v) for v in n - prior_n),
            )
        return Evidence(
            workload_class,
            load_bucket,
            arms=estimates,
            acceptance=acceptance,
            rounds=rounds,
            explanation=decision.explanation,
        )

    # -- persistence ----------------------------------------------------------

    def state_dict(self) -> PolicyState:
        """Everything learned, as plain arrays (no pickling); the config is not included."""
        return policy_state(
            self.policy_name,
            self.state_version,
            self.learned,
            self.switch_off,
            self._profiles,
            self.config.num_samples,
        )

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        """Restore :meth:`state_dict` output saved under the same config (or an unversioned
        one, saved before states had versions, whose missing keys keep their prior)."""
        saved = read_state(
            state,
            self.policy_name,
            self.state_version,
            self.learned,
            self.switch_off,
            self.config.num_samples,
        )
        # everything checked: from here on nothing can fail half-way
        load_evidence(self.learned, saved)
        # the fleet's evidence was placed by the slots the state replaced: it comes back
        # with the next merge
        self.learned.clear_shared()
        self.switch_off.load(saved.switched_off)
        self._decisions.clear()
        self._observed.clear()
        self._step_times.clear()
        self._token_times.clear()
        self._off_contrast.clear()
        self._tokens.clear()
        self._alone.clear()
        self._joint.clear()
        self._control_needs.clear()
        self._profiles = saved.profiles
        self._class_version[:] = self._next_tick()
        self._bucket_version[:] = self._tick
        # the offered arms' drafters keep their restored slots; new ones get free slots
        self._arms = tuple(
            a for a in self._arms if a.is_off or self.learned.slot_of_drafter(a.drafter) >= 0
        )
        self.set_arms(self._arms)


def _percent(p: float) -> str:
    text = f"{100.0 * p:.1f}".rstrip("0").rstrip(".")
    return f"{text}%"


def tracking_bound_steps(discount: float, remaining: float = 0.1) -> float:
    """Steps after which old evidence keeps at most ``remaining`` of its weight (inf: never)."""
    if discount >= 1.0:
        return math.inf
    return float(math.ceil(math.log(remaining) / math.log(discount)))
