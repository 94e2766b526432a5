"""Admission: what an engine's stream and each of its reports must pass before they count.

A stream opens with a valid hello while the sidecar has room
(``server.max_engines``) and is not shutting down. A report is learned from
when the engine is within its rate (``server.max_reports_per_s``), the
sidecar is not overloaded, the report is within ``server.max_message_bytes``,
its sequence moves forward, and it decodes into a valid
:class:`~specctl.steps.StepBatch`. Anything else is counted by reason and
answered with a ``ReportRejected`` that names the problem; the stream goes on.
The server and the simulator's in-process link both admit through this code.
"""

from __future__ import annotations

import grpc

from specctl.api import pb
from specctl.logs import get_logger
from specctl.protocol.hello import HelloError, validate_hello
from specctl.protocol.reports import ReportError, decode_step_report
from specctl.sidecar.config import ServerConfig
from specctl.sidecar.metrics import SidecarMetrics
from specctl.sidecar.sessions import Session, Sessions, TokenBucket
from specctl.steps import StepBatch

log = get_logger(__name__)

# A misbehaving engine could send a bad report every step: log one per interval.
REJECTION_LOG_INTERVAL_S = 5.0
# Validated reports waiting to be learned; beyond this, reports are refused as overloaded.
MAX_PENDING_REPORTS = 1024


class Refused(Exception):
    """A stream the sidecar does not open; ``code`` and ``message`` end it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Admission:
    """Checks hellos and reports against the server's limits; counts what it refuses."""

    def __init__(
        self,
        server: ServerConfig,
        sessions: Sessions,
        metrics: SidecarMetrics,
        *,
        num_load_buckets: int,
    ) -> None:
        self.server = server
        self.sessions = sessions
        self.metrics = metrics
        self.num_load_buckets = num_load_buckets
        self.stopping = False

    def open_session(self, hello: pb.Hello, peer: str) -> Session:
        """A session for a stream that opened with ``hello``; raises :class:`Refused`."""
        try:
            offered, fallback = validate_hello(hello)
        except HelloError as exc:
            self.metrics.reports_rejected.labels("hello").inc()
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if len(self.sessions) >= self.server.max_engines:
            self.metrics.reports_rejected.labels("max_engines").inc()
            raise Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"server.max_engines={self.server.max_engines} engines are connected",
            )
        if self.stopping:
            raise Refused(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down")
        return Session(
            engine_id=hello.engine_id,
            offered=offered,
            fallback=fallback,
            hello=hello,
            peer=peer,
            reports=TokenBucket(self.server.max_reports_per_s),
        )

    def admit_report(
        self, session: Session, report: pb.StepReport, received_at: float, *, backlog: int
    ) -> StepBatch | None:
        """The report as a batch to learn from, or None when it was refused.

        ``received_at`` is the report's arrival (``time.perf_counter()``);
        ``backlog`` is how many admitted reports still wait to be learned.
        """
        self.metrics.reports_received.inc()
        if not session.reports.take(received_at):
            self._refuse(
                session,
                report,
                "rate_limited",
                f"more than server.max_reports_per_s={self.server.max_reports_per_s:g} "
                "reports per second from this engine",
            )
            return None
        if backlog >= MAX_PENDING_REPORTS:
            self._refuse(
                session,
                report,
                "overloaded",
                f"the sidecar is overloaded: {backlog} reports wait to be learned",
            )
            return None
        try:
            batch = self._decode(session, report)
        except ReportError as exc:
            self._reject(session, report, exc, received_at)
            return None
        if session.last_sequence is not None and batch.sequence > session.last_sequence + 1:
            self.metrics.reports_dropped.inc(batch.sequence - session.last_sequence - 1)
        session.last_sequence = batch.sequence
        return batch

    def _decode(self, session: Session, report: pb.StepReport) -> StepBatch:
        size = report.ByteSize()
        if size > self.server.max_message_bytes:
            raise ReportError(
                "oversized",
                f"report sequence={report.sequence} is {size} bytes, over "
                f"server.max_message_bytes={self.server.max_message_bytes}: "
                "send fewer steps per report",
            )
        if session.last_sequence is not None and report.sequence <= session.last_sequence:
            raise ReportError(
                "sequence",
                f"sequence={report.sequence} does not follow the previous report's "
                f"sequence={session.last_sequence}",
            )
        return decode_step_report(
            report,
            engine_id=session.engine_id,
            offered=session.offered,
            num_load_buckets=self.num_load_buckets,
            batch_drafter=session.hello.batch_drafter,
        )

    def _refuse(self, session: Session, report: pb.StepReport, reason: str, why: str) -> None:
        """A report turned away before it is read: the engine should send less."""
        self.metrics.reports_rejected.labels(reason).inc()
        session.outbox.put_rejection(
            pb.ReportRejected(
                sequence=report.sequence,
                code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                message=why,
            )
        )

    def _reject(
        self, session: Session, report: pb.StepReport, exc: ReportError, received_at: float
    ) -> None:
        """A report that breaks the protocol: counted, answered, logged at most once a while."""
        self.metrics.reports_rejected.labels(exc.reason).inc()
        session.rejections_unlogged += 1
        if received_at - session.rejection_logged_at >= REJECTION_LOG_INTERVAL_S:
            # at most one line per engine per interval; the metric counts them all
            log.warning(
                "report_rejected",
                engine_id=session.engine_id,
                sequence=report.sequence,
                reason=exc.reason,
                error=exc.message,
                rejections=session.rejections_unlogged,
            )
            session.rejection_logged_at = received_at
            session.rejections_unlogged = 0
        session.outbox.put_rejection(
            pb.ReportRejected(
                sequence=report.sequence,
                code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                message=exc.message,
            )
        )
