"""What the benchmark measures with: counters read from the sidecar and the engine at an instant.

A segment's goodput is the difference of two readings: the sidecar's
per-class counters (what the engine reported and the sidecar learned) and the
engine's CPU seconds, each read with the clock on both sides, and read once
the sidecar has caught up with the engine (it may learn behind it). vLLM's own
token count is read apart, as a cross-check.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from specctl.bench.scraped_metrics import metric_sum
from specctl.bench.sidecar_process import SidecarProcess
from specctl.bench.vllm_server import VllmServer


@dataclass
class Reading:
    """Counters at one instant: engine CPU seconds, the sidecar's per-class counters and
    the sidecar's own CPU seconds (what the controller costs the machine)."""

    t: float
    engine_cpu_s: float
    worker_cpu_s: float
    arm_rounds: dict[tuple[str, str], float]
    accepted: dict[str, float]
    drafted: dict[str, float]
    # seconds the sidecar's scrape took (the uncertainty of ``t``)
    scrape_s: float = 0.0
    # end (unix time) of the latest engine step the counters include
    learned_until: float = 0.0
    # seconds spent waiting for the sidecar to learn up to the reading's instant
    caught_up_s: float = 0.0
    # the sidecar process's CPU seconds so far (its own process_cpu_seconds_total)
    sidecar_cpu_s: float = 0.0


def read_counters(server: VllmServer, sidecar: SidecarProcess) -> Reading:
    """The sidecar's counters, with the engine's CPU time and the clock read on both
    sides of the scrape: their midpoint is the reading's instant ``t`` (a scrape can
    take a while on a loaded machine)."""
    cpu0, worker0 = server.cpu_seconds()
    t0 = time.monotonic()
    side = sidecar.metrics()
    t1 = time.monotonic()
    cpu1, worker1 = server.cpu_seconds()
    rounds: dict[tuple[str, str], float] = {}
    accepted: dict[str, float] = {}
    drafted: dict[str, float] = {}
    learned_until = 0.0
    sidecar_cpu = 0.0
    for s in side:
        if s.name == "specctl_learned_until_timestamp_seconds":
            learned_until = s.value
        elif s.name == "process_cpu_seconds_total":
            sidecar_cpu = s.value
        c = s.labels.get("workload_class", "")
        if s.name == "specctl_arm_rounds_total":
            key = (c, s.labels.get("arm", ""))
            rounds[key] = rounds.get(key, 0.0) + s.value
        elif s.name == "specctl_accepted_tokens_total":
            accepted[c] = accepted.get(c, 0.0) + s.value
        elif s.name == "specctl_draft_tokens_total":
            drafted[c] = drafted.get(c, 0.0) + s.value
    return Reading(
        t=(t0 + t1) / 2,
        engine_cpu_s=(cpu0 + cpu1) / 2,
        worker_cpu_s=(worker0 + worker1) / 2,
        arm_rounds=rounds,
        accepted=accepted,
        drafted=drafted,
        scrape_s=t1 - t0,
        learned_until=learned_until,
        sidecar_cpu_s=sidecar_cpu,
    )


def read_caught_up(
    server: VllmServer, sidecar: SidecarProcess, target_unix_s: float, timeout_s: float = 15.0
) -> Reading:
    """:func:`read_counters` once the sidecar has learned every step up to ``target_unix_s``.

    The sidecar's counters are what it has learned, and a sidecar that is busy
    (a restart restoring its state, a burst of reports) learns behind the engine:
    read at a clock instant, they would hold less than the engine did by then. The
    engine's CPU clock is read at the target instant, the counters once caught up.
    """
    first = read_counters(server, sidecar)
    reading = first
    deadline = time.monotonic() + timeout_s
    while reading.learned_until < target_unix_s and time.monotonic() < deadline:
        time.sleep(0.05)
        reading = read_counters(server, sidecar)
    return dataclasses.replace(
        reading,
        t=first.t,
        engine_cpu_s=first.engine_cpu_s,
        worker_cpu_s=first.worker_cpu_s,
        sidecar_cpu_s=first.sidecar_cpu_s,
        caught_up_s=reading.t - first.t,
    )


def vllm_tokens(server: VllmServer) -> tuple[float, float]:
    """vLLM's own count of generated tokens and the instant it was read (the middle of
    the scrape): a cross-check, read off the measurement's path (its scrape goes
    through the busy API server and can take seconds, so it is compared as a rate over
    its own interval)."""
    t0 = time.monotonic()
    value = metric_sum(server.metrics(), "vllm:generation_tokens_total")
    return value, (t0 + time.monotonic()) / 2
