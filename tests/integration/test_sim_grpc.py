"""The simulator drives a real sidecar over gRPC, through the engine's own client."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from specctl.api import pb, pb_grpc
from specctl.cli import main
from specctl.sim.grpc_link import simulate_against
from specctl.sim.scenario import AcceptanceChange, LoadChange, MixChange, build_scenarios
from specctl.sim.simulate_cli import parse_event
from specctl.testing.scripted_engine import wait_for


def test_simulated_engine_runs_the_arm_the_sidecar_pushes(sidecar_factory) -> None:
    sidecar = sidecar_factory("unix", policy_name="static", policy_params={"arm": "eagle3/k=3"})
    scenario = build_scenarios("drift", 300)[0]
    record, link = simulate_against(sidecar.address, scenario, seed=1)
    state = link.client.state()
    assert state.reports_sent_total > 0 and state.reports_rejected_total == 0
    assert state.steps_dropped_total == 0
    arm = record.arms.index("eagle3/k=3")
    # the engine waited for the first policy, then ran it for every request
    assert record.rounds.sum() == record.rounds[:, arm].sum() > 300 * 30
    # Every report was sent before the stream closed; the sidecar learns it in its next round.
    classes = {"gsm8k", "math500", "humaneval", "mbpp"}
    wait_for(lambda: classes <= set(sidecar.run(lambda: list(sidecar.sidecar.book.classes))))
    assert sidecar.run(lambda: dict(sidecar.sidecar.book.offered)) == {"dflash": 15, "eagle3": 4}


def test_simulate_command_feeds_the_learning_policy(sidecar_factory, capsys) -> None:
    sidecar = sidecar_factory("unix", policy_name="specctl")
    code = main(
        [
            "simulate",
            "--address", sidecar.address,
            "--scenario", "qwen3-8b",
            "--steps", "400",
            "--event", "200:accept:math500=0.5",
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "qwen3-8b (Qwen/Qwen3-8B): 400 steps" in out and ", 0 rejected" in out
    assert sum(line.strip().startswith(("gsm8k", "math500")) for line in out.splitlines()) == 2
    # Reports are learned a moment after they arrive (the sidecar's next learning round):
    # ask through the evidence call, as an operator would, until math500 is known.
    channel = grpc.insecure_channel(sidecar.address)
    stub = pb_grpc.SpecControllerStub(channel)

    def math500_known() -> bool:
        try:
            stub.GetEvidence(pb.GetEvidenceRequest(workload_class="math500"), timeout=5)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            return False
        return True

    wait_for(math500_known)
    evidence = stub.GetEvidence(pb.GetEvidenceRequest(workload_class="math500"), timeout=5)
    channel.close()
    assert sum(c.rounds for c in evidence.classes) > 0
    assert np.isfinite([a.goodput for c in evidence.classes for a in c.arms]).all()


def test_events_parse_or_name_what_is_wrong() -> None:
    assert parse_event("3000:accept:math500=0.5") == AcceptanceChange(3000, "math500", 0.5)
    assert parse_event("10:load=128") == LoadChange(10, 128)
    assert parse_event("5:mix:a=3,b=1") == MixChange(5, {"a": 3.0, "b": 1.0})
    with pytest.raises(ValueError, match=r"--event '5:surge': expected"):
        parse_event("5:surge")
    with pytest.raises(ValueError, match=r"--event 'x:load=3'"):
        parse_event("x:load=3")
