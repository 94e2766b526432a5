"""The truncation model: what each arm yields per round in each logged context.

A round logged at K reveals exactly what any K' <= K of the same drafter would
have accepted, min(accepted, K'), so those arms are modelled from every such
round with no importance weights. Exact when the drafter's shorter proposal is
a prefix of its longer one (n-gram, draft models, MTP) and verification is
greedy. Time per round comes from the linear step cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specctl.replay.bootstrap import Resample
from specctl.replay.data import LoggedRounds

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ArmModel:
    """Per (context, arm): expected tokens and seconds per round, and support in rounds."""

    tokens: FloatArray  # (contexts, arms)
    seconds: FloatArray
    support: FloatArray  # logged rounds the estimate rests on
    context_rounds: FloatArray  # (contexts,)


def fit_arm_model(data: LoggedRounds, resample: Resample | None = None) -> ArmModel:
    """What each arm yields per round in each context, under ``resample`` (default: the log).

    Tokens for ``<drafter>/k=K'`` come from every logged round of that drafter
    at K >= K' in the context, truncated to K' (no importance weights); ``off``
    commits exactly one token. Seconds come from the step cost model.
    """
    resample = resample or Resample.of(data)
    groups = data.truncation_groups
    c_step = resample.step_weights
    c_unit = resample.unit_weights(data)
    cost = resample.cost
    nc, na, nd, k = data.num_contexts, len(data.arms), max(len(data.drafters), 1), groups.num_k
    sums = np.zeros((nc * nd, 3 * k))
    if groups.units.size:
        weighted = groups.matrix * c_unit[groups.units, None]
        sums[groups.keys] = np.add.reduceat(weighted, groups.starts, axis=0)
    sums = sums.reshape(nc, nd, 3, k)
    tok_sum, dr_sum, rows_sum = sums[:, :, 0], sums[:, :, 1], sums[:, :, 2]
    context_rounds = np.bincount(data.unit_context, weights=c_unit * data.unit_rows, minlength=nc)
    inv_rows = data.context_inverse_rows(c_step)
    b = data.context_bucket
    base = cost.intercept[b] * inv_rows + cost.per_row[b]
    tokens = np.full((nc, na), np.nan)
    seconds = np.full((nc, na), np.nan)
    support = np.zeros((nc, na))
    for a, arm in enumerate(data.arms):
        if arm.is_off:
            tokens[:, a] = 1.0
            seconds[:, a] = base
            support[:, a] = context_rounds  # off needs no data: every round speaks for it
            continue
        d = data.drafters.index(arm.drafter)
        n = rows_sum[:, d, arm.k]
        ok = n > 0
        tokens[ok, a] = tok_sum[ok, d, arm.k] / n[ok]
        seconds[ok, a] = (
            base[ok]
            + cost.per_spec_row[b[ok], d]
            + cost.per_draft[b[ok], d] * dr_sum[ok, d, arm.k] / n[ok]
        )
        support[:, a] = n
    return ArmModel(tokens, seconds, support, context_rounds.astype(np.float64))


def model_scope_values(data: LoggedRounds, action_dist: FloatArray, model: ArmModel) -> FloatArray:
    """(scopes, 2) tokens and seconds per round of ``action_dist`` under ``model``; NaN in a
    scope where the candidate needs an arm the model has no data for."""
    played = action_dist > 0
    tok = np.where(played, action_dist * model.tokens, 0.0).sum(axis=1)
    sec = np.where(played, action_dist * model.seconds, 0.0).sum(axis=1)
    blind = (played & ~np.isfinite(model.tokens)).any(axis=1)
    n = model.context_rounds
    masks = [np.ones(data.num_contexts, dtype=bool)]
    masks += [data.context_class == c for c in range(len(data.classes))]
    out = np.full((len(masks), 2), np.nan)
    for j, m in enumerate(masks):
        total = n[m].sum()
        if total > 0 and not (blind & m & (n > 0)).any():
            out[j, 0] = (n[m] * tok[m]).sum() / total
            out[j, 1] = (n[m] * sec[m]).sum() / total
    return out
