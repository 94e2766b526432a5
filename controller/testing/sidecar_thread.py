"""A sidecar on its own event loop in a background thread, for synchronous callers.

Tests and benchmarks drive a real :class:`~specctl.sidecar.server.Sidecar`
from plain synchronous code (blocking gRPC stubs, /metrics scrapes) through it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from specctl.sidecar.config import SidecarConfig
from specctl.sidecar.server import Sidecar


class SidecarThread:
    """A sidecar on its own event loop in a background thread, for synchronous callers.

    Use it as a context manager::

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
