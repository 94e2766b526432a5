"""The benchmark's timeline: a learning policy's evidence, sampled while it runs.

Per context, the arm probabilities, how steady the decision is (the mode
arm, how long it has held, its flips) and what the policy believes of each arm
(goodput, tokens per round, P(best)); the live view, the timeline plot and
:mod:`.beliefs` read these rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specctl.bench.workload import Workload

if TYPE_CHECKING:
    from specctl.api import pb


def evidence_rows(
    response: pb.GetEvidenceResponse,
    workload: Workload,
    bounds: tuple[int, ...],
    meta: dict[str, Any],
    t: float,
) -> list[dict[str, Any]]:
    """The timeline's rows of one evidence sample taken at ``t`` (seconds into the run):
    one per context of the workload's classes that has rounds, or is the phase's bucket."""
    from specctl.protocol.policy_messages import stability_by_context
    from specctl.steps import load_bucket_of

    stability = stability_by_context(response)
    classes = {c.name for c in workload.classes}
    current = load_bucket_of(workload.phases[meta["phase_index"]].total_concurrency, bounds)
    rows = []
    for ce in response.classes:
        if ce.workload_class not in classes:
            continue
        bucket = int(ce.load_bucket)
        if ce.rounds <= 0 and bucket != current:
            continue
        probs = {a.arm: round(float(a.probability), 4) for a in ce.arms}
        # what the policy believes of each arm it has an estimate for (:mod:`.beliefs`)
        estimates = {
            a.arm: {
                "goodput": round(float(a.goodput), 3),
                "tokens": round(float(a.expected_tokens), 4),
                "prob_best": round(float(a.prob_best), 4),
            }
            for a in ce.arms
            if a.goodput > 0
        }
        top = max(probs, key=lambda a: probs[a]) if probs else ""
        st = stability.get((ce.workload_class, bucket))
        rows.append(
            {
                "t": t,
                "segment": meta["segment"],
                "policy": meta["policy"],
                "repetition": meta["repetition"],
                "phase": meta["phase"],
                "measured": meta.get("measured", False),
                "class": ce.workload_class,
                "bucket": bucket,
                "current": bucket == current,
                "rounds": round(float(ce.rounds), 1),
                "probabilities": probs,
                "top_arm": top,
                "top_p": probs.get(top, 0.0),
                "mode_arm": st.mode.name if st else top,
                "mode_dwell_s": round(st.mode_dwell_s, 2) if st else None,
                "mode_flips_total": st.mode_flips_total if st else None,
                "changes_total": st.changes_total if st else None,
                "change_tv_total": round(st.change_tv_total, 4) if st else None,
                "explanation": ce.explanation or ce.override_arm,
                "estimates": estimates,
            }
        )
    return rows
