"""specctl's scheduler classes running vLLM 0.32's real scheduler code, without a model.

A driver plays the model runner (sampled tokens, drafts), so these cover what
the CPU engine cannot: async scheduling (vLLM's CPU platform turns it off),
and exact per-request checks of draft truncation and of the recorded rows.
"""

from __future__ import annotations

from typing import Any

import pytest

from specctl.api import pb
from specctl.engine.policy_view import compile_policy
from specctl.protocol.reports import decode_step_report, encode_step_report
from specctl.testing.scheduler_driver import SchedulerDriver


@pytest.fixture(autouse=True)
def _no_sidecar(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("SPECCTL_ADDRESS", f"unix://{tmp_path}/nobody.sock")
    monkeypatch.setenv("SPECCTL_SEED", "0")


def _pin(driver: SchedulerDriver, arms: dict[str, str]) -> None:
    """Stop the client and apply a policy directly: class -> arm, every bucket."""
    entries = [
        pb.ClassPolicy(workload_class=c, load_bucket=b, arms=[a], probabilities=[1.0])
        for c, a in arms.items()
        for b in range(2)
    ]
    policy = pb.Policy(
        version=5, fallback_arm="ngram/k=4", load_bucket_bounds=[64], entries=entries
    )
    client = driver.scheduler.specctl_client
    client.close()
    client.view = compile_policy(policy, {"ngram": 4})


def _drain(driver: SchedulerDriver) -> list[pb.StepReport]:
    queue = driver.scheduler.specctl_client.queue
    steps = [queue.popleft().record() for _ in range(len(queue))]
    return [encode_step_report(1, steps)] if steps else []


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_each_class_verifies_only_its_arms_k(tiny_model: str, async_scheduling: bool) -> None:
    from specctl.engine.scheduler import SpecctlAsyncScheduler, SpecctlScheduler

    driver = SchedulerDriver(
        SpecctlScheduler,
        tiny_model,
        num_requests=12,
        classes=("greedy", "hot", "mid"),
        async_scheduling=async_scheduling,
        acceptance=0.7,
    )
    scheduler = driver.scheduler
    assert isinstance(scheduler, SpecctlAsyncScheduler) == async_scheduling
    _pin(driver, {"greedy": "ngram/k=4", "hot": "off", "mid": "ngram/k=2"})
    for _ in range(3):
        driver.step()
    _drain(driver)  # steps from before the pin
    drafted_by_class: dict[str, set[int]] = {"greedy": set(), "hot": set(), "mid": set()}
    for _ in range(12):
        output = driver.step()
        assert output.num_spec_tokens_to_schedule == 4
        for req_id in output.num_scheduled_tokens:
            cls = scheduler.requests[req_id].sampling_params.extra_args["workload_class"]
            drafted_by_class[cls].add(len(output.scheduled_spec_decode_tokens.get(req_id, ())))
    assert drafted_by_class == {"greedy": {4}, "hot": {0}, "mid": {2}}

    reports = _drain(driver)
    batch = decode_step_report(reports[0], engine_id="e", offered={"ngram": 4}, num_load_buckets=2)
    assert batch.num_rows > 0
    rows: dict[str, set[tuple[str, int]]] = {}
    for i in range(batch.num_rows):
        cls = batch.classes[batch.class_index[i]]
        arm = batch.arms[batch.arm_index[i]].name
        rows.setdefault(cls, set()).add((arm, int(batch.drafted[i])))
        assert batch.propensity[i] == 1.0
        assert batch.accepted[i] <= batch.drafted[i]
    assert rows == {"greedy": {("ngram/k=4", 4)}, "hot": {("off", 0)}, "mid": {("ngram/k=2", 2)}}
    assert set(batch.policy_version.tolist()) == {5}
    assert int(batch.accepted.sum()) > 0
    assert (batch.step_time_s > 0).all()
    scheduler.shutdown()


def test_all_off_sets_step_k_to_zero(tiny_model: str) -> None:
    from specctl.engine.scheduler import SpecctlScheduler

    driver = SchedulerDriver(SpecctlScheduler, tiny_model, num_requests=4)
    _pin(driver, {"default": "off"})
    for _ in range(4):
        output = driver.step()
    assert output.num_spec_tokens_to_schedule == 0
    assert output.scheduled_spec_decode_tokens == {}
    driver.scheduler.shutdown()


def test_invalid_class_falls_back_to_default_with_one_warning(tiny_model: str) -> None:
    from structlog.testing import capture_logs

    from specctl.engine.scheduler import SpecctlScheduler

    with capture_logs() as logs:
        driver = SchedulerDriver(
            SpecctlScheduler, tiny_model, num_requests=6, classes=("bad class!", "chat")
        )
    recorder = driver.scheduler.specctl
    assert sorted(set(recorder.class_of.values())) == ["chat", "default"]
    warnings = [e for e in logs if e["event"] == "specctl_invalid_workload_class"]
    assert len(warnings) == 1
    assert "bad class!" in warnings[0]["problem"]
    assert recorder.invalid_class_total == 3
    for _ in range(3):
        driver.step()  # the requests run normally
    assert driver.stats.steps == 3
    driver.scheduler.shutdown()


def test_unsupported_vllm_version_fails_naming_supported(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm

    from specctl.engine.scheduler import SpecctlScheduler, UnsupportedVllmError

    monkeypatch.setattr(vllm, "__version__", "0.31.4")
    with pytest.raises(
        UnsupportedVllmError, match=r"supports vLLM 0\.32\.x, 0\.33\.x; this is vLLM 0\.31\.4"
    ):
        SchedulerDriver(SpecctlScheduler, tiny_model, num_requests=1)
    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    with pytest.raises(UnsupportedVllmError, match=r"this is vLLM 0\.34\.0"):
        SchedulerDriver(SpecctlScheduler, tiny_model, num_requests=1)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.3", "0.33.0", "0.33.1"])
def test_supported_vllm_versions_start(
    tiny_model: str, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.33's scheduler hooks and fields match 0.32's (benchmarks/check_vllm_source.py)."""
    import vllm

    from specctl.engine.scheduler import SpecctlScheduler

    monkeypatch.setattr(vllm, "__version__", version)
    driver = SchedulerDriver(SpecctlScheduler, tiny_model, num_requests=1)
    assert driver.scheduler.specctl is not None
    driver.scheduler.shutdown()


def test_missing_hook_fails_naming_it(tiny_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from specctl.engine.scheduler import UnsupportedVllmError, check_vllm_supported

    def update_draft_token_ids(self: Any, drafts: Any, extra: Any) -> None: ...

    monkeypatch.setattr(Scheduler, "update_draft_token_ids", update_draft_token_ids)
    with pytest.raises(UnsupportedVllmError, match="update_draft_token_ids"):
        check_vllm_supported()


@pytest.mark.parametrize("clock", ["wall", "process_cpu"])
def test_step_time_is_measured_on_the_configured_clock(
    tiny_model: str, clock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU clock, time the engine process spends waiting is not step cost."""
    from specctl.engine.scheduler import SpecctlScheduler

    monkeypatch.setenv("SPECCTL_STEP_CLOCK", clock)
    delay = 0.05
    driver = SchedulerDriver(SpecctlScheduler, tiny_model, num_requests=4, forward_delay_s=delay)
    _pin(driver, {"default": "ngram/k=2"})
    for _ in range(6):
        driver.step()
    batch = decode_step_report(
        _drain(driver)[0], engine_id="e", offered={"ngram": 4}, num_load_buckets=2
    )
    times = batch.step_time_s[1:]  # the first step's start predates the clock's last end
    if clock == "wall":
        assert (times >= delay).all(), times
    else:
        assert (times < 0.5 * delay).all(), times
    driver.scheduler.shutdown()
