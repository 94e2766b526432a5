"""Engine sessions: one per Connect stream, and what the sidecar remembers across reconnects.

A :class:`Session` holds what the hello established (the engine's offered
drafters and fallback) and the stream's state: the outbox the sidecar writes
to, the last report sequence, the engine's last status. :class:`Sessions` is
the set of open streams; it turns the engines' statuses into the fallback and
policy-age gauges, and counts the reports engines say they dropped once, even
when an engine reconnects and reports the same total again.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc

from specctl.api import pb
from specctl.arms import Arm
from specctl.logs import get_logger
from specctl.protocol.hello import MAX_TEXT_FIELD_LEN
from specctl.sidecar.metrics import SidecarMetrics

log = get_logger(__name__)

# ReportRejected messages kept for a slow engine; older ones are dropped first.
MAX_PENDING_REJECTIONS = 64
# Engines whose drop count is remembered across reconnects (the oldest are forgotten first).
MAX_REMEMBERED_ENGINES = 4096


class Outbox:
    """What the sidecar still has to send on one stream: the latest policy, and rejections."""

    def __init__(self) -> None:
        self.policy: pb.Policy | None = None
        self.rejections: collections.deque[pb.ReportRejected] = collections.deque(
            maxlen=MAX_PENDING_REJECTIONS
        )
        self.closed = False
        self._ready = asyncio.Event()

    def put_policy(self, policy: pb.Policy) -> None:
        self.policy = policy  # replaces any policy not yet sent
        self._ready.set()

    def put_rejection(self, rejected: pb.ReportRejected) -> None:
        self.rejections.append(rejected)
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    async def get(self) -> list[pb.ControllerMessage] | None:
        """The next messages to send; None once closed and drained."""
        while True:
            out = [pb.ControllerMessage(rejected=r) for r in self.rejections]
            self.rejections.clear()
            if self.policy is not None:
                out.append(pb.ControllerMessage(policy=self.policy))
                self.policy = None
            if out:
                return out
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()


class TokenBucket:
    """``rate`` tokens a second, at most ``rate`` held (one second of burst); starts full."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = 0.0
        self.at = 0.0

    def take(self, now: float) -> bool:
        """Take a token at ``now`` (seconds, any monotonic clock); False if none is left."""
        if self.at == 0.0:
            self.tokens, self.at = self.rate, now
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass(eq=False)
class Session:
    """One engine's Connect stream."""

    engine_id: str
    offered: dict[str, int]
    fallback: Arm
    hello: pb.Hello
    peer: str
    # reports the engine may send (server.max_reports_per_s)
    reports: TokenBucket
    outbox: Outbox = field(default_factory=Outbox)
    last_sequence: int | None = None
    status: pb.EngineStatus | None = None
    dropped_reported: int = 0
    pushed_version: int = 0
    rejection_logged_at: float = -1e9
    rejections_unlogged: int = 0
    # (status code, message) that ends the stream, set by the reader
    error: tuple[grpc.StatusCode, str] | None = None


class Sessions:
    """The open streams, with the gauges their engines' statuses make."""

    def __init__(self, metrics: SidecarMetrics) -> None:
        self.metrics = metrics
        self._open: set[Session] = set()
        # engine id -> reports_dropped_total last reported, across reconnects
        self._dropped_by_engine: collections.OrderedDict[str, int] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._open))

    def add(self, session: Session) -> None:
        session.dropped_reported = self._dropped_by_engine.get(session.engine_id, 0)
        self._open.add(session)
        self.metrics.engines_connected.set(len(self._open))
        log.info(
            "engine_connected",
            engine_id=session.engine_id,
            peer=session.peer,
            model=session.hello.model,
            vllm_version=session.hello.vllm_version,
            specctl_version=session.hello.specctl_version,
            drafters=session.offered,
            fallback_arm=session.fallback.name,
            engines=len(self._open),
        )

    def remove(self, session: Session) -> None:
        if session not in self._open:
            return
        self._open.discard(session)
        self.metrics.engines_connected.set(len(self._open))
        self._update_status_gauges()
        log.info("engine_disconnected", engine_id=session.engine_id, engines=len(self._open))

    def handle_status(self, session: Session, status: pb.EngineStatus) -> None:
        total = status.reports_dropped_total
        if total < session.dropped_reported:
            session.dropped_reported = 0  # the engine restarted: its count starts again
        if total > session.dropped_reported:
            self.metrics.reports_dropped.inc(total - session.dropped_reported)
            session.dropped_reported = total
        # An engine that reconnects reports the same total again: remember it by engine id.
        self._dropped_by_engine[session.engine_id] = total
        self._dropped_by_engine.move_to_end(session.engine_id)
        while len(self._dropped_by_engine) > MAX_REMEMBERED_ENGINES:
            self._dropped_by_engine.popitem(last=False)
        was_in_fallback = session.status is not None and session.status.in_fallback
        session.status = status
        if status.in_fallback != was_in_fallback:
            log.info(
                "engine_fallback" if status.in_fallback else "engine_fallback_ended",
                engine_id=session.engine_id,
                reason=status.fallback_reason[:MAX_TEXT_FIELD_LEN],
            )
        self._update_status_gauges()

    def _update_status_gauges(self) -> None:
        statuses = [s.status for s in self._open if s.status is not None]
        self.metrics.engines_in_fallback.set(sum(1 for st in statuses if st.in_fallback))
        ages = [st.policy_age_s for st in statuses if st.policy_age_s == st.policy_age_s]
        self.metrics.decision_age.set(max(ages, default=0.0))
