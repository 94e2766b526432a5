"""Replicas for the fleet tests: a real sidecar and a simulated engine behind it.

Each simulated engine is a :class:`~specctl.testing.scripted_engine.ScriptedEngine`
(a real gRPC stream) that sends steps of one workload class: every request
runs an arm drawn uniformly from off and ngram K = 1, 2, 4, accepts each draft
position with the class's acceptance rate until the first rejection, and the
step takes longer the more its requests drafted. Its sidecars share one Redis
server that the test starts and stops itself.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
import numpy as np

from specctl.api import pb, pb_grpc
from specctl.arms import parse_arm
from specctl.protocol.reports import encode_step_report
from specctl.steps import StepRecord
from specctl.testing.redis_server import RedisServer
from specctl.testing.scripted_engine import ScriptedEngine, hello, reports_learned, scrape
from specctl.testing.sidecar_thread import SidecarThread

PREFIX = "specctl:test:"
ARMS = ("off", "ngram/k=1", "ngram/k=2", "ngram/k=4")
ROWS_PER_STEP = 8
STEPS_PER_REPORT = 4


def fleet_settings(server: RedisServer, sidecar_id: str, **more: Any) -> dict[str, Any]:
    """Settings for ``sidecar_factory``: the specctl policy, sharing through ``server``
    twice a second (so a change reaches the others well within 2 s)."""
    return {
        "policy_name": "specctl",
        "fleet_url": server.url,
        "fleet_password_file": str(server.password_file()),
        "fleet_sidecar_id": sidecar_id,
        "fleet_key_prefix": PREFIX,
        "fleet_publish_interval_s": 0.5,
        "fleet_entry_ttl_s": 3.0,
        "fleet_timeout_s": 1.0,
        "fleet_reconnect_max_s": 1.0,
        **more,
    }


class Replica:
    """A sidecar, and a simulated engine of one workload class connected to it."""

    def __init__(
        self,
        sidecar: SidecarThread,
        engine_id: str,
        workload_class: str,
        *,
        connect: bool = True,
    ) -> None:
        """With ``connect=False`` no engine connects (the sidecar is only read)."""
        self.sidecar = sidecar
        self.engine_id = engine_id
        self.workload_class = workload_class
        self.sequence = 0
        self.rng = np.random.default_rng(sum(engine_id.encode()))
        self.channel = grpc.insecure_channel(sidecar.address)
        self.stub = pb_grpc.SpecControllerStub(self.channel)
        self.engine: ScriptedEngine | None = None
        if connect:
            self.engine = ScriptedEngine(sidecar.address)
            self.engine.send(hello(engine_id))
            self.engine.recv_policy(timeout=30)

    def send(self, reports: int, acceptance: float, workload_class: str | None = None) -> None:
        """``reports`` reports of ``STEPS_PER_REPORT`` steps each, then wait until the
        sidecar has learned from them all."""
        assert self.engine is not None, "no engine is connected"
        cls = workload_class or self.workload_class
        before = self.learned()
        for _ in range(reports):
            self.sequence += 1
            steps = [self._step(cls, acceptance) for _ in range(STEPS_PER_REPORT)]
            self.engine.send(encode_step_report(self.sequence, steps))
        deadline = time.monotonic() + 60
        while self.learned() < before + reports:
            assert time.monotonic() < deadline, "the sidecar did not learn from the reports"
            time.sleep(0.05)

    def _step(self, cls: str, acceptance: float) -> StepRecord:
        arms = [ARMS[i] for i in self.rng.integers(0, len(ARMS), ROWS_PER_STEP)]
        ks = [parse_arm(a).k for a in arms]
        # leading successes, each with probability `acceptance`, at most K
        accepted = [int(np.cumprod(self.rng.random(k) < acceptance).sum()) if k else 0 for k in ks]
        return StepRecord(
            step_index=self.sequence,
            step_time_s=0.02 + 0.0005 * sum(ks) + float(self.rng.uniform(0, 0.001)),
            batch_size=ROWS_PER_STEP,
            num_scheduled_tokens=ROWS_PER_STEP + sum(ks),
            policy_version=1,
            load_bucket=0,
            step_end_unix_s=time.time(),
            classes=[cls] * ROWS_PER_STEP,
            arms=arms,
            propensity=[1.0 / len(ARMS)] * ROWS_PER_STEP,
            drafted=ks,
            accepted=accepted,
        )

    def learned(self) -> float:
        return reports_learned(self.sidecar.metrics_url)

    def metrics(self) -> dict[str, float]:
        return scrape(self.sidecar.metrics_url)

    def probability(self, workload_class: str, arm: str, bucket: int = 0) -> float | None:
        """The published probability of ``arm`` for the context; None if not published."""
        policy = self.stub.GetPolicy(pb.GetPolicyRequest(), timeout=10)
        for entry in policy.entries:
            if entry.workload_class == workload_class and entry.load_bucket == bucket:
                return dict(zip(entry.arms, entry.probabilities, strict=True)).get(arm, 0.0)
        return None

    def rounds(self, workload_class: str, bucket: int = 0) -> float:
        """The request-rounds behind the context's decision (0 if the class is unknown)."""
        try:
            evidence = self.stub.GetEvidence(
                pb.GetEvidenceRequest(workload_class=workload_class), timeout=10
            )
        except grpc.RpcError:
            return 0.0
        for c in evidence.classes:
            if c.load_bucket == bucket:
                return float(c.rounds)
        return 0.0

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.channel.close()


def fleet_metric(replica: Replica, name: str, **labels: str) -> float:
    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return replica.metrics().get(f"{name}{{{text}}}" if text else name, 0.0)
