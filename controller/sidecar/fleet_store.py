"""The sidecar's membership of a fleet: publish its evidence, merge the others', on Redis.

One task on the sidecar's event loop runs a round about every
``fleet.publish_interval_s`` (with jitter, the first ones sooner, after a
random delay, so that many sidecars started together neither stampede the
store nor each explore long alone, see :meth:`FleetStore.run`): it writes
this sidecar's own evidence under its own key with an expiry
(``fleet.entry_ttl_s``), reads every entry under the key prefix, checks each
(:mod:`specctl.sidecar.fleet_entry`), sums the others' (acceptance from
replicas of the same model, step cost from the same pool) and hands the sum
to the book, which merges it in place of the previous one
(:meth:`~specctl.sidecar.book.PolicyBook.merge_shared`). Its own entry is
never merged: the fleet's evidence and this sidecar's are kept apart all the
way into the posterior (:mod:`specctl.policy.shared`).

Nothing waits on the store. Engines sample from the policy they were pushed;
reports are learned from as they arrive; every operation on the store has a
timeout (``fleet.timeout_s``), and encoding and checking entries run in a
worker thread. When the store is down, slow or refuses us, the round fails,
is counted and logged, and the task reconnects with exponential backoff and
jitter up to ``fleet.reconnect_max_s``; meanwhile the sidecar serves on its
own evidence and on the fleet's last merge, which it drops once that is older
than an entry's expiry, as the store would have. A member that stops
publishing ages out of the store the same way.

A class reset on one member (``ResetClass``) reaches the others through the
entries: each carries the resets its writer has applied, a member that reads
a later reset of a class than it has applied forgets the class too, and
nobody merges a member's evidence of a class from before its latest reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from specctl.logs import get_logger
from specctl.policy.shared import SharedEvidence, sum_acceptance, sum_cost, without_classes
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.config import FleetConfig
from specctl.sidecar.fleet_entry import (
    Entry,
    EntryError,
    EntryHeader,
    encode_entry,
    read_body,
    read_header,
)
from specctl.sidecar.fleet_identity import (
    FleetIdentity,
    default_sidecar_id,
    entry_key,
    pool_of_hello,
)
from specctl.sidecar.sessions import Sessions

log = get_logger(__name__)

T = TypeVar("T")

# keys read per MGET
_READ_CHUNK = 100
# a failing store is logged on the first failure, then at most this often
_FAILURE_LOG_INTERVAL_S = 30.0
# entries published longer ago than this many expiries are stale (an entry written
# without expiry, or a clock far off): skipped
_STALE_EXPIRIES = 3.0
# the first round comes within this share of fleet.publish_interval_s, and no wait between
# rounds is shorter (see round_wait)
FIRST_ROUND_SHARE = 0.1
# until rounds are fleet.publish_interval_s apart, the wait before the next round is this
# share of the time since this sidecar's own evidence began (see round_wait)
ROUND_GROWTH = 0.25
# while a sidecar has learned nothing of its own, how often (a share of
# fleet.publish_interval_s) it looks whether its first report has been learned: the round
# that follows comes within this share, at a moment of its own
EVIDENCE_POLL_SHARE = 0.025
ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class FleetMetrics:
    """The fleet's series (``specctl_fleet_*``), on the sidecar's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connected = Gauge(
            "specctl_fleet_store_connected",
            "1 while the last round with the shared evidence store succeeded, else 0.",
            registry=registry,
        )
        self.errors = Counter(
            "specctl_fleet_store_errors",
            "Rounds with the shared evidence store that failed, by the operation that "
            "failed: connect, publish, read.",
            ["operation"],
            registry=registry,
        )
        self.rejected = Counter(
            "specctl_fleet_entries_rejected",
            "Entries under the key prefix that were not merged, by reason: foreign (not this "
            "format or schema version), corrupt, oversized, stale, id_conflict (another "
            "sidecar writes this sidecar's key). Each entry is counted once.",
            ["reason"],
            registry=registry,
        )
        self.members = Gauge(
            "specctl_fleet_members",
            "Other sidecars whose evidence the last merge took, by part: acceptance (same "
            "model), cost (same pool).",
            ["part"],
            registry=registry,
        )
        self.publishes = Counter(
            "specctl_fleet_publishes", "Entries this sidecar wrote to the store.", registry=registry
        )
        self.last_merge = Gauge(
            "specctl_fleet_last_merge_timestamp_seconds",
            "When the fleet's evidence was last read and merged (unix time).",
            registry=registry,
        )
        self.round_duration = Histogram(
            "specctl_fleet_round_duration_seconds",
            "One round with the store: publish, read, check and merge.",
            buckets=ROUND_BUCKETS,
            registry=registry,
        )
        self.members.labels("acceptance").set(0)
        self.members.labels("cost").set(0)
        for operation in ("connect", "publish", "read"):
            self.errors.labels(operation)


def round_wait(since_start_s: float, interval_s: float) -> float:
    """The wait before the next round, ``since_start_s`` after this sidecar's own
    evidence began (its first report learned; see :meth:`FleetStore.run`).

    Replicas whose traffic starts together have evidence in proportion to the
    time since it started, and decide best on all of it: between two rounds a replica decides on
    what the fleet knew at the first, a share ``t / (t + wait)`` of what it knows
    by the second. The wait is ``ROUND_GROWTH`` of the time since the start, so
    that once the wait is past its floor (0.4 of the interval after the start)
    that share stays at about 80% (78% with the jitter at its longest); rounds
    that doubled from a tenth of the interval let it fall to a third in the
    first second, when every decision rests on little and costs the most
    (measured in benchmarks/fleet_regret.py).
    The wait is never shorter than ``FIRST_ROUND_SHARE`` of the interval (an
    engine reports every 0.2 s by default: faster rounds would find nothing
    new) nor longer than the interval. A member makes about 14 rounds in its
    first 4 s with rounds of 1 s (6 when they doubled), then one a second: a few
    more small reads and writes in a fleet's first seconds, none after.
    """
    floor = FIRST_ROUND_SHARE * interval_s
    return min(interval_s, max(floor, ROUND_GROWTH * since_start_s))


class StoreFailed(Exception):
    """A round with the store failed at ``operation``."""

    def __init__(self, operation: str, cause: BaseException) -> None:
        super().__init__(f"{operation}: {type(cause).__name__}: {cause}")
        self.operation = operation
        self.cause = cause


@dataclass(frozen=True)
class _Read:
    """One entry as read: its header and evidence, or why it was not used."""

    key: str
    digest: str
    header: EntryHeader | None = None
    evidence: SharedEvidence | None = None
    resets: dict[str, float] | None = None
    error: EntryError | None = None


class FleetStore:
    """Publishes this sidecar's evidence and merges the fleet's, one round at a time."""

    def __init__(
        self,
        config: FleetConfig,
        book: PolicyBook,
        sessions: Sessions,
        registry: CollectorRegistry,
        on_change: Callable[[], None],
        *,
        listen: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.book = book
        self.sessions = sessions
        self.metrics = FleetMetrics(registry)
        self.on_change = on_change
        self.clock = clock
        self.sidecar_id = config.sidecar_id or default_sidecar_id(listen)
        # tells this process's entries from another's that uses the same id
        self.instance = secrets.token_hex(8)
        self._password = config.read_password()
        self._pool = config.pool or None
        self._model: str | None = None
        self._client: Redis | None = None
        self._connected: bool | None = None
        self._failure_logged_at = -1e9
        self._merged_at: float | None = None  # monotonic
        self._has_merged = False
        # key -> digest of the value last rejected there (each bad entry is counted once)
        self._rejected: dict[str, str] = {}
        self._rng = random.Random()
        # when (monotonic) this sidecar's own evidence began: its first report learned
        self._evidence_from: float | None = None

    # ------------------------------------------------------------------ identity

    def identity(self) -> FleetIdentity | None:
        """This sidecar's place in the fleet: from the configuration and the first
        engine's hello, or (pool configured, no engine yet) the model of its pool."""
        if self._pool is None or self._model is None:
            for session in self.sessions:
                if self._pool is None:
                    self._pool = pool_of_hello(session.hello)
                if self._model is None and session.hello.model:
                    self._model = session.hello.model
                break
        if self._pool is None or self._model is None:
            return None
        return FleetIdentity(self.sidecar_id, self._pool, self._model)

    # ------------------------------------------------------------------ the task

    async def run(self) -> None:
        """Rounds until cancelled; a failed round backs off, with jitter.

        The first round comes within a tenth of ``fleet.publish_interval_s`` (at
        a random moment, so that sidecars started together do not arrive
        together; sooner if a report is learned meanwhile): a new member merges
        the fleet's evidence at once. Then rounds
        come once an interval while this sidecar has learned nothing of its own,
        and quicker from its first report on: the next round within
        ``EVIDENCE_POLL_SHARE`` of the interval, then after waits that grow with
        the time since that report up to the interval (:func:`round_wait`).
        Evidence is worth most when there is least of it, and replicas whose
        traffic starts together pool their first steps' evidence before each has
        explored much on its own. A sidecar starts well before its engine's
        traffic (the engine loads its model first): quick rounds timed from the
        sidecar's start would all be spent before there is anything to share.
        """
        interval = self.config.publish_interval_s
        await self._pause(self._rng.uniform(0.0, interval * FIRST_ROUND_SHARE), interval)
        backoff = interval
        while True:
            started = time.monotonic()
            try:
                await self.round()
            except StoreFailed as exc:
                self._failed(exc)
                await self._close_client()
                self._age_out()
                await asyncio.sleep(backoff * self._rng.uniform(0.5, 1.5))
                backoff = min(backoff * 2.0, self.config.reconnect_max_s)
                continue
            except Exception:  # a bug: logged, and the sidecar goes on serving
                log.exception("fleet_round_failed")
                self.book.stats.count_internal_error("fleet")
                self._age_out()
            else:
                self._succeeded()
                backoff = interval
            now = time.monotonic()
            self._notice_evidence(started)
            if self._evidence_from is None:
                wait = interval * self._rng.uniform(0.9, 1.1)
            else:
                wait = round_wait(now - self._evidence_from, interval)
                wait *= self._rng.uniform(0.9, 1.1)
            await self._pause(max(0.0, wait - (now - started)), interval)

    def _notice_evidence(self, now: float) -> None:
        """Mark ``now`` (monotonic) as when this sidecar's own evidence began, if it has
        learned from a report and had not before."""
        if self._evidence_from is None and self.book.stats.learned_until_unix_s > 0.0:
            self._evidence_from = now

    async def _pause(self, wait_s: float, interval_s: float) -> None:
        """Wait ``wait_s`` before the next round, or less: while this sidecar has no
        evidence of its own, until its first report is learned (looked at every
        ``EVIDENCE_POLL_SHARE`` of the interval, a cheap local check)."""
        deadline = time.monotonic() + wait_s
        poll = EVIDENCE_POLL_SHARE * interval_s
        while self._evidence_from is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0.0:
                return
            await asyncio.sleep(min(remaining, poll))
            self._notice_evidence(time.monotonic())
            if self._evidence_from is not None:
                return
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))

    async def close(self) -> None:
        await self._close_client()

    async def round(self) -> None:
        """Publish this sidecar's evidence, read the fleet's, merge it."""
        started = time.perf_counter()
        client = await self._connect()
        identity = self.identity()
        if identity is not None:
            await self._publish(client, identity)
        reads = await self._read(client)
        if identity is None:
            self._learn_model(reads)
            identity = self.identity()
        if identity is None:
            return  # no engine yet, and nothing says which model this sidecar serves
        reset = self._apply_resets(reads, identity)
        shared, members = self._combine(reads, identity)
        changed, left_out = self.book.merge_shared(shared)
        changed |= reset
        if left_out.classes_without_slot or left_out.drafters_without_slot:
            log.warning(
                "fleet_evidence_left_out",
                classes=left_out.classes_without_slot,
                drafters=left_out.drafters_without_slot,
                hint="the policy's max_classes or max_drafters is full",
            )
        self._has_merged = shared is not None
        self._merged_at = time.monotonic()
        self.metrics.members.labels("acceptance").set(members[0])
        self.metrics.members.labels("cost").set(members[1])
        self.metrics.last_merge.set(self.clock())
        self.metrics.round_duration.observe(time.perf_counter() - started)
        if changed:
            self.on_change()

    # ------------------------------------------------------------------ store operations

    async def _connect(self) -> Redis:
        if self._client is not None:
            return self._client
        cfg = self.config
        kwargs: dict[str, Any] = {
            "socket_timeout": cfg.timeout_s,
            "socket_connect_timeout": cfg.timeout_s,
            # the task's own backoff decides when to try again, never the client
            "retry": Retry(NoBackoff(), 0),
            "client_name": f"specctl-{self.sidecar_id}",
        }
        if cfg.username:
            kwargs["username"] = cfg.username
        if self._password is not None:
            kwargs["password"] = self._password
        if cfg.url.startswith("rediss://"):
            if cfg.tls_ca_file:
                kwargs["ssl_ca_certs"] = cfg.tls_ca_file
            if cfg.tls_cert_file:
                kwargs["ssl_certfile"] = cfg.tls_cert_file
                kwargs["ssl_keyfile"] = cfg.tls_key_file
        client = Redis.from_url(cfg.url, **kwargs)
        try:
            await self._op("connect", client.ping())
        except StoreFailed:
            await _close(client)
            raise
        self._client = client
        return client

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await _close(client)

    async def _op(self, operation: str, awaitable: Awaitable[T]) -> T:
        """One operation on the store, bounded by ``fleet.timeout_s``."""
        try:
            return await asyncio.wait_for(awaitable, timeout=self.config.timeout_s)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreFailed(operation, exc) from exc

    async def _publish(self, client: Redis, identity: FleetIdentity) -> None:
        evidence = self.book.contribution()
        if evidence is None:
            return  # the policy keeps nothing it can share
        header = EntryHeader(
            sidecar_id=identity.sidecar_id,
            instance=self.instance,
            pool=identity.pool,
            model=identity.model,
            published_unix_s=self.clock(),
        )
        entry = Entry(header, evidence, self.book.fleet_resets())
        data = await asyncio.to_thread(encode_entry, entry)
        if len(data) > self.config.max_entry_bytes:
            log.error(
                "fleet_entry_too_large",
                key=identity.key(self.config.key_prefix),
                bytes=len(data),
                max_entry_bytes=self.config.max_entry_bytes,
            )
            return
        ttl_ms = int(self.config.entry_ttl_s * 1000)
        key = identity.key(self.config.key_prefix)
        await self._op("publish", client.set(key, data, px=ttl_ms))
        self.metrics.publishes.inc()

    async def _read(self, client: Redis) -> list[_Read]:
        cfg = self.config

        async def scan() -> list[bytes]:
            found: list[bytes] = []
            async for key in client.scan_iter(match=f"{cfg.key_prefix}*", count=1000):
                found.append(key)
                if len(found) >= cfg.max_members:
                    break
            return found

        keys = await self._op("read", scan())
        values: list[Any] = []
        for i in range(0, len(keys), _READ_CHUNK):
            values += await self._op("read", client.mget(keys[i : i + _READ_CHUNK]))
        # a key that expired between the scan and the read reads as None
        pairs = [(k, v) for k, v in zip(keys, values, strict=True) if isinstance(v, bytes)]
        return await asyncio.to_thread(self._check_all, pairs)

    def _check_all(self, pairs: Sequence[tuple[bytes, bytes]]) -> list[_Read]:
        """Check every entry (in a worker thread: this touches nothing shared)."""
        out = []
        max_bytes = self.config.max_entry_bytes
        for raw_key, value in pairs:
            key = raw_key.decode("utf-8", "replace")
            digest = hashlib.sha256(value).hexdigest()[:16]
            try:
                header, body = read_header(value, max_bytes=max_bytes)
                if key != entry_key(self.config.key_prefix, header.pool, header.sidecar_id):
                    raise EntryError(
                        "foreign",
                        f"the entry names pool {header.pool!r} and sidecar "
                        f"{header.sidecar_id!r}, not its key's",
                    )
                evidence, resets = read_body(body)
            except EntryError as exc:
                out.append(_Read(key, digest, error=exc))
                continue
            out.append(_Read(key, digest, header=header, evidence=evidence, resets=resets))
        return out

    # ------------------------------------------------------------------ merging

    def _learn_model(self, reads: Sequence[_Read]) -> None:
        """Before any engine: the model of this sidecar's configured pool, from its entries."""
        if self._pool is None:
            return
        for r in reads:
            if r.header is not None and r.header.pool == self._pool:
                self._model = r.header.model
                return

    def _members(self, reads: Sequence[_Read], identity: FleetIdentity) -> list[_Read]:
        """The other members' entries of this sidecar's model that are checked and fresh."""
        now = self.clock()
        return [
            r
            for r in reads
            if r.header is not None
            and r.header.sidecar_id != identity.sidecar_id
            and r.header.model == identity.model
            and now - r.header.published_unix_s <= _STALE_EXPIRIES * self.config.entry_ttl_s
        ]

    def _apply_resets(self, reads: Sequence[_Read], identity: FleetIdentity) -> bool:
        """Forget the classes another member reset since this sidecar last did; True if
        the published policy changed."""
        latest: dict[str, float] = {}
        for r in self._members(reads, identity):
            for name, epoch in (r.resets or {}).items():
                latest[name] = max(epoch, latest.get(name, epoch))
        changed = False
        for name, epoch in latest.items():
            if self.book.apply_fleet_reset(name, epoch):
                changed = True
                log.info("fleet_class_reset", workload_class=name, epoch=epoch)
        return changed

    def _combine(
        self, reads: Sequence[_Read], identity: FleetIdentity
    ) -> tuple[SharedEvidence | None, tuple[int, int]]:
        """The sum of the other members' evidence: acceptance of the same model, cost of
        the same pool and load buckets. A member's acceptance of a class it has not
        reset since the class's latest reset is left out. Bad entries are counted and
        logged once each."""
        now = self.clock()
        own_key = identity.key(self.config.key_prefix)
        resets = self.book.fleet_resets()
        acceptance, cost = [], []
        present = set()
        for r in reads:
            present.add(r.key)
            if r.error is not None:
                self._reject(r.key, r.digest, r.error)
                continue
            assert r.header is not None and r.evidence is not None
            header = r.header
            if header.sidecar_id == identity.sidecar_id:
                if r.key == own_key and header.instance != self.instance:
                    self._reject(
                        r.key,
                        header.instance,
                        EntryError(
                            "id_conflict",
                            "another sidecar publishes under this sidecar's id: give each "
                            "replica its own fleet.sidecar_id",
                        ),
                    )
                continue  # never merge its own
            if now - header.published_unix_s > _STALE_EXPIRIES * self.config.entry_ttl_s:
                self._reject(
                    r.key,
                    r.digest,
                    EntryError("stale", f"published at {header.published_unix_s:.0f}, long ago"),
                )
                continue
            if header.model != identity.model:
                continue  # another model's fleet
            part = r.evidence.acceptance
            if part is not None:
                # a class this member has not reset yet: its evidence is from before
                entry_resets = r.resets or {}
                stale = {
                    name for name, epoch in resets.items() if entry_resets.get(name, -1.0) < epoch
                }
                part = without_classes(part, stale) if stale else part
            if part is not None:
                acceptance.append(part)
            c = r.evidence.cost
            if (
                header.pool == identity.pool
                and c is not None
                and c.load_bucket_bounds == self.book.load_bucket_bounds
            ):
                cost.append(c)
        # forget rejections of keys that are gone: a new bad value there is counted again
        for key in set(self._rejected) - present:
            del self._rejected[key]
        if not acceptance and not cost:
            return None, (0, 0)
        return SharedEvidence(sum_acceptance(acceptance), sum_cost(cost)), (
            len(acceptance),
            len(cost),
        )

    def _reject(self, key: str, digest: str, error: EntryError) -> None:
        if self._rejected.get(key) == digest:
            return
        self._rejected[key] = digest
        self.metrics.rejected.labels(error.reason).inc()
        log.warning("fleet_entry_rejected", key=key, reason=error.reason, error=error.message)

    # ------------------------------------------------------------------ health

    def _succeeded(self) -> None:
        if self._connected is not True:
            log.info(
                "fleet_store_connected",
                url=self.config.url,
                sidecar_id=self.sidecar_id,
                pool=self._pool,
                model=self._model,
            )
        self._connected = True
        self.metrics.connected.set(1)

    def _failed(self, exc: StoreFailed) -> None:
        self.metrics.errors.labels(exc.operation).inc()
        self.metrics.connected.set(0)
        now = time.monotonic()
        if self._connected is not False or now - self._failure_logged_at >= _FAILURE_LOG_INTERVAL_S:
            log.warning(
                "fleet_store_unavailable",
                url=self.config.url,
                operation=exc.operation,
                error=f"{type(exc.cause).__name__}: {exc.cause}",
                hint="serving on this sidecar's own evidence until the store is back",
            )
            self._failure_logged_at = now
        self._connected = False

    def _age_out(self) -> None:
        """Without a round for longer than an entry lives, drop the fleet's last merge: the
        store would have expired every entry in it by now."""
        if not self._has_merged or self._merged_at is None:
            return
        if time.monotonic() - self._merged_at < self.config.entry_ttl_s:
            return
        changed, _ = self.book.merge_shared(None)
        self._has_merged = False
        self.metrics.members.labels("acceptance").set(0)
        self.metrics.members.labels("cost").set(0)
        log.warning("fleet_evidence_expired", age_s=round(time.monotonic() - self._merged_at, 1))
        if changed:
            self.on_change()


async def _close(client: Redis) -> None:
    with contextlib.suppress(Exception):
        await client.aclose()
