"""The shared evidence store's connection: TLS and AUTH, a wrong password, a slow store,
and how often a sidecar's rounds with it come.

Each test runs its own redis-server. A store that refuses the sidecar or stops
answering costs the sidecar its sharing, counted on /metrics, never its
serving: reports are learned from and policies pushed while a round with the
store waits out its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SidecarFactory
from fleet_support import PREFIX, Replica, fleet_metric, fleet_settings
from pki_support import issue, make_ca
from prometheus_client import CollectorRegistry

from specctl.policy.registry import make_policy
from specctl.protocol.reports import decode_step_report
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.config import FleetConfig
from specctl.sidecar.fleet_store import (
    EVIDENCE_POLL_SHARE,
    FIRST_ROUND_SHARE,
    ROUND_GROWTH,
    FleetStore,
    round_wait,
)
from specctl.sidecar.metrics import SidecarMetrics
from specctl.sidecar.sessions import Sessions
from specctl.testing.redis_server import RedisServer, RedisTls
from specctl.testing.scripted_engine import report


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="specctl-redis-"))
    yield path


def wait_until(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def errors(replica: Replica) -> float:
    return sum(
        fleet_metric(replica, "specctl_fleet_store_errors_total", operation=op)
        for op in ("connect", "publish", "read")
    )


def test_two_sidecars_share_through_a_tls_store_with_an_acl_user(
    sidecar_factory: SidecarFactory, directory: Path
) -> None:
    ca, ca_key, ca_cert = make_ca("store CA")
    server_pem = issue(ca_key, ca_cert, "localhost", server=True)
    for name, data in (("ca.pem", ca.cert), ("server.pem", server_pem.cert)):
        (directory / name).write_bytes(data)
    (directory / "server.key").write_bytes(server_pem.key)
    tls = RedisTls(directory / "server.pem", directory / "server.key", directory / "ca.pem")
    with RedisServer(directory / "store", tls=tls) as server:
        # a user that may run only what specctl runs, on keys under its prefix only
        user_password = directory / "specctl-password"
        user_password.write_text("specctl-user-password\n")
        with server.client() as admin:
            admin.execute_command(
                "ACL", "SETUSER", "specctl", "on", ">specctl-user-password",
                f"~{PREFIX}*", "+ping", "+get", "+mget", "+set", "+scan", "+client|setname",
            )  # fmt: skip
        settings = {
            "fleet_username": "specctl",
            "fleet_password_file": str(user_password),
            "fleet_tls_ca_file": str(directory / "ca.pem"),
        }
        a, b = (
            Replica(
                sidecar_factory("unix", **fleet_settings(server, f"sidecar-{n}", **settings)),
                f"engine-{n}",
                cls,
            )
            for n, cls in (("a", "chat"), ("b", "code"))
        )
        try:
            assert server.url.startswith("rediss://")
            a.send(20, 0.9)
            b.send(20, 0.9)
            for replica in (a, b):
                wait_until(
                    lambda r=replica: (
                        fleet_metric(r, "specctl_fleet_members", part="acceptance") == 1
                        and fleet_metric(r, "specctl_fleet_store_connected") == 1
                    ),
                    30,
                    "the two to share over TLS",
                )
                assert errors(replica) == 0
            wait_until(lambda: b.rounds("chat") > 100, 30, "b to decide chat from a's evidence")
        finally:
            a.close()
            b.close()


def test_a_wrong_password_is_counted_and_the_sidecar_serves_alone(
    sidecar_factory: SidecarFactory, directory: Path
) -> None:
    with RedisServer(directory) as server:
        wrong = directory / "wrong-password"
        wrong.write_text("not the password\n")
        settings = fleet_settings(server, "sidecar-a", fleet_password_file=str(wrong))
        a = Replica(sidecar_factory("unix", **settings), "engine-a", "chat")
        try:
            wait_until(
                lambda: (
                    fleet_metric(a, "specctl_fleet_store_errors_total", operation="connect") >= 2
                ),
                30,
                "failed connections, retried",
            )
            assert fleet_metric(a, "specctl_fleet_store_connected") == 0
            assert fleet_metric(a, "specctl_fleet_publishes_total") == 0
            assert a.engine is not None
            version = a.engine.recv_policy(timeout=30).version
            a.send(20, 0.9)
            assert a.engine.recv_policy(timeout=30, min_version=version + 1)
            with server.client() as client:
                assert list(client.scan_iter(match=f"{PREFIX}*")) == []
        finally:
            a.close()


def test_a_slow_store_never_holds_up_learning_or_pushes(
    sidecar_factory: SidecarFactory, directory: Path
) -> None:
    with RedisServer(directory) as server:
        a, b = (
            Replica(sidecar_factory("unix", **fleet_settings(server, f"sidecar-{n}")), f"e-{n}", c)
            for n, c in (("a", "chat"), ("b", "code"))
        )
        try:
            a.send(10, 0.2)
            b.send(10, 0.2)
            wait_until(
                lambda: fleet_metric(a, "specctl_fleet_members", part="acceptance") == 1,
                30,
                "a to merge b",
            )
            assert a.engine is not None
            version = a.engine.recv_policy(timeout=30).version

            # the store answers nothing for 5 s: every round with it times out (1 s)
            def sleep() -> None:
                with server.client(timeout=30.0) as client:
                    client.execute_command("DEBUG", "SLEEP", 5)

            sleeper = threading.Thread(target=sleep)
            sleeper.start()
            time.sleep(0.5)
            started = time.monotonic()
            a.send(30, 0.95)  # waits until the sidecar has received every report
            a.engine.recv_policy(timeout=30, min_version=version + 1)
            served = time.monotonic() - started
            wait_until(lambda: errors(a) >= 1, 30, "a round to time out")
            sleeper.join()
            # learning and pushing went on at their own pace while the store slept
            assert served < 2.0, served
            wait_until(
                lambda: fleet_metric(a, "specctl_fleet_store_connected") == 1,
                30,
                "a to reconnect once the store answers",
            )
        finally:
            a.close()
            b.close()


def test_without_a_store_configured_there_is_no_fleet(sidecar_factory: SidecarFactory) -> None:
    sidecar = sidecar_factory("unix", policy_name="specctl")
    assert sidecar.sidecar is not None and sidecar.sidecar.fleet is None
    a = Replica(sidecar, "engine-a", "chat")
    try:
        assert not any(name.startswith("specctl_fleet_") for name in a.metrics())
    finally:
        a.close()


class TimedStore(FleetStore):
    """The sidecar's store task, noting when each of its rounds starts."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.round_starts: list[float] = []

    async def round(self) -> None:
        self.round_starts.append(time.monotonic())
        await super().round()


def learn_one_report(book: PolicyBook) -> None:
    """The book learns from one engine report, as the first report of its traffic."""
    offered = {"ngram": 4}
    book.offer(offered)
    book.ingest(
        decode_step_report(
            report(1, arms=["ngram/k=2"], drafted=[2], accepted=[1]),
            engine_id="engine-pacing",
            offered=offered,
            num_load_buckets=book.num_load_buckets,
        )
    )


async def rounds_of(
    server: RedisServer, interval: float, idle_s: float, seconds: float
) -> tuple[list[float], float]:
    """Run a store task against ``server``: ``idle_s`` with nothing learned, then its first
    report, then ``seconds`` more. Its rounds' start times and the report's, from the
    task's start."""
    config = FleetConfig(
        url=server.url,
        password_file=str(server.password_file()),
        key_prefix=PREFIX,
        pool="pacing",
        sidecar_id="sidecar-pacing",
        publish_interval_s=interval,
        entry_ttl_s=3.0 * interval,
        timeout_s=5.0,
    )
    book = PolicyBook(make_policy("specctl", {}))
    store = TimedStore(
        config,
        book,
        Sessions(SidecarMetrics()),
        CollectorRegistry(),
        lambda: None,
        listen="unix:///nowhere.sock",
    )
    start = time.monotonic()
    task = asyncio.create_task(store.run())
    await asyncio.sleep(idle_s)
    learn_one_report(book)
    learned = time.monotonic() - start
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await store.close()
    failed = [store.metrics.errors.labels(op)._value.get() for op in ("connect", "read")]
    assert failed == [0.0, 0.0]  # every round reached the store: no backoff in the times
    return [t - start for t in store.round_starts], learned


def test_rounds_come_often_from_a_sidecars_first_report_then_once_an_interval(
    directory: Path,
) -> None:
    interval = 0.5
    with RedisServer(directory) as server:
        starts, learned = asyncio.run(rounds_of(server, interval, 1.6, 3.5))
    before = [t for t in starts if t < learned]
    after = [t for t in starts if t >= learned]
    # the first within a tenth of the interval (and the event loop's lag on a busy
    # machine): a new member merges the fleet's evidence at once
    assert before[0] <= FIRST_ROUND_SHARE * interval + 0.5, starts
    # with nothing learned, once an interval: quick rounds then would be spent before
    # the engine's traffic (an engine loads its model first)
    assert len(before) <= 1 + 1.6 / (0.9 * interval), (starts, learned)
    for a, b in itertools.pairwise(before):
        assert b - a >= 0.9 * interval - 1e-3, starts
    # the first report brings a round within a poll of it
    assert after[0] - learned <= EVIDENCE_POLL_SHARE * interval + 0.5, (starts, learned)
    for a, b in itertools.pairwise(after):
        # a round never comes before its wait (less the jitter): the wait grows with the
        # time since the report's round, from a tenth of the interval ...
        assert b - a >= 0.9 * round_wait(a - after[0], interval) - 1e-3, starts
        if a - after[0] >= interval / ROUND_GROWTH + 0.2:
            # ... to the interval (and a busy machine's lag: a round is a few round
            # trips to the store)
            assert b - a <= 1.1 * interval + 1.0, starts
    # rounds doubling from a tenth of the interval made 10 in 3.5 s; these make about 17,
    # and a machine busy enough to delay a few rounds still leaves more than doubling's
    assert len(after) >= 12, (starts, learned)
