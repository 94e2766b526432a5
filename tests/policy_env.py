"""A synthetic serving environment for policy tests: known acceptance, known step cost.

Each step, every request samples an arm from the policy's decision for its
(class, bucket), accepts each draft position with the class's acceptance
rate until the first rejection, and the step takes
``base_s + token_s * tokens + pass_s * deepest K``, plus Gaussian noise of
standard deviation ``noise_s`` (a loaded machine's wall-clock jitter). The
deepest K is that of the engine's own drafter (``batch_drafter``, the first
offered unless named), which drafts for the whole batch, and the report names it
and its K as the engine's do; any other drafter costs its tokens only, as an
n-gram lookup the scheduler runs per request does. The step is encoded and
validated through the real report path, so the policy sees exactly what the
sidecar would hand it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specctl.arms import Arm, parse_arm
from specctl.policy.base import Decision, Policy
from specctl.protocol.reports import decode_step_report, encode_step_report
from specctl.steps import StepBatch, StepRecord

BOUNDS = (8, 32, 128)


@dataclass
class SyntheticEnv:
    drafters: dict[str, int]
    acceptance: dict[str, float]  # drafter -> per-position acceptance
    base_s: float = 0.02
    token_s: float = 1e-4
    pass_s: float = 5e-4
    # what a step whose deepest K is 2 or more costs beyond pass_s * K: a draft model's
    # first token comes with a pass that runs anyway, its second does not
    second_pass_s: float = 0.0
    # what a step in which anything is drafted costs at all (a drafter's pass over the
    # batch that K does not scale): beyond a step without speculation
    spec_fixed_s: float = 0.0
    # drafter -> the share of rounds in which it proposes its K drafts (an n-gram lookup
    # proposes only where the context repeats; otherwise nothing); 1 if absent
    match_rate: dict[str, float] = field(default_factory=dict)
    noise_s: float = 0.0
    seed: int = 0
    # the drafter the engine runs for the whole batch ("": the first offered)
    batch_drafter: str = ""
    rng: np.random.Generator = field(init=False)
    steps: int = field(default=0, init=False)
    # every report handed to a policy, in order
    batches: list[StepBatch] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        if not self.batch_drafter:
            self.batch_drafter = next(iter(self.drafters), "")

    def run_step(
        self, policy: Policy, workload_class: str, bucket: int, batch_size: int
    ) -> tuple[StepBatch, Decision, list[Arm]]:
        decision = policy.select_action(workload_class, bucket)
        picks = self.rng.choice(len(decision.arms), size=batch_size, p=decision.probabilities)
        arms = [decision.arms[i] for i in picks]
        ks = np.array([a.k for a in arms])
        if self.match_rate:  # what each round proposed
            match = np.array([self.match_rate.get(a.drafter, 1.0) for a in arms])
            ks = np.where(self.rng.random(ks.shape[0]) < match, ks, 0)
        rates = np.array([self.acceptance.get(a.drafter, 0.0) for a in arms])
        batch = self._learn(
            policy,
            bucket,
            ks,
            rates,
            classes=[workload_class] * batch_size,
            arms=[a.name for a in arms],
            propensity=[decision.probability_of(a) for a in arms],
        )
        return batch, decision, arms

    def run_mixed_step(
        self, policy: Policy, classes: dict[str, tuple[int, float]], bucket: int
    ) -> dict[str, Arm]:
        """One step of a batch shared by several classes, as the engine runs it: one arm per
        class (sampled from its decision), every request of the class on that arm.
        ``classes`` maps a class to (requests, per-position acceptance); the step's time
        has the deepest K of the batch, whatever each class ran."""
        names, arms_of, ks, rates, propensities = [], [], [], [], []
        chosen: dict[str, Arm] = {}
        for name, (count, rate) in classes.items():
            decision = policy.select_action(name, bucket)
            arm = decision.arms[int(self.rng.choice(len(decision.arms), p=decision.probabilities))]
            chosen[name] = arm
            names += [name] * count
            arms_of += [arm.name] * count
            ks += [arm.k] * count
            rates += [rate] * count
            propensities += [decision.probability_of(arm)] * count
        self._learn(
            policy,
            bucket,
            np.array(ks),
            np.array(rates),
            classes=names,
            arms=arms_of,
            propensity=propensities,
        )
        return chosen

    def _learn(
        self,
        policy: Policy,
        bucket: int,
        ks: np.ndarray,
        rates: np.ndarray,
        *,
        classes: list[str],
        arms: list[str],
        propensity: list[float],
    ) -> StepBatch:
        """Run one step of these rows (K and per-position acceptance per row), encode it
        through the real report path and hand it to the policy."""
        # accepted = number of leading successes, at most K
        draws = self.rng.random((ks.shape[0], max(int(ks.max()), 1))) < rates[:, None]
        accepted = np.minimum(np.cumprod(draws, axis=1).sum(axis=1), ks)
        tokens = int((1 + ks).sum())
        batch_rows = np.array([parse_arm(a).drafter == self.batch_drafter for a in arms])
        depth = int(ks[batch_rows].max(initial=0))
        step_time = self.base_s + self.token_s * tokens + self.pass_s * depth
        step_time += self.second_pass_s * (depth >= 2) + self.spec_fixed_s * (depth >= 1)
        if self.noise_s > 0.0:
            step_time = max(step_time + self.noise_s * float(self.rng.standard_normal()), 1e-4)
        self.steps += 1
        record = StepRecord(
            step_index=self.steps,
            step_time_s=step_time,
            batch_size=int(ks.shape[0]),
            num_scheduled_tokens=tokens,
            policy_version=1,
            load_bucket=bucket,
            step_end_unix_s=1.7e9 + self.steps,
            classes=classes,
            arms=arms,
            propensity=propensity,
            drafted=[int(v) for v in ks],
            accepted=[int(v) for v in accepted],
            draft_k=depth,
        )
        batch = decode_step_report(
            encode_step_report(self.steps, [record]),
            engine_id="synthetic",
            offered=self.drafters,
            num_load_buckets=len(BOUNDS) + 1,
            batch_drafter=self.batch_drafter,
        )
        policy.update_params(batch)
        self.batches.append(batch)
        return batch
