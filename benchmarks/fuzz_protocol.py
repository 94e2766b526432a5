"""Fuzz the engine protocol at scale: >= 100,000 cases, zero crashes, bounded memory.

Three parts:
- mutation fuzzing in-process (the bulk): valid engine messages (a hello, a
  256-row report, a status) with bytes flipped, cut, spliced, or a field set
  to an extreme value, plus plain random bytes; each case is parsed and fed
  to the sidecar's report path as the server would (``specctl.testing.fuzz.feed``);
- structured cases from the hypothesis strategies the CI tests use;
- a live sidecar (gRPC on a unix socket) fed raw frames on Connect streams,
  with a well-behaved engine that must keep getting answers throughout.

Any exception other than the expected rejection is a crash: counted, and the
first few printed with their traceback. Resident memory is printed before and after.

    .venv/bin/python benchmarks/fuzz_protocol.py [--cases 100000] [--structured 3000]
        [--live 20000] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import math
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from specctl.api import pb
from specctl.testing.fuzz import engine_messages, feed, fuzz_sidecar, start_fuzz_sidecar

U64 = 2**64 - 1
U32 = 2**32 - 1
EXTREMES_FLOAT = [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e308, 5e-324, 3600.0001]
EXTREMES_INT = [0, 1, U32, U64, 2**31, 255, 65]


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def base_messages(rng: np.random.Generator) -> list[pb.EngineMessage]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sidecar_ingest import make_report

    report = make_report(1, 256, rng)
    # the fuzz sidecar's engine offers ngram up to 4 and eagle3 up to 2
    return [
        pb.EngineMessage(report=report),
        pb.EngineMessage(report=make_report(2, 8, rng)),
        pb.EngineMessage(
            hello=pb.Hello(
                engine_id="engine-x",
                drafters=[pb.Drafter(method="ngram", max_k=4)],
                fallback_arm="ngram/k=2",
            )
        ),
        pb.EngineMessage(
            status=pb.EngineStatus(in_fallback=True, policy_age_s=1.0, reports_dropped_total=3)
        ),
    ]


_REPORT_FIELDS = [f.name for f in pb.StepReport.DESCRIPTOR.fields if f.name != "sequence"]
_FIELD_TYPES = {f.name: f.type for f in pb.StepReport.DESCRIPTOR.fields}


def mutate_field(rng: np.random.Generator, base: pb.EngineMessage) -> pb.EngineMessage:
    """A valid report with one repeated field changed: a value, its length, or its table."""
    msg = pb.EngineMessage()
    msg.CopyFrom(base)
    r = msg.report
    name = _REPORT_FIELDS[int(rng.integers(len(_REPORT_FIELDS)))]
    field = getattr(r, name)
    choice = int(rng.integers(4))
    if name in ("class_table", "arm_table"):
        pool = ["", "x" * 65, "off", "ngram/k=9", "eagle3/k=3", "a b", "ü", "ngram/k=0", "-"]
        if choice == 0 or len(field) == 0:
            field.append(pool[int(rng.integers(len(pool)))])
        else:
            field[int(rng.integers(len(field)))] = pool[int(rng.integers(len(pool)))]
        return msg
    is_float = name in ("step_time_s", "step_end_unix_s", "propensity")
    extremes = EXTREMES_FLOAT if is_float else EXTREMES_INT
    if _FIELD_TYPES[name] == FieldDescriptor.TYPE_UINT32:
        extremes = [v for v in extremes if v <= U32]
    if name == "propensity":
        extremes = [v for v in extremes if not (isinstance(v, float) and abs(v) > 3e38)]
    if choice == 0 and len(field):
        del field[int(rng.integers(len(field)))]
    elif choice == 1:
        field.append(extremes[int(rng.integers(len(extremes)))])
    elif len(field):
        field[int(rng.integers(len(field)))] = extremes[int(rng.integers(len(extremes)))]
    return msg


def mutate_bytes(rng: np.random.Generator, data: bytes, other: bytes) -> bytes:
    kind = int(rng.integers(4))
    buf = bytearray(data)
    if kind == 0:
        return rng.bytes(int(rng.integers(0, 512)))
    if kind == 1 and buf:
        for _ in range(int(rng.integers(1, 9))):
            buf[int(rng.integers(len(buf)))] = int(rng.integers(256))
        return bytes(buf)
    if kind == 2:
        return bytes(buf[: int(rng.integers(0, len(buf) + 1))])
    cut = int(rng.integers(0, len(buf) + 1))
    return bytes(buf[:cut]) + other[int(rng.integers(0, len(other) + 1)) :]


def run_mutations(cases: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    sidecar, session = fuzz_sidecar()
    bases = base_messages(rng)
    raw = [m.SerializeToString() for m in bases]
    outcomes: collections.Counter[str] = collections.Counter()
    crashes: list[str] = []
    rss_before = rss_mib()
    t0 = time.perf_counter()
    for i in range(cases):
        try:
            if i % 2 == 0:
                message = mutate_field(rng, bases[int(rng.integers(2))])
            else:
                j = int(rng.integers(len(raw)))
                data = mutate_bytes(rng, raw[j], raw[int(rng.integers(len(raw)))])
                try:
                    message = pb.EngineMessage.FromString(data)
                except DecodeError:
                    outcomes["undecodable"] += 1
                    continue
            outcomes[feed(sidecar, session, message)] += 1
        except Exception:
            outcomes["crash"] += 1
            if len(crashes) < 5:
                crashes.append(traceback.format_exc())
    return {
        "cases": cases,
        "seconds": time.perf_counter() - t0,
        "outcomes": dict(outcomes),
        "crashes": crashes,
        "rss_mib": (rss_before, rss_mib()),
        "sessions": len(sidecar.sessions),
    }


def run_structured(cases: int, seed: int) -> dict:
    from hypothesis import HealthCheck, given, settings

    sidecar, session = fuzz_sidecar()
    outcomes: collections.Counter[str] = collections.Counter()
    crashes: list[str] = []

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(engine_messages())
    def one(message: pb.EngineMessage) -> None:
        try:
            outcomes[feed(sidecar, session, message)] += 1
        except Exception:
            outcomes["crash"] += 1
            if len(crashes) < 5:
                crashes.append(traceback.format_exc())

    t0 = time.perf_counter()
    one()
    return {
        "cases": cases,
        "seconds": time.perf_counter() - t0,
        "outcomes": dict(outcomes),
        "crashes": crashes,
    }


def run_live(cases: int, seed: int) -> dict:
    import grpc

    rng = np.random.default_rng(seed)
    bases = base_messages(rng)
    raw = [m.SerializeToString() for m in bases]
    hello = bases[2].SerializeToString()
    tmp = Path(tempfile.mkdtemp(prefix="specctl-fuzz-"))
    sc = start_fuzz_sidecar(tmp)
    codes: collections.Counter[str] = collections.Counter()
    rss_before = rss_mib()
    t0 = time.perf_counter()
    sent = 0
    try:
        with grpc.insecure_channel(sc.address) as channel:
            connect = channel.stream_stream(
                "/specctl.v1.SpecController/Connect",
                request_serializer=None,
                response_deserializer=None,
            )
            good = grpc.insecure_channel(sc.address)
            get_policy = good.unary_unary(
                "/specctl.v1.SpecController/GetPolicy",
                request_serializer=None,
                response_deserializer=None,
            )
            while sent < cases:
                n = int(rng.integers(1, 200))
                frames = [hello] if rng.random() < 0.8 else []
                for _ in range(n):
                    # mostly decodable reports with a bad field (the stream carries on),
                    # some raw garbage (the stream ends)
                    if rng.random() < 0.95:
                        frames.append(mutate_field(rng, bases[0]).SerializeToString())
                    else:
                        j = int(rng.integers(len(raw)))
                        frames.append(mutate_bytes(rng, raw[j], raw[int(rng.integers(len(raw)))]))
                sent += n
                call = connect(iter(frames), timeout=30)
                try:
                    for _ in call:
                        pass
                    codes["OK"] += 1
                except grpc.RpcError as exc:
                    codes[exc.code().name] += 1
                get_policy(b"", timeout=10)  # the sidecar still answers everyone else
            good.close()
        sessions = sc.run(lambda: len(sc.sidecar.sessions))
    finally:
        sc.stop()
    return {
        "frames": sent,
        "streams": sum(codes.values()),
        "seconds": time.perf_counter() - t0,
        "stream_status": dict(codes),
        "sessions_left": sessions,
        "rss_mib": (rss_before, rss_mib()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--structured", type=int, default=3_000)
    parser.add_argument("--live", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from specctl.logs import configure_logging

    configure_logging("json", "error")  # rejections are counted, not printed
    crashes = 0

    m = run_mutations(args.cases, args.seed)
    crashes += m["outcomes"].get("crash", 0)
    print(
        f"mutations: {m['cases']} cases in {m['seconds']:.1f} s; outcomes {m['outcomes']}; "
        f"sessions {m['sessions']}; RSS {m['rss_mib'][0]:.1f} -> {m['rss_mib'][1]:.1f} MiB"
    )
    s = run_structured(args.structured, args.seed)
    crashes += s["outcomes"].get("crash", 0)
    print(f"structured: {s['cases']} cases in {s['seconds']:.1f} s; outcomes {s['outcomes']}")
    live = run_live(args.live, args.seed)
    print(
        f"live: {live['frames']} frames on {live['streams']} streams in {live['seconds']:.1f} s; "
        f"stream status {live['stream_status']}; sessions left {live['sessions_left']}; "
        f"RSS {live['rss_mib'][0]:.1f} -> {live['rss_mib'][1]:.1f} MiB"
    )
    for tb in m["crashes"] + s["crashes"]:
        print(tb)
    total = m["cases"] + s["cases"] + live["frames"]
    print(f"total {total} cases, {crashes} crashes, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")  # fmt: skip
    return 1 if crashes or live["sessions_left"] else 0


if __name__ == "__main__":
    sys.exit(main())
