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


# StabilityStats attribute -> DecisionStability field; the mode, an Arm, goes by its name.
_STABILITY_FIELDS = {
    "mode_since": "mode_since_unix_s",
    "mode_dwell_s": "mode_dwell_s",
    "mode_flips_total": "mode_flips_total",
    "changes_total": "changes_total",
    "change_tv_total": "change_tv_total",
    "window_s": "window_s",
    "mode_flips_recent": "mode_flips_recent",
    "changes_recent": "changes_recent",
    "change_tv_recent": "change_tv_recent",
    "mode_flips_per_minute": "mode_flips_per_minute",
    "change_tv_per_second": "change_tv_per_second",
}


def fill_stability(message: pb.DecisionStability, stats: StabilityStats) -> None:
    """Fill a ``DecisionStability`` message from a tracker's stats."""
    message.mode_arm = stats.mode.name
    for attribute, name in _STABILITY_FIELDS.items():
        setattr(message, name, getattr(stats, attribute))


def stability_stats(message: pb.DecisionStability) -> StabilityStats:
    """The stats a ``DecisionStability`` message carries."""
    values = {attribute: getattr(message, name) for attribute, name in _STABILITY_FIELDS.items()}
    return StabilityStats(mode=parse_arm(message.mode_arm), **values)


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
