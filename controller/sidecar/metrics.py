"""The sidecar's Prometheus metrics, on a registry of their own.

A dedicated :class:`CollectorRegistry` per server lets several sidecars run
in one process (tests, the simulator). Names are a contract with the alert
rules and dashboards: change them only together. Class labels are bounded by
``policy.max_classes`` (the book folds the rest into the default class).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from specctl import __version__
from specctl.sidecar.stability import DecisionStability

# Report arrival to policy updated: the static policy takes tens of microseconds.
LATENCY_BUCKETS = (
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    0.1,
    1.0,
)


class ReportCounter:
    """A labelled counter the report path adds to without prometheus_client's per-call cost.

    Values live in a dict keyed by label values and are exported at scrape
    time. Only the event loop adds; a scrape copies the items (atomic under the
    GIL), so a scrape never sees a torn value.
    """

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def add(self, labels: tuple[str, ...], amount: float) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def describe(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> list[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in list(self.values.items()):
            family.add_metric(labels, value)
        return [family]


StabilitySource = Callable[[], Iterable[tuple[tuple[str, int], DecisionStability]]]


class DecisionStabilityExporter:
    """Exports the book's per-context stability trackers, read at scrape time.

    The trackers are plain stats objects the book updates as it publishes;
    this collector turns them into series (as vLLM's ``SpecDecodingProm``
    reads ``SpecDecodingStats``), so the publish path pays nothing for
    Prometheus. A scrape reads attributes the event loop writes one at a time:
    a scrape may see a change counted before its TV is added, never a torn
    number.
    """

    _LABELS = ("workload_class", "load_bucket")

    def __init__(self, registry: CollectorRegistry) -> None:
        self._source: StabilitySource = lambda: ()
        self._clock: Callable[[], float] = time.time
        registry.register(self)

    def watch(self, source: StabilitySource, clock: Callable[[], float]) -> None:
        """Export what ``source()`` yields, timing dwell with ``clock`` (the book's)."""
        self._source = source
        self._clock = clock

    def _families(self) -> list[Any]:
        ctx = self._LABELS
        return [
            CounterMetricFamily(
                "specctl_decision_mode_flips",
                "Times the context's mode (the arm clearly most likely) changed.",
                labels=ctx,
            ),
            CounterMetricFamily(
                "specctl_decision_changes",
                "Published distributions of the context that differed from the previous one.",
                labels=ctx,
            ),
            CounterMetricFamily(
                "specctl_decision_change_tv",
                "Sum of the total-variation distances between successive published "
                "distributions of the context.",
                labels=ctx,
            ),
            GaugeMetricFamily(
                "specctl_decision_mode_dwell_seconds",
                "Seconds since the context's mode last changed (or since it appeared).",
                labels=ctx,
            ),
        ]

    def describe(self) -> list[Any]:
        return self._families()

    def collect(self) -> list[Any]:
        families = self._families()
        flips, changes, tv, dwell = families
        now = self._clock()
        for (cls, bucket), tracker in self._source():
            labels = [cls, str(bucket)]
            flips.add_metric(labels, tracker.mode_flips_total)
            changes.add_metric(labels, tracker.changes_total)
            tv.add_metric(labels, tracker.change_tv_total)
            dwell.add_metric(labels, tracker.dwell_s(now))
        return families


class SidecarMetrics:
    """Every metric the sidecar exports (``specctl_*``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.reports_received = Counter(
            "specctl_reports_received", "Step reports received from engines.", registry=r
        )
        self.reports_rejected = Counter(
            "specctl_reports_rejected",
            "Step reports (and other engine messages) rejected, by reason.",
            ["reason"],
            registry=r,
        )
        self.internal_errors = Counter(
            "specctl_internal_errors",
            "Exceptions raised by the policy or a report sink, by where: policy_update, "
            "policy_select, sink. A bug: the published distribution is kept and the "
            "report still reaches the other sinks.",
            ["where"],
            registry=r,
        )
        self.reports_dropped = Counter(
            "specctl_reports_dropped",
            "Step reports lost before reaching the sidecar: drops the engines reported "
            "plus gaps in report sequence numbers.",
            registry=r,
        )
        cd = ["workload_class", "drafter"]
        self.request_rounds = ReportCounter(
            "specctl_request_rounds",
            "Speculative request-rounds (one request in one step with a drafter).",
            cd,
            registry=r,
        )
        self.draft_tokens = ReportCounter(
            "specctl_draft_tokens", "Draft tokens verified by the target.", cd, registry=r
        )
        self.accepted_tokens = ReportCounter(
            "specctl_accepted_tokens", "Draft tokens accepted by the target.", cd, registry=r
        )
        self.accepted_tokens_per_position = ReportCounter(
            "specctl_accepted_tokens_per_position",
            "Request-rounds that accepted at least `position` draft tokens.",
            [*cd, "position"],
            registry=r,
        )
        self.arm_rounds = ReportCounter(
            "specctl_arm_rounds",
            "Request-rounds by the arm the engine applied (off included).",
            ["workload_class", "arm"],
            registry=r,
        )
        ctx = ["workload_class", "load_bucket"]
        self.arm_probability = Gauge(
            "specctl_arm_probability",
            "Probability of each arm in the current policy.",
            [*ctx, "arm"],
            registry=r,
        )
        self.chosen_arm_goodput = Gauge(
            "specctl_chosen_arm_goodput_tokens_per_second",
            "Estimated goodput of the most likely arm (committed tokens per second).",
            ctx,
            registry=r,
        )
        self.no_spec_goodput = Gauge(
            "specctl_no_spec_goodput_tokens_per_second",
            "Estimated goodput without speculation (committed tokens per second).",
            ctx,
            registry=r,
        )
        self.speculation_off = Gauge(
            "specctl_speculation_off",
            "1 when the most likely arm of the context is off.",
            ctx,
            registry=r,
        )
        self.decision_stability = DecisionStabilityExporter(r)
        self.switch_offs = Counter(
            "specctl_switch_offs",
            "Times a context's most likely arm changed from a drafter to off.",
            ["workload_class"],
            registry=r,
        )
        self.probe_rounds = ReportCounter(
            "specctl_probe_rounds",
            "Speculative request-rounds applied while the context's most likely arm is off.",
            ["workload_class"],
            registry=r,
        )
        self.learned_until = Gauge(
            "specctl_learned_until_timestamp_seconds",
            "End (unix time) of the latest engine step the policy has learned from: how far "
            "behind the engines the sidecar is, and the instant its counters speak for.",
            registry=r,
        )
        self.engines_connected = Gauge(
            "specctl_engines_connected", "Engines with an open stream.", registry=r
        )
        self.engines_in_fallback = Gauge(
            "specctl_engines_in_fallback",
            "Connected engines that report running their fallback arm.",
            registry=r,
        )
        self.decision_age = Gauge(
            "specctl_decision_age_seconds",
            "Largest policy age reported by the connected engines.",
            registry=r,
        )
        self.policy_version = Gauge(
            "specctl_policy_version", "Version of the current policy.", registry=r
        )
        self.policy_pushes = Counter(
            "specctl_policy_pushes", "Policies sent to engines.", registry=r
        )
        self.policy_update_latency = Histogram(
            "specctl_policy_update_latency_seconds",
            "From a report's arrival to the policy updated with it.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.classes = Gauge(
            "specctl_classes", "Workload classes the policy keeps apart.", registry=r
        )
        self.class_overflow = Counter(
            "specctl_class_overflow",
            "Request rows whose class was folded into the default class (max_classes reached).",
            registry=r,
        )
        self.build_info = Gauge(
            "specctl_build_info", "The running specctl version.", ["version"], registry=r
        )
        self.build_info.labels(version=__version__).set(1)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def exposition(self) -> CollectorRegistry:
        """What /metrics serves: these metrics (the state keeper's and the decision
        log's among them), plus the process-wide default registry (process and Python
        runtime metrics)."""
        exposed = CollectorRegistry()
        exposed.register(self.registry)
        exposed.register(REGISTRY)
        return exposed

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: the report path calls this per class and arm."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def remove(self, metric: Any, *labels: str) -> None:
        """Drop a labelled series (e.g. an arm no longer in a distribution)."""
        if self._children.pop((id(metric), labels), None) is not None:
            metric.remove(*labels)
