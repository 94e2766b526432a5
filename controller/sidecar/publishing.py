"""Policy pushes: each engine gets the policy it can run, when it connects and when it changes.

Pushes run in their own task and reach each engine through its outbox, which
keeps only the latest policy: a slow engine gets the newest policy rather
than a backlog, and never holds up learning. A settled policy is sent again
every ``policy.republish_interval_s``, the heartbeat that keeps it from ageing
into the engines' fallback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from specctl.api import pb
from specctl.protocol.policy_messages import policy_message
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.config import PolicyConfig
from specctl.sidecar.published import EnginePolicy
from specctl.sidecar.sessions import Session, Sessions


class PolicyMessages:
    """The ``Policy`` message of each engine view of the current version, built once
    and stamped with ``issued_unix_s`` each time it is sent.

    Engines that offer the same drafters share a view (the book keeps them per
    version and offer), and building a message for every push would cost a
    millisecond per engine; copying a built one costs a tenth of that.
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
            found = (view, policy_message(view, issued_unix_s=0.0))
            self._built[id(view)] = found
        message = pb.Policy()
        message.CopyFrom(found[1])
        message.issued_unix_s = self.clock()
        return message


class Publisher:
    """Queues the book's policy for the engines that have not seen its version."""

    def __init__(self, book: PolicyBook, sessions: Sessions, config: PolicyConfig) -> None:
        self.book = book
        self.sessions = sessions
        self.config = config
        self.messages = PolicyMessages(book.clock)
        self._changed: asyncio.Event | None = None

    def full_policy(self) -> pb.Policy:
        """The policy as an engine offering every drafter seen would receive it."""
        return self.messages.policy(self.book.full_policy())

    def welcome(self, session: Session) -> None:
        """A new engine: its drafters join the arms, and it gets the current policy at once."""
        if self.book.offer(session.offered):
            self.notify()
        self._send(session)

    def notify(self) -> None:
        """The book's version moved: push it (at most every ``min_push_interval_s``)."""
        if self._changed is not None:
            self._changed.set()

    def configure(self, config: PolicyConfig) -> None:
        """A reloaded policy section: its push and republish intervals apply at once.

        :meth:`run` is woken, so that it waits for the next heartbeat with the new
        ``republish_interval_s`` rather than the one it last started waiting with.
        """
        self.config = config
        if self._changed is not None:
            self._changed.set()

    def push(self, republish: bool = False) -> None:
        """Queue the current version for every engine that has not seen it yet.

        With ``republish`` every engine gets it again: the heartbeat.
        """
        for session in self.sessions:
            if republish or session.pushed_version < self.book.version:
                self._send(session)

    def _send(self, session: Session) -> None:
        policy = self.messages.policy(self.book.policy_for(session.offered, session.fallback))
        session.pushed_version = policy.version
        session.outbox.put_policy(policy)

    def begin(self) -> None:
        """From now on :meth:`notify` wakes :meth:`run` (call it on the serving loop)."""
        self._changed = asyncio.Event()

    async def run(self) -> None:
        assert self._changed is not None, "begin() first"
        while True:
            # read on every wait: a configuration reload may change it
            republish = self.config.republish_interval_s or None
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=republish)
            except TimeoutError:
                self.push(republish=True)
                continue
            self._changed.clear()
            self.push()
            await asyncio.sleep(self.config.min_push_interval_s)
