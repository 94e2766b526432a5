"""Load on one sidecar: many simulated engines streaming step reports over loopback.

The sidecar runs as ``specctl serve`` (specctl policy, snapshots and the
decision log on, as in production) pinned to CPU 0; the engines are asyncio
gRPC clients in separate processes pinned to the other CPUs. Each engine
holds one Connect stream and sends a report of ``--rows`` request rows every
``1/--rate`` seconds (reports are serialised once and re-sequenced, so the
clients spend their time on gRPC, not protobuf).

Measured and printed:
- sustained report rate (sent by the engines, received and rejected by the sidecar)
- report arrival -> policy updated, p50/p99, from the sidecar's
  ``specctl_policy_update_latency_seconds`` histogram (interpolated in its buckets)
- decision age at the engines: policy issue -> arrival at the engine (push delay),
  and the age of the policy an engine holds when it sends a report
- the sidecar's CPU (% of one core) and resident memory, every second
- then a ramp of the per-engine rate, to find where the sidecar stops keeping up
  (received < 99% of offered, or p99 above 5 ms)

    .venv/bin/python benchmarks/load_sidecar.py                   # 64 x 50/s x 256 rows, 60 s
    .venv/bin/python benchmarks/load_sidecar.py --duration 10 --ramp 100 200 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specctl.testing.scripted_engine import histogram_quantile, scrape

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidecar_ingest import make_report

ROOT = Path(__file__).resolve().parents[1]
CONNECT = "/specctl.v1.SpecController/Connect"
CLK = os.sysconf("SC_CLK_TCK")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def report_frame(template: bytes, sequence: int) -> bytes:
    """EngineMessage{report = template + sequence}: field 1 prepended, protobuf merges it."""
    payload = b"\x08" + _varint(sequence) + template
    return b"\x12" + _varint(len(payload)) + payload


# ------------------------------------------------------------------ engines (client processes)


async def _engine(
    address: str, engine_id: str, rate: float, duration: float, templates: list[bytes], out: dict
) -> None:
    import grpc

    from specctl.api import pb

    hello = pb.EngineMessage(
        hello=pb.Hello(
            engine_id=engine_id,
            model="load",
            drafters=[pb.Drafter(method="ngram", max_k=4)],
            fallback_arm="off",
            max_batch_size=256,
        )
    ).SerializeToString()
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(CONNECT, request_serializer=None, response_deserializer=None)()
        held_issued: list[float] = []

        async def read() -> None:
            try:
                async for raw in call:
                    msg = pb.ControllerMessage.FromString(raw)
                    if msg.WhichOneof("kind") == "policy":
                        now = time.time()
                        out["push_delay"].append(now - msg.policy.issued_unix_s)
                        held_issued[:] = [msg.policy.issued_unix_s]
                    else:
                        out["rejected_seen"] += 1
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:
                    out["errors"].append(exc.code().name)

        reader = asyncio.create_task(read())
        await call.write(hello)
        start = time.monotonic()
        next_at = start
        seq = 0
        while True:
            now = time.monotonic()
            if now - start >= duration:
                break
            if next_at > now:
                await asyncio.sleep(next_at - now)
            seq += 1
            try:
                await call.write(report_frame(templates[seq % len(templates)], seq))
            except asyncio.InvalidStateError:
                out["errors"].append(f"stream ended by the sidecar: {call.code()}")
                break
            out["sent"] += 1
            if held_issued:
                out["held_age"].append(time.time() - held_issued[0])
            next_at += 1.0 / rate
        out["late_s"] = max(out["late_s"], time.monotonic() - next_at)
        await call.done_writing()
        # the sidecar ends the stream once it has read everything that was sent
        try:
            await asyncio.wait_for(reader, 30)
        except TimeoutError:
            out["errors"].append("stream not ended 30 s after the last report")


def _client_process(
    address: str, ids: list[str], rate: float, duration: float, rows: int, queue: mp.Queue
) -> None:
    rng = np.random.default_rng(len(ids))
    templates = []
    for _ in range(16):
        r = make_report(1, rows, rng)
        r.ClearField("sequence")
        templates.append(r.SerializeToString())
    out = {
        "sent": 0,
        "rejected_seen": 0,
        "push_delay": [],
        "held_age": [],
        "errors": [],
        "late_s": 0.0,
    }

    async def main() -> None:
        await asyncio.gather(*(_engine(address, e, rate, duration, templates, out) for e in ids))

    asyncio.run(main())
    queue.put(out)


# ------------------------------------------------------------------ the sidecar process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quantile_between(before: dict, after: dict, name: str, q: float) -> float:
    """The ``q`` quantile of histogram ``name``'s observations between two scrapes."""
    buckets = []
    for key, value in after.items():
        if key.startswith(f"{name}_bucket{{"):
            le = key.split('le="')[1].rstrip('"}')
            bound = float("inf") if le == "+Inf" else float(le)
            buckets.append((bound, value - before.get(key, 0.0)))
    return histogram_quantile(sorted(buckets), q)


def proc_sample(pid: int) -> tuple[float, float]:
    """(CPU seconds used so far, resident MiB)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    return cpu, rss


class SidecarProcess:
    def __init__(
        self, tmp: Path, max_reports_per_s: float, state: bool, learn_interval_s: float
    ) -> None:
        self.address = f"unix://{tmp}/sidecar.sock"
        port = _free_port()
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        config = tmp / "specctl.toml"
        text = (
            f'[policy]\nname = "specctl"\nlearn_interval_s = {learn_interval_s}\n'
            f"[server]\nmax_reports_per_s = {max_reports_per_s}\nmax_engines = 1024\n"
        )
        if state:
            text += f'[state]\ndir = "{tmp}/state"\nsnapshot_interval_s = 10.0\n'
        config.write_text(text)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specctl.cli", "serve", "--config", str(config),
             "--listen", self.address, "--metrics-listen", f"127.0.0.1:{port}",
             "--log-format", "json", "--log-level", "warning"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(tmp / "sidecar.log").open("wb"),
        )  # fmt: skip
        self.log_path = tmp / "sidecar.log"
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(self.metrics_url)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the sidecar did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        errors = [
            line
            for line in self.log_path.read_text(errors="replace").splitlines()
            if '"level": "error"' in line or '"level": "warning"' in line
        ]
        if errors:
            print(f"sidecar warnings and errors ({len(errors)}):", *errors[:10], sep="\n  ")


# ------------------------------------------------------------------ one run


def run_load(
    sidecar: SidecarProcess,
    *,
    engines: int,
    rate: float,
    rows: int,
    duration: float,
    client_procs: int,
    client_cpus: set[int],
    label: str,
) -> dict:
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    ids = [f"{label}-engine-{i}" for i in range(engines)]
    procs = []
    for p in range(client_procs):
        proc = ctx.Process(
            target=_client_process,
            args=(sidecar.address, ids[p::client_procs], rate, duration, rows, queue),
        )
        proc.start()
        if client_cpus:
            os.sched_setaffinity(proc.pid, client_cpus)
        procs.append(proc)
    before = scrape(sidecar.metrics_url)
    cpu0, _ = proc_sample(sidecar.proc.pid)
    t0 = time.monotonic()
    timeline = []
    last_cpu, last_t = cpu0, t0
    last_received = before.get("specctl_reports_received_total", 0.0)
    results = []
    while len(results) < client_procs:
        time.sleep(1.0)
        now = time.monotonic()
        cpu, rss = proc_sample(sidecar.proc.pid)
        received = scrape(sidecar.metrics_url).get("specctl_reports_received_total", 0.0)
        timeline.append(
            {
                "t_s": round(now - t0, 1),
                "received_per_s": round((received - last_received) / (now - last_t), 1),
                "cpu_percent": round(100 * (cpu - last_cpu) / (now - last_t), 1),
                "rss_mib": round(rss, 1),
            }
        )
        last_cpu, last_t, last_received = cpu, now, received
        while not queue.empty():
            results.append(queue.get())
        if now - t0 > duration + 60:
            break
    for proc in procs:
        proc.join(30)
    time.sleep(0.5)
    after = scrape(sidecar.metrics_url)
    elapsed = time.monotonic() - t0
    sent = sum(r["sent"] for r in results)
    received = after["specctl_reports_received_total"] - before.get(
        "specctl_reports_received_total", 0.0
    )
    rejected = sum(
        v - before.get(k, 0.0)
        for k, v in after.items()
        if k.startswith("specctl_reports_rejected_total")
    )
    push = [x for r in results for x in r["push_delay"]]
    held = [x for r in results for x in r["held_age"]]
    steady = [s for s in timeline if 2 <= s["t_s"] <= duration]
    name = "specctl_policy_update_latency_seconds"
    return {
        "label": label,
        "engines": engines,
        "rate_per_engine": rate,
        "rows": rows,
        "duration_s": duration,
        "offered_per_s": engines * rate,
        "sent": sent,
        "sent_per_s": round(sent / duration, 1),
        "received": int(received),
        "received_per_s": round(received / duration, 1),
        "rejected": int(rejected),
        "not_received": int(sent - received),
        "update_p50_ms": round(1e3 * quantile_between(before, after, name, 0.5), 3),
        "update_p99_ms": round(1e3 * quantile_between(before, after, name, 0.99), 3),
        "push_delay_p50_ms": round(1e3 * statistics.median(push), 2) if push else None,
        "push_delay_p99_ms": round(1e3 * float(np.quantile(push, 0.99)), 2) if push else None,
        "held_policy_age_p50_s": round(statistics.median(held), 2) if held else None,
        "held_policy_age_max_s": round(max(held), 2) if held else None,
        "client_errors": [e for r in results for e in r["errors"]],
        "clients_late_s": round(max((r["late_s"] for r in results), default=0.0), 3),
        "sidecar_cpu_percent_mean": round(
            statistics.mean(s["cpu_percent"] for s in steady), 1
        ) if steady else None,
        "rss_mib_start_end": (
            [timeline[0]["rss_mib"], timeline[-1]["rss_mib"]] if timeline else None
        ),
        "elapsed_s": round(elapsed, 1),
        "timeline": timeline,
    }  # fmt: skip


def summary(r: dict) -> str:
    return (
        f"{r['label']}: {r['engines']} engines x {r['rate_per_engine']:g}/s x {r['rows']} rows: "
        f"offered {r['offered_per_s']:g}/s, sent {r['sent_per_s']:g}/s, "
        f"received {r['received_per_s']:g}/s, rejected {r['rejected']}, "
        f"not received {r['not_received']}; update p50 {r['update_p50_ms']} ms, "
        f"p99 {r['update_p99_ms']} ms; push delay p50 {r['push_delay_p50_ms']} ms "
        f"p99 {r['push_delay_p99_ms']} ms; held policy age p50 {r['held_policy_age_p50_s']} s; "
        f"sidecar CPU {r['sidecar_cpu_percent_mean']}% of a core; "
        f"RSS {r['rss_mib_start_end']} MiB; clients late by {r['clients_late_s']} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=64)
    parser.add_argument("--rate", type=float, default=50.0, help="reports per second per engine")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument(
        "--ramp", type=float, nargs="*", default=[100, 200, 400],
        help="per-engine rates to try after the main run (empty: none)",
    )  # fmt: skip
    parser.add_argument("--ramp-duration", type=float, default=15.0)
    parser.add_argument("--no-state", action="store_true", help="no snapshots or decision log")
    parser.add_argument(
        "--learn-interval-s",
        type=float,
        default=0.0,
        help="the sidecar's policy.learn_interval_s (0: a round as soon as reports wait, "
        "so the latency measured is the update path's; production default 0.5)",
    )
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    cpus = sorted(os.sched_getaffinity(0))
    sidecar_cpus = {cpus[0]}
    client_cpus = set(cpus[1:]) or set(cpus)
    print(f"CPUs: sidecar {sorted(sidecar_cpus)}, engines {sorted(client_cpus)}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="specctl-load-") as tmp:
        sidecar = SidecarProcess(
            Path(tmp),
            max_reports_per_s=1e6,
            state=not args.no_state,
            learn_interval_s=args.learn_interval_s,
        )
        os.sched_setaffinity(sidecar.proc.pid, sidecar_cpus)
        try:
            kwargs = dict(rows=args.rows, client_procs=args.client_procs, client_cpus=client_cpus)
            r = run_load(
                sidecar, engines=args.engines, rate=args.rate, duration=args.duration,
                label="main", **kwargs,
            )  # fmt: skip
            print(summary(r), flush=True)
            for s in r["timeline"]:
                print(f"  t={s['t_s']:5.1f}s received {s['received_per_s']:8.1f}/s "
                      f"CPU {s['cpu_percent']:5.1f}% RSS {s['rss_mib']:7.1f} MiB")  # fmt: skip
            runs.append(r)
            for rate in args.ramp:
                r = run_load(
                    sidecar, engines=args.engines, rate=rate, duration=args.ramp_duration,
                    label=f"ramp-{rate:g}", **kwargs,
                )  # fmt: skip
                print(summary(r), flush=True)
                runs.append(r)
        finally:
            sidecar.stop()
    broken = [
        r for r in runs
        if r["received_per_s"] < 0.99 * r["offered_per_s"] or r["update_p99_ms"] > 5.0
    ]  # fmt: skip
    if broken:
        b = broken[0]
        print(
            f"breaking point: {b['offered_per_s']:g} reports/s offered "
            f"({b['engines']} x {b['rate_per_engine']:g}/s x {b['rows']} rows): "
            f"received {b['received_per_s']:g}/s, update p99 {b['update_p99_ms']} ms"
        )
    else:
        print("no breaking point within the ramp")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
