"""A trace's requests, ready to replay: their rounds by position, and each class's acceptance.

Trace-driven simulation replays what each request recorded
(:mod:`specctl.sim.trace_world`); a round is found by its request and
position, and where the recording says nothing the class's acceptance per
position, estimated from the whole trace, fills in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from specctl.trace.format import Trace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class TraceReplayError(ValueError):
    """A trace that cannot drive a simulation; the message says why."""


@dataclass(frozen=True, eq=False)
class ReplayRequests:
    """A trace's requests as flat round arrays, sorted by (request, position).

    ``key = request * stride + position`` is increasing, so the round that
    covers a position is one ``searchsorted`` away. ``hazard[c, i]`` is class
    c's probability of accepting draft position i+1 given the first i were.
    """

    classes: tuple[str, ...]
    drafter: str
    max_k: int
    # per request
    req_class: IntArray
    req_start: IntArray  # position of its first recorded round
    req_length: IntArray  # tokens committed at its end (as recorded)
    arrival: IntArray  # request indices in the order the trace first saw them
    # per round
    key: IntArray
    position: IntArray
    drafted: IntArray
    accepted: IntArray
    limited: BoolArray  # the drafter proposed fewer than the round's K
    censored: BoolArray  # accepted everything up to K: what lay beyond is unknown
    stride: int
    hazard: FloatArray  # [class, position]
    expected_drafted: FloatArray  # [class, K] for K = 0..max_k
    row_share: FloatArray  # [class] share of request-rounds
    extrapolated_from: IntArray  # [class] first position with no evidence (max_k+1: none)

    @property
    def num_requests(self) -> int:
        return int(self.req_class.shape[0])

    @property
    def num_rounds(self) -> int:
        return int(self.key.shape[0])


def replay_requests(trace: Trace) -> ReplayRequests:
    """Sort a trace's rounds per request and estimate each class's acceptance per position."""
    if trace.num_rows == 0:
        raise TraceReplayError(f"{trace.name}: no request rounds to replay")
    max_k = trace.max_k
    if max_k < 1 or not trace.drafter:
        raise TraceReplayError(
            f"{trace.name}: recorded without a drafter (max_k={max_k}): nothing to replay"
        )
    order = np.lexsort((trace.position, trace.request))
    req = trace.request[order]
    pos = trace.position[order]
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = (req[1:] != req[:-1]) | (pos[1:] != pos[:-1])
    order = order[keep]
    req, pos = req[keep], pos[keep]
    drafted = trace.drafted[order]
    accepted = trace.accepted[order]
    k = trace.k[order]
    cls = trace.class_index[order]
    first_step = trace.row_step[order]
    _, first, dense = np.unique(req, return_index=True, return_inverse=True)
    dense = dense.astype(np.int64)
    last = np.append(first[1:], len(req)) - 1
    req_class = cls[first]
    req_start = pos[first]
    req_length = pos[last] + accepted[last] + 1
    arrival = np.argsort(first_step[first], kind="stable").astype(np.int64)
    limited = (k >= 0) & (drafted < k)
    censored = (accepted == drafted) & ~limited
    stride = int(req_length.max()) + 1
    key = dense * stride + pos

    n_classes = len(trace.classes)
    hazard = np.zeros((n_classes, max_k))
    extrapolated_from = np.full(n_classes, max_k + 1, dtype=np.int64)
    expected_drafted = np.zeros((n_classes, max_k + 1))
    row_share = np.bincount(cls, minlength=n_classes) / len(cls)
    stopped_at = np.where(censored, -1, accepted + 1)  # first position that failed
    for c in range(n_classes):
        m = cls == c
        a_c, stop_c = accepted[m], stopped_at[m]
        last_known = 0.0
        for i in range(1, max_k + 1):
            successes = int((a_c >= i).sum())
            failures = int((stop_c == i).sum())
            if successes + failures > 0:
                last_known = successes / (successes + failures)
            elif extrapolated_from[c] > max_k:
                extrapolated_from[c] = i
            hazard[c, i - 1] = last_known
        lim_c, d_c = limited[m], drafted[m]
        for kk in range(max_k + 1):
            expected_drafted[c, kk] = float(np.where(lim_c, np.minimum(kk, d_c), kk).mean())
    return ReplayRequests(
        classes=trace.classes,
        drafter=trace.drafter,
        max_k=max_k,
        req_class=req_class.astype(np.int64),
        req_start=req_start.astype(np.int64),
        req_length=req_length.astype(np.int64),
        arrival=arrival,
        key=key.astype(np.int64),
        position=pos.astype(np.int64),
        drafted=drafted.astype(np.int64),
        accepted=accepted.astype(np.int64),
        limited=limited,
        censored=censored,
        stride=stride,
        hazard=hazard,
        expected_drafted=expected_drafted,
        row_share=row_share,
        extrapolated_from=extrapolated_from,
    )
