"""The sidecar's ingest latency with sharing on and off, side by side.

    .venv/bin/python benchmarks/fleet_ingest.py [--peers 15] [--rate 100] [--seconds 20]
        [--repeats 2]

A real ``specctl serve`` process (the specctl policy) takes reports from one
engine over its gRPC stream at ``--rate`` reports a second (8 steps of 32
request rows each, as benchmarks/sidecar_ingest.py builds them), alternately
without a store and sharing through a redis-server this script runs, where
``--peers`` other members publish evidence of the same model and pool every
second (contributions of a specctl policy that keeps learning, so every merge
changes the posterior). Each run reads the sidecar's own
``specctl_policy_update_latency_seconds`` (report arrival to policy updated)
from /metrics before and after, and prints its p50 and p99, bucket-interpolated,
per mode. The runs alternate (off, on, off, on, ...) so that the machine's
other load falls on both alike. The goal: with sharing on, within 10% of off.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from specctl.arms import arms_for
from specctl.policy.registry import make_policy
from specctl.policy.thompson import SpecctlPolicy
from specctl.protocol.reports import decode_step_report
from specctl.sidecar.fleet_entry import Entry, EntryHeader, encode_entry
from specctl.sidecar.fleet_identity import entry_key
from specctl.testing.redis_server import RedisServer
from specctl.testing.scripted_engine import ScriptedEngine, hello, histogram_quantile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sidecar_ingest import OFFERED, make_report  # noqa: E402

PREFIX = "specctl:bench:"
POOL = "bench"
MODEL = "tiny-llama"  # the scripted engine's hello
LATENCY = "specctl_policy_update_latency_seconds"


class Peers:
    """``count`` other members of the fleet, publishing every second until stopped."""

    def __init__(self, server: RedisServer, count: int) -> None:
        self.server = server
        self.count = count
        self.policy = make_policy("specctl", {})
        assert isinstance(self.policy, SpecctlPolicy)
        self.policy.set_arms(arms_for(OFFERED.items()))
        self.rng = np.random.default_rng(1)
        self.sequence = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with self.server.client() as client:
            while not self._stop.is_set():
                for _ in range(5):  # the peers keep learning: every merge moves something
                    self.sequence += 1
                    report = make_report(self.sequence, 256, self.rng)
                    batch = decode_step_report(
                        report, engine_id="peer", offered=OFFERED, num_load_buckets=4
                    )
                    self.policy.update_params(batch)
                evidence = self.policy.contribution()
                for i in range(self.count):
                    header = EntryHeader(f"peer-{i}", "bench", POOL, MODEL, time.time())
                    client.set(
                        entry_key(PREFIX, POOL, f"peer-{i}"),
                        encode_entry(Entry(header, evidence)),
                        px=10_000,
                    )
                self._stop.wait(1.0)


def latency_buckets(metrics_url: str) -> list[tuple[float, float]]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == LATENCY:
            return sorted(
                (float(s.labels["le"]), s.value)
                for s in family.samples
                if s.name.endswith("_bucket")
            )
    raise RuntimeError(f"{LATENCY} is not on {metrics_url}")


def run_once(
    tmp: Path, server: RedisServer | None, rate: float, seconds: float
) -> tuple[float, float, int]:
    """One sidecar process under load; (p50, p99) of its update latency, reports."""
    port = free_port()
    lines = [
        "[server]",
        f'listen = "unix://{tmp}/sidecar.sock"',
        f'metrics_listen = "127.0.0.1:{port}"',
        "max_reports_per_s = 100000.0",
        "[policy]",
        'name = "specctl"',
        # a round as soon as reports wait: the latency measured is the update path's
        "learn_interval_s = 0.0",
        "[log]",
        'format = "json"',
        'level = "warning"',
    ]
    if server is not None:
        lines += [
            "[fleet]",
            f'url = "{server.url}"',
            f'password_file = "{server.password_file()}"',
            f'key_prefix = "{PREFIX}"',
            f'pool = "{POOL}"',
            'sidecar_id = "measured"',
        ]
    config = tmp / "specctl.toml"
    config.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specctl.cli", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                before = latency_buckets(url)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "no sidecar"
                time.sleep(0.1)
        engine = ScriptedEngine(f"unix://{tmp}/sidecar.sock")
        engine.send(hello("bench", drafters=list(OFFERED.items())))
        engine.recv_policy(timeout=30)
        rng = np.random.default_rng(0)
        count = int(rate * seconds)
        start = time.monotonic()
        for i in range(count):
            engine.send(make_report(i + 1, 256, rng))
            delay = start + (i + 1) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        time.sleep(1.0)
        after = latency_buckets(url)
        engine.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    delta = [(le, a - b) for (le, a), (_, b) in zip(after, before, strict=True)]
    return histogram_quantile(delta, 0.5), histogram_quantile(delta, 0.99), int(delta[-1][1])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--peers", type=int, default=15, help="other members of the fleet")
    parser.add_argument("--rate", type=float, default=100.0, help="reports per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, alternating")
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, int]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="specctl-") as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        peers = Peers(server, args.peers)
        peers.start()
        try:
            for _ in range(args.repeats):
                for mode in ("off", "on"):
                    run_dir = Path(tempfile.mkdtemp(dir=tmp))
                    p50, p99, n = run_once(
                        run_dir, server if mode == "on" else None, args.rate, args.seconds
                    )
                    results[mode].append((p50, p99, n))
                    print(
                        f"  sharing {mode:>3}: p50 {1e3 * p50:6.2f} ms  p99 {1e3 * p99:6.2f} ms"
                        f"  ({n} reports)",
                        file=sys.stderr,
                    )
        finally:
            peers.stop()
            server.stop()
    print(
        f"update latency (arrival to policy updated), {args.rate:g} reports/s of 256 rows, "
        f"{args.peers} peers publishing every second, {args.repeats} x {args.seconds:g} s each:"
    )
    means = {}
    for mode, runs in results.items():
        p50 = float(np.mean([r[0] for r in runs]))
        p99 = float(np.mean([r[1] for r in runs]))
        means[mode] = (p50, p99)
        print(f"  sharing {mode:>3}: p50 {1e3 * p50:6.2f} ms   p99 {1e3 * p99:6.2f} ms")
    for i, name in enumerate(("p50", "p99")):
        print(f"  {name} on / off: {means['on'][i] / means['off'][i]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
