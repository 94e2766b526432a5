"""The gRPC servicers: thin, each given the few collaborators its calls need.

:class:`SpecControllerService` holds engines' streams (admitted by the
:class:`~specctl.sidecar.admission.Admission`, learned from by the
:class:`~specctl.sidecar.learning.Learner`, pushed to by the
:class:`~specctl.sidecar.publishing.Publisher`) and answers the read calls.
:class:`SpecControllerAdminService` changes the book; who may call it is the
:class:`~specctl.sidecar.admin_auth.AdminAuthInterceptor`'s decision.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from specctl.api import pb, pb_grpc
from specctl.arms import Arm, ArmError, parse_arm
from specctl.logs import get_logger
from specctl.protocol.policy_messages import evidence_message
from specctl.sidecar.admission import Admission, Refused
from specctl.sidecar.book import PolicyBook, UnknownClassError
from specctl.sidecar.learning import Learner
from specctl.sidecar.metrics import SidecarMetrics
from specctl.sidecar.publishing import Publisher
from specctl.sidecar.sessions import Session, Sessions
from specctl.steps import validate_class_name

log = get_logger(__name__)

GARBAGE = "a message on the stream is not a valid specctl.v1.EngineMessage"


class SpecControllerService(pb_grpc.SpecControllerServicer):
    """Engine streams, and the current policy and its evidence for anyone who asks."""

    def __init__(
        self,
        admission: Admission,
        sessions: Sessions,
        learner: Learner,
        publisher: Publisher,
        book: PolicyBook,
        metrics: SidecarMetrics,
    ) -> None:
        self.admission = admission
        self.sessions = sessions
        self.learner = learner
        self.publisher = publisher
        self.book = book
        self.metrics = metrics

    async def Connect(
        self, request_iterator: AsyncIterator[pb.EngineMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ControllerMessage]:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        except DecodeError:
            self.metrics.reports_rejected.labels("garbage").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, GARBAGE)
        kind = first.WhichOneof("kind")
        if kind != "hello":
            self.metrics.reports_rejected.labels("no_hello").inc()
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"first message must be a hello, got {kind or 'an empty message'}",
            )
        try:
            session = self.admission.open_session(first.hello, context.peer())
        except Refused as exc:
            await context.abort(exc.code, exc.message)
        self.sessions.add(session)
        self.publisher.welcome(session)
        reader = asyncio.create_task(self._read(session, request_iterator))
        try:
            while True:
                messages = await session.outbox.get()
                if messages is None:
                    break
                for message in messages:
                    yield message
                    if message.WhichOneof("kind") == "policy":
                        self.metrics.policy_pushes.inc()
            if session.error is not None:
                await context.abort(*session.error)
        finally:
            reader.cancel()
            self.sessions.remove(session)

    async def _read(
        self, session: Session, request_iterator: AsyncIterator[pb.EngineMessage]
    ) -> None:
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("kind")
                if kind == "report":
                    self.learner.submit(session, message.report, time.perf_counter())
                elif kind == "status":
                    self.sessions.handle_status(session, message.status)
                else:
                    self.metrics.reports_rejected.labels("protocol").inc()
                    session.error = (
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"{kind or 'an empty message'} after the hello: only reports and status",
                    )
                    break
        except asyncio.CancelledError:
            raise
        except DecodeError:
            self.metrics.reports_rejected.labels("garbage").inc()
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
        return self.publisher.full_policy()

    async def GetEvidence(
        self, request: pb.GetEvidenceRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetEvidenceResponse:
        try:
            return evidence_message(self.book.evidence(request.workload_class or None))
        except UnknownClassError:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"workload_class={request.workload_class!r} is not known to the policy",
            )
            raise  # abort() raised already; this tells type checkers so


class SpecControllerAdminService(pb_grpc.SpecControllerAdminServicer):
    """Operator overrides and class resets, pushed to engines at once."""

    def __init__(self, book: PolicyBook, publisher: Publisher) -> None:
        self.book = book
        self.publisher = publisher

    async def _class(self, name: str, context: grpc.aio.ServicerContext) -> str:
        problem = validate_class_name(name)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"workload_class: {problem}")
        return name

    async def SetOverride(
        self, request: pb.SetOverrideRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetOverrideResponse:
        cls = await self._class(request.workload_class, context)
        arm: Arm | None = None
        if request.arm:
            try:
                arm = parse_arm(request.arm)
            except ArmError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"arm: {exc}")
        try:
            version = self.book.set_override(cls, arm)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        log.info("override_set", workload_class=cls, arm=arm.name if arm else None)
        self.publisher.notify()
        return pb.SetOverrideResponse(policy_version=version)

    async def ResetClass(
        self, request: pb.ResetClassRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResetClassResponse:
        cls = await self._class(request.workload_class, context)
        try:
            version = self.book.reset_class(cls)
        except UnknownClassError:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"workload_class={cls!r} is not known to the policy"
            )
        log.info("class_reset", workload_class=cls, policy_version=version)
        self.publisher.notify()
        return pb.ResetClassResponse(policy_version=version)
