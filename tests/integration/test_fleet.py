"""A fleet of three sidecars learning through a real redis-server that the tests run.

Each sidecar serves a simulated engine of its own workload class over gRPC
(``chat``, ``code``, ``math``); the three share evidence through the store.
What one learns changes the others' decisions within 2 s; killing the store
leaves all three serving, with the fault on /metrics, and they re-join when it
returns; a restarted sidecar comes back with the fleet's evidence; corrupt,
foreign and oversized entries planted in the store are counted and skipped; a
class reset on one sidecar is forgotten by all three.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import structlog.testing
from conftest import SidecarFactory
from fleet_support import PREFIX, Replica, fleet_metric, fleet_settings

from specctl.api import pb, pb_grpc
from specctl.sidecar.fleet_entry import decode_entry
from specctl.testing.redis_server import RedisServer

CLASSES = {"a": "chat", "b": "code", "c": "math"}
LOW, HIGH = 0.1, 0.95


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    directory = Path(tempfile.mkdtemp(prefix="specctl-redis-"))
    server = RedisServer(directory).start()
    yield server
    server.stop()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` every 50 ms; the time it became true (monotonic)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)
    return time.monotonic()


def start_fleet(
    sidecar_factory: SidecarFactory, server: RedisServer, **more: object
) -> dict[str, Replica]:
    replicas = {
        name: Replica(
            sidecar_factory("unix", **fleet_settings(server, f"sidecar-{name}", **more)),
            f"engine-{name}",
            cls,
        )
        for name, cls in CLASSES.items()
    }
    # each engine runs its own class, where drafts are rarely accepted
    for replica in replicas.values():
        replica.send(40, LOW)
    for replica in replicas.values():
        wait_until(
            lambda r=replica: fleet_metric(r, "specctl_fleet_members", part="acceptance") == 2,
            30,
            f"{replica.engine_id}'s sidecar to merge the other two",
        )
    return replicas


def test_what_one_sidecar_learns_changes_the_others_decisions_within_2s(
    sidecar_factory: SidecarFactory, redis_server: RedisServer
) -> None:
    fleet = start_fleet(sidecar_factory, redis_server)
    a, b, c = fleet["a"], fleet["b"], fleet["c"]
    try:
        # every sidecar knows every class, from the fleet: drafts of chat are rarely
        # accepted, so no sidecar runs chat at K=4
        for replica in fleet.values():
            wait_until(
                lambda r=replica: r.rounds("chat") > 500, 30, "chat's evidence at every sidecar"
            )
            p = replica.probability("chat", "ngram/k=4")
            assert p is not None and p < 0.3, (replica.engine_id, p)
        # chat's drafts are now accepted behind sidecar a only
        a.send(40, HIGH, "chat")
        learned = wait_until(
            lambda: (a.probability("chat", "ngram/k=4") or 0.0) > 0.5, 30, "a to learn chat"
        )
        changed = {
            r.engine_id: wait_until(
                lambda r=r: (r.probability("chat", "ngram/k=4") or 0.0) > 0.5,
                30,
                f"{r.engine_id}'s sidecar to follow",
            )
            - learned
            for r in (b, c)
        }
        assert max(changed.values()) < 2.0, changed
        # b and c never ran chat: what they decide rests on what a gathered
        assert b.rounds("chat") > 100 and c.rounds("chat") > 100
    finally:
        for replica in fleet.values():
            replica.close()


def test_without_the_store_every_sidecar_serves_and_rejoins_when_it_returns(
    sidecar_factory: SidecarFactory, redis_server: RedisServer
) -> None:
    fleet = start_fleet(sidecar_factory, redis_server)
    try:
        redis_server.stop(kill=True)
        for replica in fleet.values():
            wait_until(
                lambda r=replica: (
                    fleet_metric(r, "specctl_fleet_store_connected") == 0.0
                    and sum(
                        fleet_metric(r, "specctl_fleet_store_errors_total", operation=op)
                        for op in ("connect", "publish", "read")
                    )
                    > 0
                ),
                30,
                f"{replica.engine_id}'s sidecar to show the store down",
            )
        # every sidecar still learns from its engine and pushes it new policies
        for replica in fleet.values():
            version = replica.engine.recv_policy(timeout=30).version
            replica.send(40, HIGH)
            assert replica.engine.recv_policy(timeout=30, min_version=version + 1).version
        # the fleet's last merge ages out (entries live 3 s): each serves on its own
        for replica in fleet.values():
            wait_until(
                lambda r=replica: fleet_metric(r, "specctl_fleet_members", part="acceptance") == 0,
                30,
                "the fleet's evidence to age out",
            )
        redis_server.start()
        for replica in fleet.values():
            wait_until(
                lambda r=replica: (
                    fleet_metric(r, "specctl_fleet_store_connected") == 1.0
                    and fleet_metric(r, "specctl_fleet_members", part="acceptance") == 2
                ),
                30,
                f"{replica.engine_id}'s sidecar to re-join",
            )
        with redis_server.client() as client:
            keys = sorted(k.decode() for k in client.scan_iter(match=f"{PREFIX}*"))
        assert len(keys) == 3 and all(k.startswith(PREFIX) for k in keys), keys
    finally:
        for replica in fleet.values():
            replica.close()


def test_a_restarted_sidecar_comes_back_with_the_fleets_evidence(
    sidecar_factory: SidecarFactory, redis_server: RedisServer
) -> None:
    # a configured pool: the restarted sidecar finds its model in the pool's entries
    # and merges before any engine connects
    fleet = start_fleet(sidecar_factory, redis_server, fleet_pool="testbed")
    try:
        c = fleet["c"]
        # the others' evidence reaches c with their next publish
        wait_until(
            lambda: min(c.rounds(cls) for cls in ("chat", "code")) > 100,
            30,
            "c to merge what a and b learned",
        )
        before = {cls: c.rounds(cls) for cls in ("chat", "code")}
        c.close()
        c.sidecar.stop()
        settings = fleet_settings(redis_server, "sidecar-c", fleet_pool="testbed")
        restarted = Replica(sidecar_factory("unix", **settings), "engine-c", "math", connect=False)
        fleet["c"] = restarted
        assert restarted.rounds("chat") == 0.0  # no state of its own: it starts cold
        wait_until(
            lambda: (
                restarted.rounds("chat") > 0.5 * before["chat"]
                and restarted.rounds("code") > 0.5 * before["code"]
            ),
            30,
            "the restarted sidecar to merge the fleet's evidence",
        )
        p = restarted.probability("chat", "ngram/k=4")
        assert p is not None and p < 0.3, p  # and decides as the fleet does
    finally:
        for replica in fleet.values():
            replica.close()


def test_corrupt_foreign_and_oversized_entries_are_counted_and_skipped(
    sidecar_factory: SidecarFactory,
    redis_server: RedisServer,
) -> None:
    fleet = start_fleet(
        sidecar_factory, redis_server, fleet_pool="testbed", fleet_max_entry_bytes=256 * 1024
    )
    planted = {
        "corrupt": f"{PREFIX}testbed:intruder",
        "foreign": f"{PREFIX}testbed:garbage",
        "oversized": f"{PREFIX}testbed:huge",
    }
    try:
        with structlog.testing.capture_logs() as logs, redis_server.client() as client:
            entry = client.get(f"{PREFIX}testbed:sidecar-a")
            assert isinstance(entry, bytes)
            header, _, body = entry.partition(b"\n")
            # an entry of a sidecar named intruder whose body lost a bit on the way
            header = header.replace(b'"sidecar-a"', b'"intruder"')
            flipped = body[:-10] + bytes([body[-10] ^ 0x01]) + body[-9:]
            client.set(planted["corrupt"], header + b"\n" + flipped)
            client.set(planted["foreign"], b"\x00\x01 not an entry")
            client.set(planted["oversized"], b"x" * 300_000)
            for replica in fleet.values():
                wait_until(
                    lambda r=replica: all(
                        fleet_metric(r, "specctl_fleet_entries_rejected_total", reason=reason) >= 1
                        for reason in planted
                    ),
                    30,
                    f"{replica.engine_id}'s sidecar to reject the planted entries",
                )
            # rounds later, each bad entry is still counted once, and the fleet still merges
            merged_at = {
                r.engine_id: fleet_metric(r, "specctl_fleet_last_merge_timestamp_seconds")
                for r in fleet.values()
            }
            for replica in fleet.values():
                wait_until(
                    lambda r=replica: (
                        fleet_metric(r, "specctl_fleet_last_merge_timestamp_seconds")
                        > merged_at[r.engine_id] + 1.0
                    ),
                    30,
                    "two more rounds",
                )
                for reason in planted:
                    assert (
                        fleet_metric(replica, "specctl_fleet_entries_rejected_total", reason=reason)
                        == 1.0
                    ), reason
                assert fleet_metric(replica, "specctl_fleet_members", part="acceptance") == 2
                assert fleet_metric(replica, "specctl_fleet_members", part="cost") == 2
        # each logged with its key, by each sidecar
        rejected = [(e["key"], e["reason"]) for e in logs if e["event"] == "fleet_entry_rejected"]
        for reason, key in planted.items():
            assert rejected.count((key, reason)) == len(fleet), (key, rejected)
    finally:
        for replica in fleet.values():
            replica.close()


def test_a_class_reset_on_one_sidecar_is_forgotten_by_the_whole_fleet(
    sidecar_factory: SidecarFactory, redis_server: RedisServer
) -> None:
    token = Path(tempfile.mkdtemp(prefix="specctl-admin-")) / "token"
    token.write_text("fleet-admin-token\n")
    fleet = start_fleet(
        sidecar_factory, redis_server, admin_enabled=True, admin_token_file=str(token)
    )
    a, b, c = fleet["a"], fleet["b"], fleet["c"]
    try:
        # chat runs behind a and b: each has chat evidence of its own, c only the fleet's
        b.send(40, LOW, "chat")
        for replica in fleet.values():
            wait_until(lambda r=replica: r.rounds("chat") > 500, 30, "chat at every sidecar")
        code = b.rounds("code")
        with grpc.insecure_channel(a.sidecar.address) as channel:
            admin = pb_grpc.SpecControllerAdminStub(channel)
            admin.ResetClass(
                pb.ResetClassRequest(workload_class="chat"),
                metadata=(("authorization", "Bearer fleet-admin-token"),),
                timeout=10,
            )
        # b forgets its own chat evidence too, and nobody merges it back: neither a, whose
        # merge of b's would restore it, nor c
        for replica in fleet.values():
            wait_until(
                lambda r=replica: r.rounds("chat") < 1.0, 10, f"{replica.engine_id} to forget chat"
            )
        time.sleep(2.0)  # four rounds of 0.5 s
        assert [r.rounds("chat") for r in (a, b, c)] == [0.0, 0.0, 0.0]
        assert b.rounds("code") > 0.5 * code  # the other classes are kept
        with redis_server.client() as client:
            for key in client.scan_iter(match=f"{PREFIX}*"):
                data = client.get(key)
                assert isinstance(data, bytes)
                assert "chat" in decode_entry(data, max_bytes=1 << 22).resets, key
        # what is learned of chat after the reset is shared as before
        b.send(40, LOW, "chat")
        for replica in (a, c):
            wait_until(
                lambda r=replica: r.rounds("chat") > 100, 30, "chat's new evidence to be shared"
            )
    finally:
        for replica in fleet.values():
            replica.close()
