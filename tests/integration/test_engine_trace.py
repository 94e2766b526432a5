"""The engine-side trace writer under vLLM 0.32's real scheduler, driven by a synthetic
model runner: every decode round is in the trace, numbered, with consistent positions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specctl.testing.scheduler_driver import SchedulerDriver
from specctl.trace.format import read_trace


@pytest.mark.parametrize(
    ("async_scheduling", "clock"), [(False, "wall"), (True, "wall"), (False, "process_cpu")]
)
def test_scheduler_writes_a_trace_without_a_sidecar(
    tiny_model: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    async_scheduling: bool,
    clock: str,
) -> None:
    from specctl.engine.scheduler import SpecctlScheduler

    monkeypatch.setenv("SPECCTL_ADDRESS", f"unix://{tmp_path}/nobody.sock")
    monkeypatch.setenv("SPECCTL_SEED", "0")
    monkeypatch.setenv("SPECCTL_TRACE_DIR", str(tmp_path / "trace"))
    monkeypatch.setenv("SPECCTL_STEP_CLOCK", clock)
    driver = SchedulerDriver(
        SpecctlScheduler,
        tiny_model,
        num_requests=6,
        classes=("greedy", "hot"),
        acceptance=0.6,
        async_scheduling=async_scheduling,
    )
    for _ in range(30):
        driver.step()
    driver.scheduler.shutdown()  # closes the client, which finishes the trace

    trace = read_trace(tmp_path / "trace")
    meta = trace.meta[0]
    assert (meta.drafter, meta.max_k, meta.step_clock) == ("ngram", 4, clock)
    assert trace.num_steps >= 28
    assert (trace.step_time_s > 0).all()
    if clock == "wall":
        assert (trace.wall_time_s == trace.step_time_s).all()
    else:  # measured apart, on the wall clock
        assert (trace.wall_time_s > 0).all() and (trace.wall_time_s < 5.0).all()
    # the fallback arm (the engine's own K: no sidecar) governs every decode round
    assert {trace.arms[i] for i in trace.arm_index.tolist()} == {"ngram/k=4"}
    assert trace.drafted.max() == 4
    # every verified draft the synthetic model accepted is in the trace
    assert int(trace.accepted.sum()) == driver.stats.accepted
    assert int(trace.drafted.sum()) == driver.stats.drafted
    assert sorted(set(trace.request.tolist())) == list(range(6))
    assert set(trace.classes) == {"greedy", "hot"}
    for r in range(6):
        rows = np.flatnonzero(trace.request == r)
        positions = trace.position[rows]
        assert positions[0] == 1  # the token the prefill committed
        assert (np.diff(positions) == trace.accepted[rows][:-1] + 1).all()
    for f in (tmp_path / "trace").iterdir():
        assert b"req-" not in f.read_bytes()  # request ids never reach the trace
