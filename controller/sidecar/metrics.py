"""The sidecar's Prometheus metrics, on a registry of their own.

A dedicated :class:`CollectorRegistry` per server lets several sidecars run
in one process (tests, the simulator). The server's own counters (reports
received and rejected, engines, pushes) are prometheus_client metrics; what
the :class:`~specctl.sidecar.book.PolicyBook` learns and publishes it counts in
a plain :class:`~specctl.sidecar.book_stats.BookStats`, which
:class:`BookStatsExporter` turns into series at scrape time (as vLLM's
``SpecDecodingProm`` reads ``SpecDecodingStats``), so the report path pays
nothing for Prometheus. Names are a contract with the alert rules and
dashboards: change them only together. Class labels are bounded by
``policy.max_classes`` (the book folds the rest into the default class).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from specctl import __version__
from specctl.sidecar.book_stats import BookStats
from specctl.sidecar.stability import DecisionStability

if TYPE_CHECKING:
    from specctl.sidecar.book import PolicyBook

# Report arrival to policy updated: the static policy takes tens of microseconds, and a
# report that arrives within policy.learn_interval_s of a round waits for the next.
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
    0.25,
    0.5,
    1.0,
)


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


class BookStatsExporter:
    """Exports a book's :class:`BookStats`, read at scrape time from the scrape's thread.

    Dicts are copied before they are read; the book replaces values whole, so a
    scrape may see one context's change before another's, never a torn value.
    """

    _CLASS_DRAFTER = ("workload_class", "drafter")
    _CONTEXT = ("workload_class", "load_bucket")

    def __init__(self, registry: CollectorRegistry) -> None:
        self._stats = BookStats()
        registry.register(self)

    def watch(self, stats: BookStats) -> None:
        self._stats = stats

    def _families(self) -> dict[str, Any]:
        cd, ctx = self._CLASS_DRAFTER, self._CONTEXT
        counter, gauge = CounterMetricFamily, GaugeMetricFamily
        return {
            "request_rounds": counter(
                "specctl_request_rounds",
                "Speculative request-rounds (one request in one step with a drafter).",
                labels=cd,
            ),
            "draft_tokens": counter(
                "specctl_draft_tokens", "Draft tokens verified by the target.", labels=cd
            ),
            "accepted_tokens": counter(
                "specctl_accepted_tokens", "Draft tokens accepted by the target.", labels=cd
            ),
            "accepted_at_least": counter(
                "specctl_accepted_tokens_per_position",
                "Request-rounds that accepted at least `position` draft tokens.",
                labels=(*cd, "position"),
            ),
            "arm_rounds": counter(
                "specctl_arm_rounds",
                "Request-rounds by the arm the engine applied (off included).",
                labels=("workload_class", "arm"),
            ),
            "arm_probability": gauge(
                "specctl_arm_probability",
                "Probability of each arm in the current policy.",
                labels=(*ctx, "arm"),
            ),
            "chosen_arm_goodput": gauge(
                "specctl_chosen_arm_goodput_tokens_per_second",
                "Estimated goodput of the most likely arm (committed tokens per second).",
                labels=ctx,
            ),
            "no_spec_goodput": gauge(
                "specctl_no_spec_goodput_tokens_per_second",
                "Estimated goodput without speculation (committed tokens per second).",
                labels=ctx,
            ),
            "speculation_off": gauge(
                "specctl_speculation_off",
                "1 when the most likely arm of the context is off.",
                labels=ctx,
            ),
            "switch_offs": counter(
                "specctl_switch_offs",
                "Times a context's most likely arm changed from a drafter to off.",
                labels=("workload_class",),
            ),
            "probe_rounds": counter(
                "specctl_probe_rounds",
                "Speculative request-rounds applied while the context's most likely arm is off.",
                labels=("workload_class",),
            ),
            "internal_errors": counter(
                "specctl_internal_errors",
                "Exceptions raised by the policy, a report sink or the fleet's task, by where: "
                "policy_update, policy_select, policy_merge, sink, fleet. A bug: the published "
                "distribution is kept and the report still reaches the other sinks.",
                labels=("where",),
            ),
            "learned_until": gauge(
                "specctl_learned_until_timestamp_seconds",
                "End (unix time) of the latest engine step the policy has learned from: how "
                "far behind the engines the sidecar is, and the instant its counters speak for.",
            ),
            "policy_version": gauge("specctl_policy_version", "Version of the current policy."),
            "classes": gauge("specctl_classes", "Workload classes the policy keeps apart."),
            "class_overflow": counter(
                "specctl_class_overflow",
                "Request rows whose class was folded into the default class (max_classes reached).",
            ),
        }

    def describe(self) -> list[Any]:
        return list(self._families().values())

    def collect(self) -> list[Any]:
        f = self._families()
        st = self._stats
        for name in ("request_rounds", "draft_tokens", "accepted_tokens", "arm_rounds"):
            for labels, value in list(getattr(st, name).items()):
                f[name].add_metric(labels, value)
        for (cls, drafter, position), value in list(st.accepted_at_least.items()):
            f["accepted_at_least"].add_metric((cls, drafter, str(position)), value)
        for name in ("switch_offs", "probe_rounds"):
            for cls, value in list(getattr(st, name).items()):
                f[name].add_metric((cls,), value)
        for where, value in list(st.internal_errors.items()):
            f["internal_errors"].add_metric((where,), value)
        for (cls, bucket), arms in list(st.arm_probability.items()):
            for arm, p in arms.items():
                f["arm_probability"].add_metric((cls, str(bucket), arm), p)
        for (cls, bucket), off in list(st.speculation_off.items()):
            f["speculation_off"].add_metric((cls, str(bucket)), 1.0 if off else 0.0)
        for name in ("chosen_arm_goodput", "no_spec_goodput"):
            for (cls, bucket), value in list(getattr(st, name).items()):
                f[name].add_metric((cls, str(bucket)), value)
        f["learned_until"].add_metric((), st.learned_until_unix_s)
        f["policy_version"].add_metric((), st.policy_version)
        f["classes"].add_metric((), st.classes)
        f["class_overflow"].add_metric((), st.class_overflow_rows)
        return list(f.values())


class SidecarMetrics:
    """Every metric the sidecar exports (``specctl_*``): the server's, and its book's."""

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
        self.reports_dropped = Counter(
            "specctl_reports_dropped",
            "Step reports lost before reaching the sidecar: drops the engines reported "
            "plus gaps in report sequence numbers.",
            registry=r,
        )
        self.book = BookStatsExporter(r)
        self.decision_stability = DecisionStabilityExporter(r)
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
        self.policy_pushes = Counter(
            "specctl_policy_pushes", "Policies sent to engines.", registry=r
        )
        self.learning_rounds = Counter(
            "specctl_learning_rounds",
            "Policy updates; each learns every report that arrived since the previous one.",
            registry=r,
        )
        self.policy_update_latency = Histogram(
            "specctl_policy_update_latency_seconds",
            "From a report's arrival to the policy updated with it.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.build_info = Gauge(
            "specctl_build_info", "The running specctl version.", ["version"], registry=r
        )
        self.build_info.labels(version=__version__).set(1)

    def watch(self, book: PolicyBook) -> None:
        """Export what ``book`` counts and how its published decisions move."""
        self.book.watch(book.stats)
        self.decision_stability.watch(book.stability_trackers, book.clock)

    def exposition(self) -> CollectorRegistry:
        """What /metrics serves: these metrics (the state keeper's and the decision
        log's among them), plus the process-wide default registry (process and Python
        runtime metrics)."""
        exposed = CollectorRegistry()
        exposed.register(self.registry)
        exposed.register(REGISTRY)
        return exposed
