"""Where specctl's scheduler could break a production engine, checked against vLLM's own.

Each test builds vLLM 0.32's real scheduler classes (specctl's subclasses and,
as the baseline, vLLM's) from a real config with no model runner: request id
reuse, streaming-input sessions, proposal lengths above specctl's limit, data
parallelism, a user's Dynamic SD table, async scheduling with outputs in
flight, the first decode step's padding and the CUDA graph configuration.
"""

from __future__ import annotations

from typing import Any

import pytest
from scheduler_support import build_scheduler, make_request, sync_step

from controller.api import pb
from controller.engine.policy_view import compile_policy


@pytest.fixture(autouse=True)
def _no_sidecar(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("SPECCTL_ADDRESS", f"unix://{tmp_path}/nobody.sock")
    monkeypatch.setenv("SPECCTL_SEED", "0")


def _pin(scheduler: Any, arms: dict[str, str], max_k: int = 4, version: int = 5) -> None:
    """Stop the client and apply a policy directly: class -> arm, every bucket."""
    entries = [
        pb.ClassPolicy(workload_class=c, load_bucket=0, arms=[a], probabilities=[1.0])
        for c, a in arms.items()
    ]
    policy = pb.Policy(version=version, fallback_arm=f"ngram/k={max_k}", entries=entries)
    client = scheduler.specctl_client
    client.close()
    client.view = compile_policy(policy, {"ngram": max_k})


def _specctl() -> type:
    from controller.engine.scheduler import SpecctlScheduler

    return SpecctlScheduler


# -- 4. request ids reused after a request finishes -------------------------------------------


def test_reused_request_id_keeps_its_class(tiny_model: str) -> None:
    """A new request with a finished one's id is added before schedule() drops the old id."""
    scheduler = build_scheduler(_specctl(), tiny_model)
    _pin(scheduler, {"default": "ngram/k=4"})
    scheduler.add_request(make_request("r", list(range(1, 33)), max_tokens=2))
    while "r" in scheduler.requests:
        sync_step(scheduler)
    assert "r" in scheduler.finished_req_ids
    scheduler.add_request(make_request("r", list(range(1, 33)), max_tokens=200))
    drafted = []
    for _ in range(4):
        output = sync_step(scheduler)
        assert output.num_spec_tokens_to_schedule == 4
        drafted.append(len(output.scheduled_spec_decode_tokens.get("r", ())))
    assert scheduler.specctl.class_of == {"r": "default"}
    assert scheduler.specctl.members["default"]["r"] is scheduler.requests["r"]
    assert drafted[-1] == 4
    scheduler.shutdown()


def test_finished_requests_leave_their_class(tiny_model: str) -> None:
    scheduler = build_scheduler(_specctl(), tiny_model)
    scheduler.add_request(make_request("a", list(range(1, 33)), max_tokens=2, workload_class="x"))
    scheduler.add_request(make_request("b", list(range(1, 33)), max_tokens=200))
    for _ in range(4):
        sync_step(scheduler)
    assert scheduler.specctl.class_of == {"b": "default"}
    assert set(scheduler.specctl.members) == {"default"}
    scheduler.shutdown()


# -- 5. num_speculative_tokens above specctl's limit -----------------------------------------


def test_more_speculative_tokens_than_supported_is_one_clear_error(tiny_model: str) -> None:
    from controller.arms import MAX_K, ArmError

    with pytest.raises(ValueError, match=rf"at most {MAX_K} speculative tokens") as info:
        build_scheduler(_specctl(), tiny_model, num_speculative_tokens=MAX_K + 1)
    assert not isinstance(info.value, ArmError)
    assert ". " not in str(info.value)  # one sentence


# -- 6. streaming-input sessions ---------------------------------------------------------------


def _finish_turn(scheduler: Any, req_id: str) -> None:
    from vllm.v1.request import RequestStatus

    for _ in range(20):
        sync_step(scheduler)
        if scheduler.requests[req_id].status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            return
    raise AssertionError("the session's turn did not end")


def test_streaming_session_continuation_keeps_the_session_cut(tiny_model: str) -> None:
    scheduler = build_scheduler(_specctl(), tiny_model)
    _pin(scheduler, {"default": "ngram/k=4", "pinned": "off"})
    scheduler.add_request(make_request("other", list(range(1, 33)), max_tokens=200))
    prompt = list(range(40, 72))
    scheduler.add_request(
        make_request("s", prompt, workload_class="pinned", max_tokens=2, resumable=True)
    )
    session = scheduler.requests["s"]
    for turn in range(2):
        _finish_turn(scheduler, "s")
        chunk = make_request(
            "s", [90 + turn] * 4, workload_class="pinned", max_tokens=6, resumable=True
        )
        scheduler.add_request(chunk)
        assert scheduler.requests["s"] is session  # vLLM folds the chunk into the session
        assert scheduler.specctl.members["pinned"]["s"] is session
        for _ in range(4):
            output = sync_step(scheduler)
            assert output.num_spec_tokens_to_schedule == 4
            assert "s" not in output.scheduled_spec_decode_tokens
            assert len(session.spec_token_ids) == 0
    scheduler.shutdown()


def test_streaming_session_continuation_moves_to_the_class_it_names(tiny_model: str) -> None:
    scheduler = build_scheduler(_specctl(), tiny_model)
    _pin(scheduler, {"default": "ngram/k=4", "hot": "ngram/k=4", "cold": "off"})
    scheduler.add_request(make_request("other", list(range(1, 33)), max_tokens=200))
    scheduler.add_request(
        make_request("s", list(range(40, 72)), workload_class="hot", max_tokens=2, resumable=True)
    )
    session = scheduler.requests["s"]
    _finish_turn(scheduler, "s")
    scheduler.add_request(
        make_request("s", [91] * 4, workload_class="cold", max_tokens=6, resumable=True)
    )
    recorder = scheduler.specctl
    assert recorder.class_of["s"] == "cold"
    assert "hot" not in recorder.members
    assert recorder.members["cold"] == {"s": session}
    for _ in range(4):
        output = sync_step(scheduler)
        assert "s" not in output.scheduled_spec_decode_tokens
    # the session ends: the final chunk is not resumable
    scheduler.add_request(make_request("s", [92], workload_class="cold", max_tokens=1))
    for _ in range(4):
        sync_step(scheduler)
    assert "s" not in recorder.class_of
    assert set(recorder.members) == {"default"}
    scheduler.shutdown()
