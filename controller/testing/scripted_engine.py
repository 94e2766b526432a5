"""A scripted engine that talks to a real sidecar over gRPC, and a /metrics scraper."""

from __future__ import annotations

import queue
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence

import grpc
from prometheus_client.parser import text_string_to_metric_families

from specctl.api import pb, pb_grpc
from specctl.protocol.reports import encode_step_report
from specctl.steps import StepRecord


def scrape(metrics_url: str) -> dict[str, float]:
    """Every sample on /metrics, keyed like ``name{label="value",...}`` (labels sorted)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """The ``q`` quantile of a histogram's cumulative (upper bound, count) buckets, sorted by
    bound, interpolated within its bucket as Prometheus's ``histogram_quantile`` does (NaN
    when nothing was observed).

    The sidecar's latencies are histograms: a benchmark reads their quantiles from two
    scrapes rather than from samples of its own.
    """
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return float("nan")
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            span = count - prev_count
            return prev_bound + (bound - prev_bound) * ((rank - prev_count) / span if span else 0)
        prev_bound, prev_count = bound, count
    return prev_bound


def hello(
    engine_id: str = "engine-1",
    drafters: Sequence[tuple[str, int]] = (("ngram", 4),),
    fallback_arm: str = "off",
) -> pb.EngineMessage:
    return pb.EngineMessage(
        hello=pb.Hello(
            engine_id=engine_id,
            model="tiny-llama",
            vllm_version="0.32.0",
            drafters=[pb.Drafter(method=m, max_k=k) for m, k in drafters],
            max_batch_size=64,
            fallback_arm=fallback_arm,
            specctl_version="0.1.0",
        )
    )


def report(
    sequence: int,
    *,
    workload_class: str = "chat",
    arms: Sequence[str] = ("ngram/k=4", "off"),
    drafted: Sequence[int] = (4, 0),
    accepted: Sequence[int] = (3, 0),
    step_time_s: float = 0.02,
    load_bucket: int = 0,
    policy_version: int = 1,
) -> pb.StepReport:
    """One step with one request row per arm."""
    n = len(arms)
    step = StepRecord(
        step_index=sequence,
        step_time_s=step_time_s,
        batch_size=n,
        num_scheduled_tokens=min(n + sum(drafted), 2**32 - 1),
        policy_version=policy_version,
        load_bucket=load_bucket,
        step_end_unix_s=time.time(),
        classes=[workload_class] * n,
        arms=list(arms),
        propensity=[1.0] * n,
        drafted=list(drafted),
        accepted=list(accepted),
    )
    return encode_step_report(sequence, [step])


class ScriptedEngine:
    """A Connect stream driven by the test: ``send`` messages, ``recv`` what the sidecar pushes.

    Responses are read on a background thread so ``recv`` can time out.
    """

    _END = object()

    def __init__(self, address: str, *, options: Sequence[tuple[str, int]] = ()) -> None:
        self.channel = grpc.insecure_channel(address, options=list(options))
        self.stub = pb_grpc.SpecControllerStub(self.channel)
        self._out: queue.Queue[object] = queue.Queue()
        self._in: queue.Queue[object] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.call = self.stub.Connect(self._requests())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[pb.EngineMessage]:
        while True:
            item = self._out.get()
            if item is self._END:
                return
            assert isinstance(item, pb.EngineMessage)
            yield item

    def _read(self) -> None:
        try:
            for message in self.call:
                self._in.put(message)
        except grpc.RpcError as exc:
            self.error = exc
        self._in.put(self._END)

    def send(self, message: pb.EngineMessage | pb.StepReport | pb.EngineStatus) -> None:
        if isinstance(message, pb.StepReport):
            message = pb.EngineMessage(report=message)
        elif isinstance(message, pb.EngineStatus):
            message = pb.EngineMessage(status=message)
        self._out.put(message)

    def recv(self, timeout: float = 10.0) -> pb.ControllerMessage | None:
        """The next pushed message; None when the stream ended (see ``error``)."""
        item = self._in.get(timeout=timeout)
        if item is self._END:
            self._in.put(self._END)
            return None
        assert isinstance(item, pb.ControllerMessage)
        return item

    def recv_policy(self, timeout: float = 10.0, min_version: int = 0) -> pb.Policy:
        """The next pushed policy with at least ``min_version`` (rejections skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.recv(max(0.01, deadline - time.monotonic()))
            assert message is not None, f"stream ended: {self.error}"
            if message.WhichOneof("kind") == "policy" and message.policy.version >= min_version:
                return message.policy

    def recv_rejection(self, timeout: float = 10.0) -> pb.ReportRejected:
        deadline = time.monotonic() + timeout
        while True:
            message = self.recv(max(0.01, deadline - time.monotonic()))
            assert message is not None, f"stream ended: {self.error}"
            if message.WhichOneof("kind") == "rejected":
                return message.rejected

    def wait_closed(self, timeout: float = 10.0) -> grpc.RpcError | None:
        """Wait for the stream to end; the error it ended with, if any."""
        self._reader.join(timeout)
        assert not self._reader.is_alive(), "stream still open"
        return self.error

    def close(self) -> None:
        self._out.put(self._END)
        self.call.cancel()
        self.channel.close()


def reports_learned(metrics_url: str) -> float:
    """How many reports the sidecar has learned from (not merely received): each
    learned report observes one update latency. Learning comes in rounds, up to
    ``policy.learn_interval_s`` after a report arrives, so a caller about to read
    what was learned waits on this count."""
    return scrape(metrics_url).get("specctl_policy_update_latency_seconds_count", 0.0)


def wait_for(predicate: object, timeout: float = 10.0, interval: float = 0.05) -> None:
    """Poll ``predicate()`` until true; fail with what it was waiting for."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {predicate}"
        time.sleep(interval)
