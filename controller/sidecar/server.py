"""The sidecar: engines connect, stream reports, and receive policies.

:class:`Sidecar` puts the pieces together and runs them: the
:class:`~specctl.sidecar.book.PolicyBook` (the state), the
:class:`~specctl.sidecar.admission.Admission` of streams and reports, the
:class:`~specctl.sidecar.learning.Learner` and
:class:`~specctl.sidecar.publishing.Publisher` tasks, the servicers
(:mod:`specctl.sidecar.services`) behind the admin
:class:`~specctl.sidecar.admin_auth.AdminAuthInterceptor`, health and
reflection, the listener (:mod:`specctl.sidecar.listener`), /metrics, the
configuration reloader, with ``state.dir`` the learned state's keeper and,
with ``fleet.url``, the shared evidence store's task
(:mod:`specctl.sidecar.fleet_store`). Everything runs on one event loop.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specctl.api import ADMIN_SERVICE_NAME, SERVICE_NAME, pb_grpc
from specctl.arms import parse_arm
from specctl.logs import get_logger
from specctl.policy.base import Policy
from specctl.policy.registry import make_policy
from specctl.sidecar import listener
from specctl.sidecar.admin_auth import AdminAuthInterceptor
from specctl.sidecar.admission import Admission
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.config import SidecarConfig
from specctl.sidecar.fleet_store import FleetStore
from specctl.sidecar.learning import Learner
from specctl.sidecar.metrics import SidecarMetrics
from specctl.sidecar.publishing import Publisher
from specctl.sidecar.reload import ConfigReloader
from specctl.sidecar.services import SpecControllerAdminService, SpecControllerService
from specctl.sidecar.sessions import Sessions
from specctl.sidecar.state import StateKeeper
from specctl.sidecar.tls import CertificateFiles

log = get_logger(__name__)

# how long a stop waits for its background tasks to end, and for the fleet store to close
STOP_TASKS_TIMEOUT_S = 5.0


async def _bounded(what: str, tasks: list[asyncio.Task[None]]) -> None:
    """Wait for ``tasks`` for at most ``STOP_TASKS_TIMEOUT_S``, then go on stopping.

    A stop must end: closing a TLS connection to a store that has gone waits for
    its shutdown (up to 30 s in Python 3.11), and a task that is in such a close
    when it is cancelled ends only after it. What is left is logged and abandoned.
    """
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=STOP_TASKS_TIMEOUT_S)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.warning(
                "sidecar_stop_task_failed", task=task.get_name(), error=repr(task.exception())
            )
    if pending:
        log.warning(
            "sidecar_stop_left_tasks",
            what=what,
            tasks=sorted(t.get_name() for t in pending),
            timeout_s=STOP_TASKS_TIMEOUT_S,
        )


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
    so command-line flags keep winning over the file. ``policy`` replaces the
    configured policy (tests, benchmarks).
    """

    def __init__(
        self,
        config: SidecarConfig,
        *,
        flag_overrides: Mapping[str, Any] | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.metrics = SidecarMetrics()
        self.book = build_book(config, policy)
        self.metrics.watch(self.book)
        self.sessions = Sessions(self.metrics)
        self.admission = Admission(
            config.server,
            self.sessions,
            self.metrics,
            num_load_buckets=self.book.num_load_buckets,
        )
        self.publisher = Publisher(self.book, self.sessions, config.policy)
        self.learner = Learner(
            self.book, self.admission, self.metrics, self.publisher.notify, config.policy
        )
        self.admin_auth = AdminAuthInterceptor(config.admin, config.admin.read_token())
        self.reloader = ConfigReloader(
            config, flag_overrides or {}, self.book, self.admin_auth, self.publisher, self.learner
        )
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
        self.fleet: FleetStore | None = None
        if config.fleet.enabled:
            self.fleet = FleetStore(
                config.fleet,
                self.book,
                self.sessions,
                self.metrics.registry,
                self.publisher.notify,
                listen=config.server.listen,
            )
        self.address = ""
        self.metrics_url = ""
        self.tls: CertificateFiles | None = None
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._metrics_httpd: Any = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def config(self) -> SidecarConfig:
        """The running configuration (the last one loaded)."""
        return self.reloader.config

    def reload_config(self) -> bool:
        """Re-read the configuration file; apply what can change live. True if applied."""
        return self.reloader.reload()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        sc = self.config.server
        self.publisher.begin()
        self.learner.begin()
        if self.state is not None:
            self.state.open()
            # what restoring published reached no engine: stability starts from here
            self.book.restart_stability()
        server = listener.new_server(sc, [self.admin_auth])
        pb_grpc.add_SpecControllerServicer_to_server(
            SpecControllerService(
                self.admission,
                self.sessions,
                self.learner,
                self.publisher,
                self.book,
                self.metrics,
            ),
            server,
        )
        pb_grpc.add_SpecControllerAdminServicer_to_server(
            SpecControllerAdminService(self.book, self.publisher), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, ADMIN_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME),
            server,
        )
        bound = listener.bind(server, sc)
        self.address, self.tls = bound.address, bound.tls
        await listener.start(server, sc)
        self._server = server
        self._metrics_httpd, self.metrics_url = listener.serve_metrics(self.metrics, sc)

        await self._health.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        self._tasks = [
            asyncio.create_task(self.publisher.run(), name="specctl-push"),
            asyncio.create_task(self.learner.run(), name="specctl-ingest"),
            asyncio.create_task(self.reloader.watch(), name="specctl-config-watch"),
        ]
        if self.state is not None:
            self._tasks.append(asyncio.create_task(self.state.run(), name="specctl-snapshots"))
        if self.fleet is not None:
            self._tasks.append(asyncio.create_task(self.fleet.run(), name="specctl-fleet"))
        admin = self.config.admin
        if admin.enabled and not (self.admin_auth.token or admin.client_cns):
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
            admin_enabled=admin.enabled,
            tls=bool(sc.tls_cert_file),
            mtls=bool(sc.tls_client_ca_file),
            state_dir=self.config.state.dir or None,
            fleet_sidecar_id=self.fleet.sidecar_id if self.fleet is not None else None,
        )

    async def stop(self, grace: float | None = None) -> None:
        """Health NOT_SERVING, end every stream, drain calls for ``grace`` seconds, close."""
        if self._server is None or self.admission.stopping:
            return
        self.admission.stopping = True
        grace = self.config.server.grace_period_s if grace is None else grace
        log.info("sidecar_stopping", engines=len(self.sessions), grace_period_s=grace)
        await self._health.enter_graceful_shutdown()
        for session in self.sessions:
            session.error = (grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down")
            session.outbox.close()
        await self._server.stop(grace)
        # A stream's handler can still be unwinding when the server has stopped; its
        # session ends here, so the log says every engine left before the sidecar stopped.
        for session in self.sessions:
            self.sessions.remove(session)
        for task in self._tasks:
            task.cancel()
        await _bounded("background tasks", self._tasks)
        if self.fleet is not None:
            await _bounded("closing the fleet store", [asyncio.create_task(self.fleet.close())])
        self.learner.learn_pending()
        if self.state is not None:
            await asyncio.to_thread(self.state.close)
        if self._metrics_httpd is not None:
            self._metrics_httpd.shutdown()
            self._metrics_httpd.server_close()
        listener.remove_socket(self.config.server)
        log.info("sidecar_stopped")

    async def wait_for_termination(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()


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
