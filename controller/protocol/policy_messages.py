"""What the sidecar answers with, as messages: an engine's policy and the evidence behind it.

The book answers in plain values (:mod:`specctl.sidecar.published`); these
functions are the only place they become ``specctl.v1`` messages, and
:func:`stability_by_context` reads the stability back out of a
``GetEvidenceResponse`` for gRPC clients.
"""

from __future__ import annotations

from specctl.api import pb
from specctl.arms import parse_arm
from specctl.sidecar.published import BookEvidence, EnginePolicy
from specctl.sidecar.stability import StabilityStats


def policy_message(policy: EnginePolicy, issued_unix_s: float) -> pb.Policy:
    """The ``Policy`` an engine receives, stamped with when it was issued."""
    return pb.Policy(
        version=policy.version,
        policy_name=policy.policy_name,
        fallback_arm=policy.fallback_arm.name,
        load_bucket_bounds=policy.load_bucket_bounds,
        default_class=policy.default_class,
        entries=[
            pb.ClassPolicy(
                workload_class=e.workload_class,
                load_bucket=e.load_bucket,
                arms=[a.name for a in e.arms],
                probabilities=e.probabilities,
                explanation=e.explanation,
            )
            for e in policy.entries
        ],
        issued_unix_s=issued_unix_s,
    )


def evidence_message(evidence: BookEvidence) -> pb.GetEvidenceResponse:
    """The ``GetEvidenceResponse`` for the book's evidence."""
    out = pb.GetEvidenceResponse(
        policy_version=evidence.policy_version, policy_name=evidence.policy_name
    )
    for ctx in evidence.contexts:
        decision, ev = ctx.decision, ctx.evidence
        ce = out.classes.add(
            workload_class=ctx.workload_class,
            load_bucket=ctx.load_bucket,
            explanation=decision.explanation,
            override_arm=ctx.override.name if ctx.override is not None else "",
            rounds=ev.rounds,
        )
        fill_stability(ce.stability, ctx.stability)
        estimates = {e.arm: e for e in ev.arms}
        arms = list(decision.arms) + [a for a in estimates if a not in decision.arms]
        for arm in arms:
            e = estimates.get(arm)
            ae = ce.arms.add(arm=arm.name, probability=decision.probability_of(arm))
            if e is not None:
                ae.expected_tokens = e.expected_tokens
                ae.expected_step_time_s = e.expected_step_time_s
                ae.goodput = e.goodput
                ae.goodput_low = e.goodput_low
                ae.goodput_high = e.goodput_high
                ae.prob_best = e.prob_best
        for drafter, (acceptance, observations) in sorted(ev.acceptance.items()):
            ce.drafters.add(
                drafter=drafter,
                conditional_acceptance=list(acceptance),
                observations=list(observations),
            )
    return out


def fill_stability(message: pb.DecisionStability, stats: StabilityStats) -> None:
    """Fill a ``DecisionStability`` message from a tracker's stats."""
    message.mode_arm = stats.mode.name
    message.mode_since_unix_s = stats.mode_since
    message.mode_dwell_s = stats.mode_dwell_s
    message.mode_flips_total = stats.mode_flips_total
    message.changes_total = stats.changes_total
    message.change_tv_total = stats.change_tv_total
    message.window_s = stats.window_s
    message.mode_flips_recent = stats.mode_flips_recent
    message.changes_recent = stats.changes_recent
    message.change_tv_recent = stats.change_tv_recent
    message.mode_flips_per_minute = stats.mode_flips_per_minute
    message.change_tv_per_second = stats.change_tv_per_second


def stability_stats(message: pb.DecisionStability) -> StabilityStats:
    """The stats a ``DecisionStability`` message carries."""
    return StabilityStats(
        mode=parse_arm(message.mode_arm),
        mode_since=message.mode_since_unix_s,
        mode_dwell_s=message.mode_dwell_s,
        mode_flips_total=int(message.mode_flips_total),
        changes_total=int(message.changes_total),
        change_tv_total=message.change_tv_total,
        window_s=message.window_s,
        mode_flips_recent=int(message.mode_flips_recent),
        changes_recent=int(message.changes_recent),
        change_tv_recent=message.change_tv_recent,
        mode_flips_per_minute=message.mode_flips_per_minute,
        change_tv_per_second=message.change_tv_per_second,
    )


def stability_by_context(
    response: pb.GetEvidenceResponse,
) -> dict[tuple[str, int], StabilityStats]:
    """Per (workload class, load bucket), the stability a ``GetEvidenceResponse`` carries.

    For gRPC clients (the engine benchmark, scripts): contexts without a
    stability message (a sidecar older than this field) are left out.
    """
    out: dict[tuple[str, int], StabilityStats] = {}
    for ce in response.classes:
        if ce.HasField("stability"):
            out[(ce.workload_class, int(ce.load_bucket))] = stability_stats(ce.stability)
    return out
