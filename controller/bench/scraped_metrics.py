"""A process's Prometheus metrics: its ``/metrics`` page scraped, parsed and summed.

vLLM's server and the sidecar both expose their counters as Prometheus text;
the benchmark reads requests running and waiting, tokens generated and engines
connected from them (:mod:`.readings`, :mod:`.vllm_server`,
:mod:`.sidecar_process`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from specctl.bench.processes import http_get


def scrape(url: str, check_alive: Callable[[], None], attempts: int = 3) -> str:
    """GET ``url`` (a ``/metrics`` page) with a generous timeout and a few retries.

    On a loaded two-core machine a process busy learning or restoring state can leave its
    metrics thread without the GIL for seconds; a slow scrape is data, not a failure. A
    process that died raises :class:`~.processes.ProcessError` from ``check_alive`` instead.
    """
    for attempt in range(attempts):
        try:
            return http_get(url, timeout_s=20.0)
        except OSError:
            check_alive()
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def metric_sum(samples: Sequence[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
