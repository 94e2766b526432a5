"""The engine's link to the sidecar: one background thread, never in the step's way.

The scheduler appends finished steps to a bounded deque and reads
:attr:`SidecarClient.view`; that is all it ever touches. This thread drains
the deque into one :class:`~specctl.api.pb.StepReport` per interval over
the ``Connect`` stream, compiles each pushed policy and swaps it in with one
reference assignment, and reconnects with exponential backoff and jitter
(sending its hello again) when the stream breaks. While there is no sidecar,
or the policy is older than its maximum age, the view is the fallback arm.
Nothing here raises into the engine. With ``trace_dir`` set, :meth:`push`
also hands each step to a trace writer (:mod:`specctl.trace.writer`),
which keeps its own bounded deque and thread.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import grpc

from specctl.api import pb, pb_grpc
from specctl.arms import Arm
from specctl.engine.config import EngineConfig
from specctl.engine.policy_view import PolicyError, PolicyView, compile_policy, fallback_view
from specctl.logs import get_logger
from specctl.protocol.reports import encode_step_report
from specctl.steps import StepRecord

if TYPE_CHECKING:
    from specctl.trace.writer import TraceWriter

log = get_logger(__name__)

# Steps per StepReport at most; a backlog after a reconnect goes out in several reports.
MAX_STEPS_PER_REPORT = 512
# EngineStatus goes out on every change and at least this often, seconds.
STATUS_INTERVAL_S = 5.0
# A stream's first report goes out within this share of report_interval_s of its first
# step; the wait then doubles at each wake-up up to the interval (see _requests).
FIRST_REPORT_SHARE = 0.125
_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


class StepSource(Protocol):
    """A step captured on the step path; turned into report rows on this thread."""

    def record(self) -> StepRecord: ...


@dataclass(frozen=True)
class ClientState:
    """A snapshot for logs, tests and metrics."""

    connected: bool
    in_fallback: bool
    fallback_reason: str
    policy_version: int
    reports_sent_total: int
    steps_dropped_total: int
    reports_rejected_total: int
    policies_rejected_total: int
    connects_total: int


class SidecarClient:
    """Feeds step records to the sidecar and keeps :attr:`view` current."""

    def __init__(
        self,
        config: EngineConfig,
        hello: pb.Hello,
        offered: Mapping[str, int],
        fallback: Arm,
    ) -> None:
        self.config = config
        self.hello = hello
        self.offered = dict(offered)
        self.fallback = fallback
        # Read by the step path with no lock: always a complete, immutable object.
        self.view: PolicyView = fallback_view(fallback, config.load_buckets)
        self.queue: deque[StepSource] = deque(maxlen=config.report_queue_size)
        self.steps_dropped_total = 0  # written by the step path only
        self.fallback_reason = "no policy yet"
        self._fallback_logged = False
        self.connected = False
        self.reports_sent_total = 0
        self.reports_rejected_total = 0
        self.policies_rejected_total = 0
        self.connects_total = 0
        self._stop = threading.Event()
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name="specctl-client", daemon=True)
        self._jitter = random.Random()
        # With trace_dir, every step also goes to the trace writer (its own queue and thread,
        # so it records whether or not a sidecar is connected).
        self.trace: TraceWriter | None = None
        if config.trace_dir:
            from specctl.trace.writer import engine_trace_writer

            self.trace = engine_trace_writer(config, hello)

    # -- step path ---------------------------------------------------------------------------

    def push(self, record: StepSource) -> None:
        """Queue a finished step; the oldest one is dropped (and counted) when full."""
        queue = self.queue
        if len(queue) == queue.maxlen:
            self.steps_dropped_total += 1
        queue.append(record)
        trace = self.trace
        if trace is not None:
            trace.push(record)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        if self.trace is not None:
            self.trace.start()

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued, half-close the stream, and stop; cancel after ``timeout_s``.

        Cancelling at once would lose the reports still in gRPC's send window.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self.trace is not None:
            self.trace.close()

    def state(self) -> ClientState:
        return ClientState(
            connected=self.connected,
            in_fallback=self.view.version == 0,
            fallback_reason=self.fallback_reason if self.view.version == 0 else "",
            policy_version=self.view.version,
            reports_sent_total=self.reports_sent_total,
            steps_dropped_total=self.steps_dropped_total,
            reports_rejected_total=self.reports_rejected_total,
            policies_rejected_total=self.policies_rejected_total,
            connects_total=self.connects_total,
        )

    # -- policy ------------------------------------------------------------------------------

    def _enter_fallback(self, reason: str) -> None:
        """Run the fallback arm from the next step; logged once per transition."""
        self.view = fallback_view(self.fallback, self.view.load_bucket_bounds)
        self.fallback_reason = reason
        if not self._fallback_logged:
            self._fallback_logged = True
            log.warning(
                "specctl_fallback", reason=reason, fallback_arm=self.fallback.name,
                engine_id=self.config.engine_id,
            )  # fmt: skip

    def _apply_policy(self, policy: pb.Policy) -> None:
        try:
            view = compile_policy(policy, self.offered)
        except PolicyError as exc:
            self.policies_rejected_total += 1
            log.error("specctl_policy_rejected", version=policy.version, error=str(exc))
            return
        was_fallback = self.view.version == 0
        self.view = view
        self._fallback_logged = False
        if was_fallback:
            log.info(
                "specctl_policy_applied", version=view.version, policy=policy.policy_name,
                engine_id=self.config.engine_id,
            )  # fmt: skip

    def _check_age(self) -> None:
        max_age = self.config.max_policy_age_s
        view = self.view
        if max_age > 0 and view.version != 0:
            age = time.monotonic() - view.received_monotonic
            if age > max_age:
                self._enter_fallback(f"policy {view.version} is {age:.1f}s old (max {max_age:g}s)")

    # -- the stream --------------------------------------------------------------------------

    def _status(self) -> pb.EngineStatus:
        view = self.view
        return pb.EngineStatus(
            in_fallback=view.version == 0,
            fallback_reason=self.fallback_reason if view.version == 0 else "",
            reports_dropped_total=self.steps_dropped_total,
            policy_age_s=max(0.0, time.monotonic() - view.received_monotonic),
            policy_version=view.version,
        )

    def _requests(self, done: threading.Event) -> Iterator[pb.EngineMessage]:
        """Hello, then reports and status until the stream ends; runs on gRPC's thread.

        A stream's first reports go out sooner: the thread wakes every
        ``FIRST_REPORT_SHARE`` of the interval until it has sent a report, then
        waits twice as long at each wake-up up to the interval (25, 50, 100 ms,
        then 200 ms by default). A sidecar decides best on its first steps'
        evidence when there is least of it: a fresh one otherwise decides on its
        prior alone for a whole interval, and replicas that share evidence each
        explore alone until their first reports reach the fleet.
        """
        yield pb.EngineMessage(hello=self.hello)
        # Where the engine stands (e.g. in fallback since the last sidecar went away).
        view = self.view
        last_status: tuple[bool, int, int] | None = (
            view.version == 0,
            view.version,
            self.steps_dropped_total,
        )
        last_status_at = time.monotonic()
        yield pb.EngineMessage(status=self._status())
        sequence = 0
        interval = self.config.report_interval_s
        wait = FIRST_REPORT_SHARE * interval
        while not done.is_set():
            # close() wakes this at once: send what is queued, then end the request
            # stream, so the sidecar reads every report before the stream closes.
            stopping = self._stop.wait(wait)
            self._check_age()
            queue = self.queue
            while queue:
                steps: list[StepRecord] = []
                while queue and len(steps) < MAX_STEPS_PER_REPORT:
                    steps.append(queue.popleft().record())
                sequence += 1
                self.reports_sent_total += 1
                yield pb.EngineMessage(report=encode_step_report(sequence, steps))
            if sequence:
                wait = min(interval, 2.0 * wait)
            view = self.view
            key = (view.version == 0, view.version, self.steps_dropped_total)
            now = time.monotonic()
            if key != last_status or now - last_status_at >= STATUS_INTERVAL_S:
                last_status, last_status_at = key, now
                yield pb.EngineMessage(status=self._status())
            if stopping:
                return

    def _run(self) -> None:
        backoff = self.config.reconnect_min_s
        while not self._stop.is_set():
            done = threading.Event()
            got_policy = False
            try:
                channel = open_channel(self.config)
            except OSError as exc:
                self._enter_fallback(f"TLS files unreadable: {exc}")
                self._stop.wait(self.config.reconnect_max_s)
                continue
            try:
                stub = pb_grpc.SpecControllerStub(channel)
                call = stub.Connect(self._requests(done))
                self._call = call
                self.connects_total += 1
                for message in call:
                    kind = message.WhichOneof("kind")
                    if kind == "policy":
                        if not got_policy:
                            got_policy = True
                            self.connected = True
                            backoff = self.config.reconnect_min_s
                        self._apply_policy(message.policy)
                    elif kind == "rejected":
                        self.reports_rejected_total += 1
                        r = message.rejected
                        log.warning(
                            "specctl_report_rejected", sequence=r.sequence, code=r.code,
                            message=r.message,
                        )  # fmt: skip
                reason = "sidecar closed the stream"
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else None
                detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                reason = f"sidecar unreachable: {code.name if code else 'error'}: {detail}"
            except Exception as exc:  # never into the engine
                reason = f"client error: {type(exc).__name__}: {exc}"
                log.exception("specctl_client_error")
            finally:
                done.set()
                self._call = None
                self.connected = False
                channel.close()
            if self._stop.is_set():
                break
            self._enter_fallback(reason)
            delay = backoff * (0.5 + self._jitter.random())
            backoff = min(backoff * 2.0, self.config.reconnect_max_s)
            self._stop.wait(delay)


def open_channel(config: EngineConfig) -> grpc.Channel:
    """A channel to the sidecar: plain, or TLS/mTLS with the files read now (rotation-safe)."""
    if not config.tls:
        return grpc.insecure_channel(config.address, options=_KEEPALIVE)

    def read(path: str) -> bytes | None:
        return Path(path).read_bytes() if path else None

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(config.tls_ca_file),
        private_key=read(config.tls_key_file),
        certificate_chain=read(config.tls_cert_file),
    )
    return grpc.secure_channel(config.address, credentials, options=_KEEPALIVE)
