"""The simulated engine on the wire: the engine's own sidecar client over gRPC.

:class:`GrpcLink` hands each step record to
:class:`~specctl.engine.client.SidecarClient`, the same background thread a
vLLM engine runs, and reads the policy view it keeps current; so a running
sidecar sees exactly what a real engine would send.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from specctl.arms import OFF, Arm
from specctl.engine.client import SidecarClient
from specctl.engine.config import EngineConfig
from specctl.engine.policy_view import PolicyView
from specctl.protocol.hello import hello_message
from specctl.sim.engine import RunRecord, SimulatedEngine, World
from specctl.sim.scenario import Scenario
from specctl.steps import StepRecord


class _Step(StepRecord):
    """A simulated step is complete when it is recorded: the client may take it as is."""

    def record(self) -> StepRecord:
        return self


class GrpcLink:
    """Records go to a :class:`SidecarClient`; the view is the client's."""

    def __init__(
        self,
        address: str,
        offered: Mapping[str, int],
        *,
        model: str,
        fallback: Arm = OFF,
        engine_id: str = "sim-0",
        report_interval_s: float = 0.05,
        max_batch_size: int = 256,
    ) -> None:
        config = EngineConfig(
            address=address,
            fallback_arm=fallback.name,
            engine_id=engine_id,
            report_interval_s=report_interval_s,
        )
        hello = hello_message(
            engine_id,
            offered,
            fallback,
            model=model,
            vllm_version="simulated",
            max_batch_size=max_batch_size,
        )
        self.client = SidecarClient(config, hello, offered, fallback)
        self.client.start()

    @property
    def view(self) -> PolicyView:
        return self.client.view

    def push(self, record: StepRecord) -> None:
        self.client.push(_Step(**vars(record)))

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until the client has sent what was queued."""
        deadline = time.monotonic() + timeout_s
        while self.client.queue and time.monotonic() < deadline:
            time.sleep(0.01)

    def wait_for_policy(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.client.view.version == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.client.view.version != 0

    def close(self) -> None:
        self.flush()
        self.client.close()


def simulate_against(
    address: str,
    scenario: Scenario,
    *,
    seed: int = 0,
    rate: float = 0.0,
    engine_id: str = "sim-0",
    connect_timeout_s: float = 10.0,
    progress: Callable[[int], None] | None = None,
) -> tuple[RunRecord, GrpcLink]:
    """Drive the sidecar at ``address`` with ``scenario``; ``rate`` steps/s (0: flat out).

    Returns the run's record and the (closed) link, whose client holds the
    counters of what was sent and rejected.
    """
    world = World(scenario, np.random.default_rng([seed, 0]))
    link = GrpcLink(
        address,
        scenario.model.drafters,
        model=scenario.model.target,
        engine_id=engine_id,
        max_batch_size=max(256, scenario.batch),
    )
    try:
        link.wait_for_policy(connect_timeout_s)
        engine = SimulatedEngine(world, link, seed=seed)
        started = time.monotonic()
        for i in range(scenario.steps):
            engine.step()
            if rate > 0:
                delay = started + (i + 1) / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if progress is not None and (i + 1) % 500 == 0:
                progress(i + 1)
    finally:
        link.close()
    return engine.record, link
