"""The sidecar over its real gRPC stream: reports per second sustained, and update latency.

One engine on a unix socket sends N reports of R request rows as fast as gRPC
takes them; the script waits until the sidecar has counted them all and prints
the rate, then the sidecar's own specctl_policy_update_latency_seconds (report
arrival to policy updated) as bucket-interpolated p50/p99, and the time from
sending a report with a new class to receiving the policy that includes it
(bounded below by policy.min_push_interval_s when a push just happened).

    .venv/bin/python benchmarks/sidecar_grpc.py [--rows 256] [--reports 2000] [--policy static]
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from specctl.sidecar.config import load_config
from specctl.testing.scripted_engine import ScriptedEngine, hello, histogram_quantile, report
from specctl.testing.sidecar_thread import SidecarThread

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sidecar_ingest import make_report  # noqa: E402


def scrape(url: str) -> dict[str, list]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--reports", type=int, default=2000)
    parser.add_argument("--policy", default="static")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    reports = [make_report(i + 1, args.rows, rng) for i in range(args.reports)]
    with tempfile.TemporaryDirectory(prefix="specctl-") as tmp:
        overrides = {
            "server.listen": f"unix://{tmp}/sidecar.sock",
            "server.metrics_listen": "127.0.0.1:0",
            "server.max_reports_per_s": 1e6,
            "policy.name": args.policy,
        }
        config = load_config(env={}, overrides=overrides)
        with SidecarThread(config) as sc:
            engine = ScriptedEngine(sc.address)
            engine.send(hello("bench", drafters=[("ngram", 4)]))
            first = engine.recv_policy()
            t0 = time.perf_counter()
            for message in reports:
                engine.send(message)
            deadline = time.monotonic() + 600
            while True:
                received = scrape(sc.metrics_url)["specctl_reports_received"][0].value
                if received >= args.reports or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            elapsed = time.perf_counter() - t0
            samples = scrape(sc.metrics_url)["specctl_policy_update_latency_seconds"]
            buckets = [
                (float(s.labels["le"]), s.value) for s in samples if s.name.endswith("_bucket")
            ]
            rejected = scrape(sc.metrics_url).get("specctl_reports_rejected", [])

            time.sleep(1.0)  # let any pending push go out first
            latest = first.version
            with contextlib.suppress(queue.Empty):
                while (m := engine.recv(timeout=0.2)) is not None:
                    if m.WhichOneof("kind") == "policy":
                        latest = max(latest, m.policy.version)
            t1 = time.perf_counter()
            engine.send(report(args.reports + 1, workload_class="brand-new"))
            pushed = engine.recv_policy(min_version=latest + 1)
            push_latency = time.perf_counter() - t1
            assert "brand-new" in {e.workload_class for e in pushed.entries}
            engine.close()

    print(f"policy {args.policy}, {args.rows} request rows per report, {args.reports} reports")
    print(f"  sustained: {args.reports / elapsed:8.0f} reports/s ({elapsed:.2f} s)")
    print(
        "  update latency (arrival -> policy updated): "
        f"p50 {histogram_quantile(buckets, 0.5) * 1e6:7.0f} us, "
        f"p99 {histogram_quantile(buckets, 0.99) * 1e6:7.0f} us"
    )
    print(f"  new class -> pushed policy: {push_latency * 1e3:.1f} ms")
    print(f"  rejected: {sum(s.value for s in rejected if s.name.endswith('_total')):.0f}")


if __name__ == "__main__":
    main()
