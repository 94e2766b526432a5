"""The sidecar's gRPC server: engines connect, stream reports, and receive policies.

One :class:`Session` per Connect stream. Reports are validated and fed to the
:class:`~specctl.sidecar.book.PolicyBook` on the event loop; policy pushes
run in their own task and reach each engine through a bounded outbox, so a
slow engine gets the latest policy rather than a backlog, and never holds up
report processing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import os
import signal
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from specctl.api import ADMIN_SERVICE_NAME, SERVICE_NAME, pb, pb_grpc
from specctl.arms import Arm, ArmError, parse_arm
from specctl.logs import get_logger
from specctl.policy.base import Policy
from specctl.policy.registry import make_policy
from specctl.protocol.hello import MAX_TEXT_FIELD_LEN, HelloError, validate_hello
from specctl.protocol.policy_messages import evidence_message, policy_message
from specctl.protocol.reports import ReportError, decode_step_report
from specctl.sidecar.book import PolicyBook, UnknownClassError
from specctl.sidecar.config import (
    SOCKET_MODES,
    ConfigError,
    SidecarConfig,
    is_unix_address,
    load_config,
    unix_socket_path,
)
from specctl.sidecar.metrics import SidecarMetrics
from specctl.sidecar.published import EnginePolicy
from specctl.sidecar.state import StateKeeper
from specctl.sidecar.tls import CertificateFiles, parse_names, peer_common_names
from specctl.steps import StepBatch, validate_class_name

log = get_logger("specctl.sidecar")

# ReportRejected messages kept for a slow engine; older ones are dropped first.
MAX_PENDING_REJECTIONS = 64
CONFIG_POLL_S = 1.0
# Engines whose drop count is remembered across reconnects (the oldest are forgotten first).
MAX_REMEMBERED_ENGINES = 4096
# A misbehaving engine could send a bad report every step: log one per interval.
REJECTION_LOG_INTERVAL_S = 5.0
ADMIN_DISABLED = "admin calls are disabled; set admin.enabled"
GARBAGE = "a message on the stream is not a valid specctl.v1.EngineMessage"
# Validated reports waiting to be learned; beyond this, reports are refused as overloaded.
TRANSPORT_LIMIT_FACTOR = 4
MAX_PENDING_REPORTS = 1024


class PolicyMessages:
    """The ``Policy`` message of each engine view of the current version, built once.

    Engines that offer the same drafters share a view (the book keeps them per
    version and offer), and building a message for every push would cost a
    millisecond per engine.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._version = -1
        self._built: dict[int, tuple[EnginePolicy, pb.Policy]] = {}

    def policy(self, view: EnginePolicy) -> pb.Policy:
        if view.version != self._version:
            self._built.clear()
            self._version = view.version
        found = self._built.get(id(view))
        if found is None or found[0] is not view:
            found = (view, policy_message(view, self.clock()))
            self._built[id(view)] = found
        return found[1]


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


@dataclass(eq=False)
class Session:
    """One engine's Connect stream."""

    engine_id: str
    offered: dict[str, int]
    fallback: Arm
    hello: pb.Hello
    peer: str
    outbox: Outbox = field(default_factory=Outbox)
    last_sequence: int | None = None
    status: pb.EngineStatus | None = None
    dropped_reported: int = 0
    pushed_version: int = 0
    rejection_logged_at: float = -1e9
    rejections_unlogged: int = 0
    # token bucket for server.max_reports_per_s (reports the engine may still send now)
    report_tokens: float = 0.0
    tokens_at: float = 0.0
    # (status code, message) that ends the stream, set by the reader
    error: tuple[grpc.StatusCode, str] | None = None


class SpecControllerService(pb_grpc.SpecControllerServicer):
    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    async def Connect(
        self, request_iterator: AsyncIterator[pb.EngineMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ControllerMessage]:
        sc = self.sidecar
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        except DecodeError:
            sc.metrics.reports_rejected.labels("garbage").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, GARBAGE)
        kind = first.WhichOneof("kind")
        if kind != "hello":
            sc.metrics.reports_rejected.labels("no_hello").inc()
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"first message must be a hello, got {kind or 'an empty message'}",
            )
        try:
            offered, fallback = validate_hello(first.hello)
        except HelloError as exc:
            sc.metrics.reports_rejected.labels("hello").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if len(sc.sessions) >= sc.config.server.max_engines:
            sc.metrics.reports_rejected.labels("max_engines").inc()
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"server.max_engines={sc.config.server.max_engines} engines are connected",
            )
        if sc.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down")

        session = Session(
            engine_id=first.hello.engine_id,
            offered=offered,
            fallback=fallback,
            hello=first.hello,
            peer=context.peer(),
        )
        sc.add_session(session)
        reader = asyncio.create_task(self._read(session, request_iterator))
        try:
            while True:
                messages = await session.outbox.get()
                if messages is None:
                    break
                for message in messages:
                    yield message
                    if message.WhichOneof("kind") == "policy":
                        sc.metrics.policy_pushes.inc()
            if session.error is not None:
                await context.abort(*session.error)
        finally:
            reader.cancel()
            sc.remove_session(session)

    async def _read(
        self, session: Session, request_iterator: AsyncIterator[pb.EngineMessage]
    ) -> None:
        sc = self.sidecar
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("kind")
                if kind == "report":
                    sc.handle_report(session, message.report, time.perf_counter())
                elif kind == "status":
                    sc.handle_status(session, message.status)
                else:
                    sc.metrics.reports_rejected.labels("protocol").inc()
                    session.error = (
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"{kind or 'an empty message'} after the hello: only reports and status",
                    )
                    break
        except asyncio.CancelledError:
            raise
        except DecodeError:
            sc.metrics.reports_rejected.labels("garbage").inc()
            session.error = (grpc.StatusCode.INVALID_ARGUMENT, GARBAGE)
        except grpc.aio.AbortError:
            pass  # the stream was ended from this side
        except grpc.aio.AioRpcError as exc:
            log.info("stream_read_failed", engine_id=session.engine_id, code=exc.code().name)
        except Exception:
            log.exception("stream_read_failed", engine_id=session.engine_id)
        finally:
            session.outbox.close()

    async def GetPolicy(
        self, request: pb.GetPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.Policy:
        return self.sidecar.messages.policy(self.sidecar.book.full_policy())

    async def GetEvidence(
        self, request: pb.GetEvidenceRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetEvidenceResponse:
        try:
            return evidence_message(self.sidecar.book.evidence(request.workload_class or None))
        except UnknownClassError:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"workload_class={request.workload_class!r} is not known to the policy",
            )
            raise  # abort() raised already; this tells type checkers so


class SpecControllerAdminService(pb_grpc.SpecControllerAdminServicer):
    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        sc = self.sidecar
        if not sc.config.admin.enabled:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, ADMIN_DISABLED)
        allowed_cns = parse_names(sc.config.admin.client_cns)
        if allowed_cns and any(cn in allowed_cns for cn in peer_common_names(context)):
            return
        if sc.admin_token:
            metadata = dict(context.invocation_metadata() or ())
            given = str(metadata.get("authorization", ""))
            expected = f"Bearer {sc.admin_token}"
            if hmac.compare_digest(given.encode(), expected.encode()):
                return
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "admin calls need metadata 'authorization: Bearer <token>' with the token in "
            "admin.token_file, or a client certificate whose CN is in admin.client_cns",
        )

    async def _class(self, name: str, context: grpc.aio.ServicerContext) -> str:
        problem = validate_class_name(name)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"workload_class: {problem}")
        return name

    async def SetOverride(
        self, request: pb.SetOverrideRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetOverrideResponse:
        await self._authorize(context)
        cls = await self._class(request.workload_class, context)
        arm: Arm | None = None
        if request.arm:
            try:
                arm = parse_arm(request.arm)
            except ArmError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"arm: {exc}")
        try:
            version = self.sidecar.set_override(cls, arm)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.SetOverrideResponse(policy_version=version)

    async def ResetClass(
        self, request: pb.ResetClassRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResetClassResponse:
        await self._authorize(context)
        cls = await self._class(request.workload_class, context)
        try:
            version = self.sidecar.book.reset_class(cls)
        except UnknownClassError:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"workload_class={cls!r} is not known to the policy"
            )
        log.info("class_reset", workload_class=cls, policy_version=version)
        self.sidecar.notify_policy_changed()
        return pb.ResetClassResponse(policy_version=version)


def build_book(config: SidecarConfig, policy: Policy | None = None) -> PolicyBook:
    """A PolicyBook as the configuration describes it (``policy`` replaces the configured one)."""
    pc = config.policy
    book = PolicyBook(
        policy
        if policy is not None
        else make_policy(pc.name, pc.params, load_bucket_bounds=pc.load_bucket_bounds),
        policy_name=None if policy is not None else pc.name,
        default_class=pc.default_class,
        max_classes=pc.max_classes,
        load_bucket_bounds=pc.load_bucket_bounds,
        fallback_arm=parse_arm(pc.fallback_arm) if pc.fallback_arm else None,
        push_threshold=pc.push_threshold,
    )
    for cls, arm in pc.overrides.items():
        book.set_override(cls, parse_arm(arm))
    return book


class Sidecar:
    """The sidecar server: gRPC services, health, reflection, /metrics, config reload.

    ``flag_overrides`` ("section.key" -> value) are re-applied on every reload,
    so command-line flags keep winning over the file.
    """

    def __init__(
        self,
        config: SidecarConfig,
        *,
        flag_overrides: Mapping[str, Any] | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.config = config
        self.flag_overrides = dict(flag_overrides or {})
        self.metrics = SidecarMetrics()
        self.book = build_book(config, policy)
        self.metrics.watch(self.book)
        self.messages = PolicyMessages(self.book.clock)
        self.state: StateKeeper | None = None
        if config.state.dir:
            pc = config.policy
            self.state = StateKeeper(
                config.state,
                self.book,
                self.metrics.registry,
                lambda: (
                    policy
                    if policy is not None
                    else make_policy(pc.name, pc.params, load_bucket_bounds=pc.load_bucket_bounds)
                ),
            )
        self.admin_token = config.admin.read_token()
        self.sessions: set[Session] = set()
        # engine id -> reports_dropped_total last reported, across reconnects
        self._dropped_by_engine: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.stopping = False
        self.address = ""
        self.metrics_url = ""
        self._server: grpc.aio.Server | None = None
        self.tls: CertificateFiles | None = None
        self._health = health.aio.HealthServicer()
        self._metrics_httpd: Any = None
        self._policy_changed: asyncio.Event | None = None
        # validated reports waiting for the next learning round (bounded)
        self._pending: list[tuple[StepBatch, float]] = []
        self._ingest_ready: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._config_mtime = self._mtime()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        sc = self.config.server
        self._policy_changed = asyncio.Event()
        self._ingest_ready = asyncio.Event()
        if self.state is not None:
            self.state.open()
            # what restoring published reached no engine: stability starts from here
            self.book.restart_stability()
        options = [
            ("grpc.max_send_message_length", sc.max_message_bytes),
            # gRPC itself refuses only what is far beyond the limit (ending the stream with
            # RESOURCE_EXHAUSTED before specctl sees it); a report over the limit but under
            # this cap is rejected by handle_report with a message and counted.
            ("grpc.max_receive_message_length", TRANSPORT_LIMIT_FACTOR * sc.max_message_bytes),
            # Engines hold one stream for days, mostly idle between bursts: let them
            # ping, and ping them to notice dead peers, without ever cutting the stream.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.so_reuseport", 0),
            # Keep each stream's receive window at its default (64 KiB) instead of growing it
            # with bandwidth probes: an engine faster than the sidecar is held back by flow
            # control, and what waits for the sidecar stays bounded in memory.
            ("grpc.http2.bdp_probe", 0),
        ]
        server = grpc.aio.server(options=options)
        pb_grpc.add_SpecControllerServicer_to_server(SpecControllerService(self), server)
        pb_grpc.add_SpecControllerAdminServicer_to_server(SpecControllerAdminService(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, ADMIN_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME),
            server,
        )
        if is_unix_address(sc.listen):
            path = unix_socket_path(sc.listen)
            _remove_stale_socket(path)
            os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
            server.add_insecure_port(sc.listen)
            self.address = f"unix://{path}"
        elif sc.tls_cert_file:
            self.tls = CertificateFiles(sc.tls_cert_file, sc.tls_key_file, sc.tls_client_ca_file)
            port = server.add_secure_port(sc.listen, self.tls.server_credentials())
            host = sc.listen.rsplit(":", 1)[0]
            self.address = f"{host}:{port}"
        else:
            port = server.add_insecure_port(sc.listen)
            host = sc.listen.rsplit(":", 1)[0]
            self.address = f"{host}:{port}"
        mode = SOCKET_MODES[sc.socket_mode]
        old_umask = os.umask(0o777 & ~mode) if is_unix_address(sc.listen) else None
        try:
            await server.start()
        finally:
            if old_umask is not None:
                os.umask(old_umask)
        if is_unix_address(sc.listen):
            os.chmod(unix_socket_path(sc.listen), mode)
        self._server = server

        host, _, port_text = sc.metrics_listen.rpartition(":")
        httpd, _thread = start_http_server(
            int(port_text), addr=host.strip("[]"), registry=self.metrics.exposition()
        )
        self._metrics_httpd = httpd
        bound = httpd.server_address
        self.metrics_url = f"http://{sc.metrics_listen.rsplit(':', 1)[0]}:{bound[1]}/metrics"

        await self._health.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        self._tasks = [
            asyncio.create_task(self._push_loop(), name="specctl-push"),
            asyncio.create_task(self._ingest_loop(), name="specctl-ingest"),
            asyncio.create_task(self._watch_config(), name="specctl-config-watch"),
        ]
        if self.state is not None:
            self._tasks.append(asyncio.create_task(self.state.run(), name="specctl-snapshots"))
        if self.config.admin.enabled and not (self.admin_token or self.config.admin.client_cns):
            log.warning(
                "admin_without_credentials",
                hint="admin calls are refused until admin.token_file or admin.client_cns is set",
            )
        log.info(
            "sidecar_started",
            address=self.address,
            metrics_url=self.metrics_url,
            policy=self.book.policy_name,
            policy_version=self.book.version,
            admin_enabled=self.config.admin.enabled,
            tls=bool(sc.tls_cert_file),
            mtls=bool(sc.tls_client_ca_file),
            state_dir=self.config.state.dir or None,
        )

    async def stop(self, grace: float | None = None) -> None:
        """Health NOT_SERVING, end every stream, drain calls for ``grace`` seconds, close."""
        if self._server is None or self.stopping:
            return
        self.stopping = True
        grace = self.config.server.grace_period_s if grace is None else grace
        log.info("sidecar_stopping", engines=len(self.sessions), grace_period_s=grace)
        await self._health.enter_graceful_shutdown()
        for session in list(self.sessions):
            session.error = (grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down")
            session.outbox.close()
        await self._server.stop(grace)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.ingest_pending()
        if self.state is not None:
            await asyncio.to_thread(self.state.close)
        if self._metrics_httpd is not None:
            self._metrics_httpd.shutdown()
            self._metrics_httpd.server_close()
        if is_unix_address(self.config.server.listen):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(unix_socket_path(self.config.server.listen))
        log.info("sidecar_stopped")

    async def wait_for_termination(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()

    # ------------------------------------------------------------------ sessions

    def add_session(self, session: Session) -> None:
        session.dropped_reported = self._dropped_by_engine.get(session.engine_id, 0)
        self.sessions.add(session)
        self.metrics.engines_connected.set(len(self.sessions))
        if self.book.offer(session.offered):
            self.notify_policy_changed()
        policy = self.messages.policy(self.book.policy_for(session.offered, session.fallback))
        session.pushed_version = policy.version
        session.outbox.put_policy(policy)
        log.info(
            "engine_connected",
            engine_id=session.engine_id,
            peer=session.peer,
            model=session.hello.model,
            vllm_version=session.hello.vllm_version,
            specctl_version=session.hello.specctl_version,
            drafters=session.offered,
            fallback_arm=session.fallback.name,
            engines=len(self.sessions),
        )

    def remove_session(self, session: Session) -> None:
        if session not in self.sessions:
            return
        self.sessions.discard(session)
        self.metrics.engines_connected.set(len(self.sessions))
        self._update_status_gauges()
        log.info("engine_disconnected", engine_id=session.engine_id, engines=len(self.sessions))

    def handle_report(self, session: Session, report: pb.StepReport, received_at: float) -> None:
        m = self.metrics
        m.reports_received.inc()
        if not self._take_report_token(session, received_at):
            m.reports_rejected.labels("rate_limited").inc()
            session.outbox.put_rejection(
                pb.ReportRejected(
                    sequence=report.sequence,
                    code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                    message=f"more than server.max_reports_per_s="
                    f"{self.config.server.max_reports_per_s:g} reports per second from this engine",
                )
            )
            return
        if len(self._pending) >= MAX_PENDING_REPORTS:
            m.reports_rejected.labels("overloaded").inc()
            session.outbox.put_rejection(
                pb.ReportRejected(
                    sequence=report.sequence,
                    code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                    message=f"the sidecar is overloaded: {len(self._pending)} reports wait "
                    "to be learned",
                )
            )
            return
        try:
            size = report.ByteSize()
            if size > self.config.server.max_message_bytes:
                raise ReportError(
                    "oversized",
                    f"report sequence={report.sequence} is {size} bytes, over "
                    f"server.max_message_bytes={self.config.server.max_message_bytes}: "
                    "send fewer steps per report",
                )
            if session.last_sequence is not None and report.sequence <= session.last_sequence:
                raise ReportError(
                    "sequence",
                    f"sequence={report.sequence} does not follow the previous report's "
                    f"sequence={session.last_sequence}",
                )
            batch = decode_step_report(
                report,
                engine_id=session.engine_id,
                offered=session.offered,
                num_load_buckets=self.book.num_load_buckets,
            )
        except ReportError as exc:
            m.reports_rejected.labels(exc.reason).inc()
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
            return
        if session.last_sequence is not None and batch.sequence > session.last_sequence + 1:
            m.reports_dropped.inc(batch.sequence - session.last_sequence - 1)
        session.last_sequence = batch.sequence
        if self._ingest_ready is None:  # not serving (in-process use): learn right away
            self._learn([(batch, received_at)])
            return
        self._pending.append((batch, received_at))
        self._ingest_ready.set()

    async def _ingest_loop(self) -> None:
        """Learn from every report that arrived since the last round, in one round."""
        assert self._ingest_ready is not None
        while True:
            await self._ingest_ready.wait()
            self._ingest_ready.clear()
            self.ingest_pending()
            await asyncio.sleep(0)  # let the stream readers queue what has arrived meanwhile

    def ingest_pending(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            self._learn(pending)

    def _learn(self, pending: list[tuple[StepBatch, float]]) -> None:
        changed = self.book.ingest_many([batch for batch, _ in pending])
        learned_at = time.perf_counter()
        for _, received_at in pending:
            self.metrics.policy_update_latency.observe(learned_at - received_at)
        self.book.refresh_estimates()
        if changed:
            self.notify_policy_changed()

    def _take_report_token(self, session: Session, now: float) -> bool:
        """Token bucket per engine: max_reports_per_s, with one second of burst."""
        rate = self.config.server.max_reports_per_s
        if session.tokens_at == 0.0:
            session.report_tokens, session.tokens_at = rate, now
        session.report_tokens = min(rate, session.report_tokens + (now - session.tokens_at) * rate)
        session.tokens_at = now
        if session.report_tokens < 1.0:
            return False
        session.report_tokens -= 1.0
        return True

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
        statuses = [s.status for s in self.sessions if s.status is not None]
        self.metrics.engines_in_fallback.set(sum(1 for st in statuses if st.in_fallback))
        ages = [st.policy_age_s for st in statuses if st.policy_age_s == st.policy_age_s]
        self.metrics.decision_age.set(max(ages, default=0.0))

    # ------------------------------------------------------------------ policy pushes

    def notify_policy_changed(self) -> None:
        if self._policy_changed is not None:
            self._policy_changed.set()

    def set_override(self, workload_class: str, arm: Arm | None) -> int:
        version = self.book.set_override(workload_class, arm)
        log.info("override_set", workload_class=workload_class, arm=arm.name if arm else None)
        self.notify_policy_changed()
        return version

    async def _push_loop(self) -> None:
        assert self._policy_changed is not None
        republish = self.config.policy.republish_interval_s or None
        while True:
            try:
                await asyncio.wait_for(self._policy_changed.wait(), timeout=republish)
            except TimeoutError:
                self.push_policy(republish=True)
                continue
            self._policy_changed.clear()
            self.push_policy()
            await asyncio.sleep(self.config.policy.min_push_interval_s)

    def push_policy(self, republish: bool = False) -> None:
        """Queue the current version for every engine that has not seen it yet.

        With ``republish`` every engine gets it again: the heartbeat that keeps
        a settled policy from ageing into the engines' fallback.
        """
        for session in list(self.sessions):
            if republish or session.pushed_version < self.book.version:
                policy = self.messages.policy(
                    self.book.policy_for(session.offered, session.fallback)
                )
                session.pushed_version = policy.version
                session.outbox.put_policy(policy)

    # ------------------------------------------------------------------ configuration

    def _mtime(self) -> float | None:
        if not self.config.path:
            return None
        try:
            return os.stat(self.config.path).st_mtime_ns / 1e9
        except OSError:
            return None

    async def _watch_config(self) -> None:
        while True:
            await asyncio.sleep(CONFIG_POLL_S)
            mtime = self._mtime()
            if mtime is not None and mtime != self._config_mtime:
                self._config_mtime = mtime
                self.reload_config()

    def reload_config(self) -> bool:
        """Re-read the configuration file; apply what can change live. True if applied."""
        if not self.config.path:
            return False
        try:
            new = load_config(self.config.path, overrides=self.flag_overrides)
            token = new.admin.read_token()
            policy = None
            if (new.policy.name, dict(new.policy.params)) != (
                self.config.policy.name,
                dict(self.config.policy.params),
            ):
                policy = make_policy(
                    new.policy.name,
                    new.policy.params,
                    load_bucket_bounds=new.policy.load_bucket_bounds,
                )
        except (ConfigError, ValueError, OSError) as exc:
            log.error("config_reload_failed", path=self.config.path, error=str(exc))
            return False
        old = self.config
        for name in ("server", "log"):
            if getattr(old, name) != getattr(new, name):
                log.warning("config_needs_restart", section=name)
        if (
            new.policy.load_bucket_bounds != old.policy.load_bucket_bounds
            or new.policy.default_class != old.policy.default_class
            or new.policy.max_classes != old.policy.max_classes
        ):
            log.warning(
                "config_needs_restart",
                keys="policy.load_bucket_bounds, policy.default_class, policy.max_classes",
            )
        book = self.book
        version = book.version
        book.push_threshold = new.policy.push_threshold
        if new.policy.fallback_arm != old.policy.fallback_arm:
            # the fallback is part of every engine's policy: a new version
            book.set_fallback_arm(
                parse_arm(new.policy.fallback_arm) if new.policy.fallback_arm else None
            )
        if policy is not None:
            book.replace_policy(policy, new.policy.name)
        for cls in old.policy.overrides.keys() | new.policy.overrides.keys():
            arm = new.policy.overrides.get(cls)
            if arm != old.policy.overrides.get(cls):
                book.set_override(cls, parse_arm(arm) if arm else None)
        self.admin_token = token
        self.config = SidecarConfig(
            server=old.server,
            policy=new.policy,
            admin=new.admin,
            log=old.log,
            state=old.state,
            path=old.path,
        )
        log.info(
            "config_reloaded", path=new.path, policy=new.policy.name, policy_version=book.version
        )
        if book.version != version:
            self.notify_policy_changed()
        return True


def _remove_stale_socket(path: str) -> None:
    """A socket file left by a crashed sidecar would block the bind; anything else is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"server.listen: {path!r} exists and is not a socket")
    os.unlink(path)


async def serve(config: SidecarConfig, flag_overrides: Mapping[str, Any] | None = None) -> int:
    """Run until SIGTERM or SIGINT (graceful stop); SIGHUP reloads the configuration."""
    sidecar = Sidecar(config, flag_overrides=flag_overrides)
    await sidecar.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, sidecar.reload_config)
    await stop.wait()
    await sidecar.stop()
    return 0


class SidecarThread:
    """A sidecar on its own event loop in a background thread, for synchronous callers.

    Tests, the simulator and the demo use it as a context manager::

        with SidecarThread(config) as sc:
            channel = grpc.insecure_channel(sc.address)
    """

    def __init__(self, config: SidecarConfig, **kwargs: Any) -> None:
        self._config = config
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="specctl-sidecar", daemon=True
        )
        self.sidecar: Sidecar | None = None

    def start(self) -> SidecarThread:
        self._thread.start()

        async def _start() -> Sidecar:
            sidecar = Sidecar(self._config, **self._kwargs)
            await sidecar.start()
            return sidecar

        self.sidecar = self.call(_start())
        return self

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the sidecar's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def run(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the sidecar's loop (the book is not thread-safe)."""

        async def _run() -> Any:
            return fn(*args)

        return self.call(_run())

    @property
    def address(self) -> str:
        assert self.sidecar is not None
        return self.sidecar.address

    @property
    def metrics_url(self) -> str:
        assert self.sidecar is not None
        return self.sidecar.metrics_url

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop the sidecar and its loop; calling it again does nothing."""
        if self._loop.is_closed():
            return
        if self.sidecar is not None:
            self.call(self.sidecar.stop(grace))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> SidecarThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
