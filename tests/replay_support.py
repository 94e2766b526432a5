"""A small synthetic logging environment with known true policy values, for replay tests.

Steps hold 4-16 decoding requests of two classes. Per (step, class) one arm is
drawn from a policy's distribution for the context (class, load bucket), as the
engine does; an n-gram drafter finds a match with a per-class probability and
then drafts K tokens, each accepted with a per-class probability until the
first rejection. A step costs ``C + A*rows + B*drafted`` seconds times
log-normal noise of mean one. The true value of a policy is measured by running
it: committed tokens over engine time, each row charged its share of the step
in proportion to its true cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from specctl.arms import OFF, Arm
from specctl.decisionlog import batch_to_table
from specctl.policy.base import Policy
from specctl.steps import StepBatch

CLASSES = ("chat", "code")
ARMS = (OFF, Arm("ngram", 1), Arm("ngram", 2), Arm("ngram", 3), Arm("ngram", 4))
NUM_BUCKETS = 2
BUCKET_BOUND = 10  # bucket 0: up to 10 rows
# The logging policy: every arm has support in every context.
LOGGING = np.array([0.15, 0.15, 0.3, 0.1, 0.3])

Dist = np.ndarray  # (classes, buckets, arms)


@dataclass(frozen=True)
class Environment:
    match_rate: tuple[float, float] = (0.6, 0.9)
    accept_rate: tuple[float, float] = (0.45, 0.8)
    class_mix: float = 0.6  # P(chat)
    intercept_s: float = 0.004
    per_row_s: float = 0.0015
    per_draft_s: float = 0.0006
    noise: float = 0.05


def logging_dist() -> Dist:
    return np.broadcast_to(LOGGING, (len(CLASSES), NUM_BUCKETS, len(ARMS))).copy()


def static_dist(arm: Arm) -> Dist:
    d = np.zeros((len(CLASSES), NUM_BUCKETS, len(ARMS)))
    d[:, :, ARMS.index(arm)] = 1.0
    return d


@dataclass
class Rounds:
    """One simulated stretch: as a StepBatch, plus the true per-row cost."""

    batch: StepBatch
    true_cost_s: np.ndarray


def run(
    env: Environment,
    dist: Dist,
    num_steps: int,
    rng: np.random.Generator,
    *,
    first_step: int = 0,
    engine_id: str = "engine-0",
) -> Rounds:
    rows_per_step = rng.integers(4, 17, num_steps)
    request_step = np.repeat(np.arange(num_steps), rows_per_step)
    cls = (rng.random(request_step.size) >= env.class_mix).astype(np.int64)
    order = np.lexsort((cls, request_step))
    cls = cls[order]
    bucket = (rows_per_step > BUCKET_BOUND).astype(np.int64)
    # one draw per (step, class)
    unit_start = np.flatnonzero(
        np.r_[True, (request_step[1:] != request_step[:-1]) | (cls[1:] != cls[:-1])]
    )
    unit_cls = cls[unit_start]
    unit_bucket = bucket[request_step[unit_start]]
    probs = dist[unit_cls, unit_bucket]
    u = rng.random(unit_start.size)
    unit_arm = np.minimum((probs.cumsum(axis=1) < u[:, None]).sum(axis=1), len(ARMS) - 1)
    unit_p = probs[np.arange(unit_start.size), unit_arm]
    counts = np.diff(np.r_[unit_start, request_step.size])
    arm = np.repeat(unit_arm, counts)
    propensity = np.repeat(unit_p, counts)
    k = np.array([a.k for a in ARMS])[arm]
    match = rng.random(arm.size) < np.asarray(env.match_rate)[cls]
    drafted = np.where(match, k, 0)
    run_length = rng.geometric(1.0 - np.asarray(env.accept_rate)[cls]) - 1
    accepted = np.minimum(run_length, drafted)
    cost = env.intercept_s / rows_per_step[request_step] + env.per_row_s + env.per_draft_s * drafted
    noise = np.exp(rng.normal(-(env.noise**2) / 2, env.noise, num_steps))
    step_time = np.bincount(request_step, weights=cost, minlength=num_steps) * noise
    start = 1_790_000_000.0 + first_step * 0.05
    batch = StepBatch(
        engine_id=engine_id,
        sequence=first_step,
        step_index=np.arange(first_step, first_step + num_steps),
        step_time_s=step_time,
        batch_size=rows_per_step.astype(np.int64),
        num_scheduled_tokens=np.bincount(
            request_step, weights=1 + drafted, minlength=num_steps
        ).astype(np.int64),
        policy_version=np.ones(num_steps, dtype=np.int64),
        load_bucket=bucket,
        num_requests=rows_per_step.astype(np.int64),
        step_end_unix_s=start + 0.05 * np.arange(1, num_steps + 1),
        classes=CLASSES,
        arms=ARMS,
        request_step=request_step,
        class_index=cls,
        arm_index=arm,
        propensity=propensity,
        drafted=drafted.astype(np.int64),
        accepted=accepted.astype(np.int64),
        arm_k=k,
    )
    return Rounds(batch, cost * noise[request_step])


def log_table(env: Environment, dist: Dist, num_steps: int, seed: int) -> pa.Table:
    return batch_to_table(run(env, dist, num_steps, np.random.default_rng(seed)).batch)


@dataclass(frozen=True)
class TrueValue:
    tokens_per_round: dict[str, float]
    goodput: dict[str, float]


def _value(rounds: list[Rounds]) -> TrueValue:
    tok = np.concatenate([r.batch.accepted + 1 for r in rounds]).astype(np.float64)
    sec = np.concatenate([r.true_cost_s for r in rounds])
    cls = np.concatenate([r.batch.class_index for r in rounds])
    tokens = {"all": float(tok.mean())}
    goodput = {"all": float(tok.sum() / sec.sum())}
    for c, name in enumerate(CLASSES):
        m = cls == c
        tokens[name] = float(tok[m].mean())
        goodput[name] = float(tok[m].sum() / sec[m].sum())
    return TrueValue(tokens, goodput)


def true_value(
    env: Environment, dist: Dist, num_steps: int = 200_000, seed: int = 12345
) -> TrueValue:
    """A stationary policy's value, by running it for a long time."""
    return _value([run(env, dist, num_steps, np.random.default_rng(seed))])


def true_value_online(
    env: Environment,
    make_policy: Callable[[], Policy],
    num_steps: int,
    *,
    update_every_steps: int = 64,
    seed: int = 12345,
) -> TrueValue:
    """An adaptive policy's value: run it in the loop, learning from what it ran."""
    policy = make_policy()
    policy.set_arms(ARMS)
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, num_steps, update_every_steps):
        d = np.zeros((len(CLASSES), NUM_BUCKETS, len(ARMS)))
        for c, name in enumerate(CLASSES):
            for b in range(NUM_BUCKETS):
                decision = policy.select_action(name, b)
                for arm, p in zip(decision.arms, decision.probabilities, strict=True):
                    d[c, b, ARMS.index(arm)] += p
        rounds = run(env, d, update_every_steps, rng, first_step=start)
        policy.update_params(rounds.batch)
        out.append(rounds)
    return _value(out)
