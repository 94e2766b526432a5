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

from specctl.api import pb
from specctl.engine.policy_view import compile_policy


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
    from specctl.engine.scheduler import SpecctlScheduler

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
    from specctl.arms import MAX_K, ArmError

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


# -- 1. data parallelism ---------------------------------------------------------------------


def _ks_and_drafts(scheduler: Any, steps: int) -> tuple[list[int], dict[str, set[int]]]:
    ks: list[int] = []
    drafted: dict[str, set[int]] = {}
    for _ in range(steps):
        output = sync_step(scheduler)
        ks.append(output.num_spec_tokens_to_schedule)
        for req_id in output.num_scheduled_tokens:
            n = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
            drafted.setdefault(req_id[0], set()).add(n)
    return ks, drafted


def _add_mixed(scheduler: Any) -> None:
    for i in range(3):
        scheduler.add_request(
            make_request(f"a{i}", list(range(1, 33)), workload_class="a", max_tokens=400)
        )
        scheduler.add_request(
            make_request(f"b{i}", list(range(1, 33)), workload_class="b", max_tokens=400)
        )


@pytest.mark.parametrize("seed", ["1", "2"])
def test_data_parallel_ranks_propose_the_same_k_every_step(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch, seed: str
) -> None:
    """Each rank samples arms with its own random numbers; the step's K stays vLLM's."""
    from vllm.v1.core.sched.scheduler import Scheduler

    monkeypatch.setenv("SPECCTL_SEED", seed)
    baseline = build_scheduler(Scheduler, tiny_model, data_parallel_size=2)
    _add_mixed(baseline)
    vllm_ks, _ = _ks_and_drafts(baseline, 8)

    scheduler = build_scheduler(_specctl(), tiny_model, data_parallel_size=2)
    entries = [
        pb.ClassPolicy(
            workload_class="a", load_bucket=0, arms=["off", "ngram/k=1"], probabilities=[0.5, 0.5]
        ),
        pb.ClassPolicy(workload_class="b", load_bucket=0, arms=["ngram/k=2"], probabilities=[1]),
    ]
    client = scheduler.specctl_client
    client.close()
    client.view = compile_policy(
        pb.Policy(version=3, fallback_arm="ngram/k=4", entries=entries), {"ngram": 4}
    )
    _add_mixed(scheduler)
    ks, drafted = _ks_and_drafts(scheduler, 8)
    assert ks == vllm_ks == [4] * 8
    # the per-class cuts still apply, on each rank
    assert drafted["b"] == {0, 2}
    assert drafted["a"] <= {0, 1} and drafted["a"] != {0}
    scheduler.shutdown()


def test_data_parallel_turns_specctls_lookup_off(tiny_model: str) -> None:
    scheduler = build_scheduler(_specctl(), tiny_model, data_parallel_size=2)
    _pin(scheduler, {"default": "off"})
    scheduler.add_request(make_request("r", list(range(1, 33)), max_tokens=50))
    for _ in range(3):
        assert sync_step(scheduler).num_spec_tokens_to_schedule == 4
        assert scheduler.dynamic_sd_lookup is None
    scheduler.shutdown()


# -- 3. a user's Dynamic SD table --------------------------------------------------------------

TABLE = [(1, 2, 4), (3, 16, 1)]


def test_user_table_caps_the_step_k_and_the_policy_chooses_below(tiny_model: str) -> None:
    from specctl.engine.recorder import RawStep

    scheduler = build_scheduler(_specctl(), tiny_model, per_batch_size=TABLE)
    _pin(scheduler, {"default": "ngram/k=3"})
    for i in range(2):
        scheduler.add_request(make_request(f"r{i}", list(range(1, 33)), max_tokens=400))
    ks = [sync_step(scheduler).num_spec_tokens_to_schedule for _ in range(3)]
    assert ks == [3, 3, 3]  # two requests: the table allows 4, the policy picks 3
    for i in range(2, 4):
        scheduler.add_request(make_request(f"r{i}", list(range(1, 33)), max_tokens=400))
    outputs = [sync_step(scheduler) for _ in range(4)]
    assert [o.num_spec_tokens_to_schedule for o in outputs] == [1, 1, 1, 1]
    assert {len(v) for v in outputs[-1].scheduled_spec_decode_tokens.values()} == {1}
    # what ran is what is reported: ngram/k=1, chosen with probability 1
    queue = scheduler.specctl_client.queue
    rows = [step.record() for step in queue if isinstance(step, RawStep)][-1]
    assert set(rows.arms) == {"ngram/k=1"}
    assert set(rows.propensity) == {1.0}
    scheduler.shutdown()


def test_specctls_lookup_reads_like_vllms_list(tiny_model: str) -> None:
    """Code that measures or walks vLLM's batch-size lookup sees the same list under a policy."""
    from vllm.v1.core.sched.scheduler import Scheduler

    baseline = build_scheduler(Scheduler, tiny_model, per_batch_size=TABLE)
    scheduler = build_scheduler(_specctl(), tiny_model, per_batch_size=TABLE)
    _pin(scheduler, {"default": "ngram/k=3"})
    scheduler.add_request(make_request("r", list(range(1, 33)), max_tokens=50))
    sync_step(scheduler)
    assert scheduler.dynamic_sd_lookup is not baseline.dynamic_sd_lookup
    assert len(scheduler.dynamic_sd_lookup) == len(baseline.dynamic_sd_lookup) == 17
    assert list(scheduler.dynamic_sd_lookup) == list(baseline.dynamic_sd_lookup)
    scheduler.shutdown()
    # without a table: the engine's K at every batch size vLLM can schedule
    scheduler = build_scheduler(_specctl(), tiny_model)
    _pin(scheduler, {"default": "ngram/k=3"})
    scheduler.add_request(make_request("r", list(range(1, 33)), max_tokens=50))
    sync_step(scheduler)
    assert list(scheduler.dynamic_sd_lookup) == [4] * 17
    with pytest.raises(IndexError):
        scheduler.dynamic_sd_lookup[17]
    scheduler.shutdown()


def test_user_table_in_fallback_runs_as_vllm(tiny_model: str) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    runs = []
    for cls in (Scheduler, _specctl()):
        scheduler = build_scheduler(cls, tiny_model, per_batch_size=TABLE)
        ks = []
        for i in range(4):
            scheduler.add_request(make_request(f"r{i}", list(range(1, 33)), max_tokens=400))
            ks.append(sync_step(scheduler).num_spec_tokens_to_schedule)
        runs.append(ks)
        scheduler.shutdown()
    assert runs[0] == runs[1] == [4, 4, 1, 1]


def test_capped_choice_carries_the_probability_of_every_arm_it_stands_for() -> None:
    from specctl.arms import parse_arm

    policy = pb.Policy(
        version=2,
        fallback_arm="ngram/k=4",
        entries=[
            pb.ClassPolicy(
                workload_class="default",
                load_bucket=0,
                arms=["off", "ngram/k=1", "ngram/k=2", "ngram/k=4"],
                probabilities=[0.1, 0.2, 0.3, 0.4],
            )
        ],
    )
    view = compile_policy(policy, {"ngram": 4})
    seen = {}
    for u in (0.05, 0.2, 0.45, 0.9):
        choice = view.choose_capped("default", 0, u, 2)
        seen[choice.arm.name] = choice.propensity
    assert seen == {"off": 0.1, "ngram/k=1": 0.2, "ngram/k=2": pytest.approx(0.7)}
    assert view.choose_capped("default", 0, 0.9, 0).arm == parse_arm("off")
    assert view.choose_capped("default", 0, 0.9, 0).propensity == pytest.approx(1.0)


# -- 7. the first decode step's padding --------------------------------------------------------


def _prefix_hit_run(cls: type, tiny_model: str, pin: dict[str, str] | None) -> list[Any]:
    """A request whose first step is a single token (a full prefix-cache hit), then decode."""
    scheduler = build_scheduler(cls, tiny_model, enable_prefix_caching=True)
    if pin is not None:
        _pin(scheduler, pin)
    prompt = list(range(1, 34))  # two full blocks and one token
    scheduler.add_request(make_request("first", prompt, max_tokens=2))
    while "first" in scheduler.requests:
        sync_step(scheduler)
    scheduler.add_request(make_request("hit", prompt, max_tokens=30))
    outputs = []
    for _ in range(4):
        output = sync_step(scheduler)
        outputs.append(
            (
                dict(output.num_scheduled_tokens),
                {k: list(v) for k, v in output.scheduled_spec_decode_tokens.items()},
                output.num_spec_tokens_to_schedule,
            )
        )
    if pin is not None or cls is _specctl():
        scheduler.shutdown()
    return outputs


def test_fallback_pads_the_first_decode_step_like_vllm(tiny_model: str) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    vllm_run = _prefix_hit_run(Scheduler, tiny_model, None)
    assert vllm_run[0][0] == {"hit": 5} and vllm_run[0][1] == {"hit": [-1] * 4}
    assert _prefix_hit_run(_specctl(), tiny_model, None) == vllm_run


def test_outside_fallback_the_first_decode_step_is_not_padded(tiny_model: str) -> None:
    run = _prefix_hit_run(_specctl(), tiny_model, {"default": "ngram/k=4"})
    assert run[0][0] == {"hit": 1} and run[0][1] == {}
    assert run[1][1] == {"hit": [7] * 4}


# -- 2. CUDA graphs ----------------------------------------------------------------------------


def _engine_config(tiny_model: str, scheduler_cls: str, **kwargs: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    speculative = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                   "prompt_lookup_min": 1, **kwargs.pop("speculative", {})}  # fmt: skip
    args = EngineArgs(
        model=tiny_model,
        max_model_len=2048,
        scheduler_cls=scheduler_cls,
        speculative_config=speculative,
        compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"},
        **kwargs,
    )
    return args.create_engine_config()


def test_plugin_makes_vllm_apply_its_dynamic_sd_graph_safety(tiny_model: str) -> None:
    """The entry point gives vLLM a constant table, so vLLM's own override applies."""
    from vllm.config import CUDAGraphMode

    from specctl.engine.vllm_plugin import register

    register()
    register()  # once per process, however often vLLM loads it
    config = _engine_config(tiny_model, "specctl.engine.scheduler.SpecctlScheduler")
    assert config.speculative_config.num_speculative_tokens_per_batch_size == [(1, 1, 4)]
    # The CPU platform turns graphs off afterwards; vLLM's check itself is what matters.
    config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    config._maybe_override_dynamic_sd_cudagraph_mode()
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE

    # a user's table is kept; other schedulers are left alone
    table = [[1, 8, 3], [9, 256, 1]]
    config = _engine_config(
        tiny_model, "specctl.engine.scheduler.SpecctlScheduler",
        speculative={"num_speculative_tokens_per_batch_size": table},
    )  # fmt: skip
    assert [list(r) for r in config.speculative_config.num_speculative_tokens_per_batch_size] == (
        table
    )
    config = _engine_config(tiny_model, "vllm.v1.core.sched.scheduler.Scheduler")
    assert config.speculative_config.num_speculative_tokens_per_batch_size is None


def test_plugin_leaves_data_parallel_engines_to_vllms_static_k() -> None:
    from types import SimpleNamespace

    from specctl.engine.vllm_plugin import declares_varying_k

    ours = "specctl.engine.scheduler.SpecctlScheduler"
    assert declares_varying_k(SimpleNamespace(scheduler_cls=ours, data_parallel_size=1))
    assert not declares_varying_k(SimpleNamespace(scheduler_cls=ours, data_parallel_size=2))
    assert not declares_varying_k(SimpleNamespace(scheduler_cls=None, data_parallel_size=1))


def test_plugin_is_a_vllm_general_plugin() -> None:
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    plugins = pyproject["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins == {"specctl": "specctl.engine.vllm_plugin:register"}


def test_full_cuda_graphs_without_the_plugin_are_refused_at_start_up(tiny_model: str) -> None:
    with pytest.raises(ValueError, match=r"FULL CUDA graphs .*cudagraph_mode=FULL_AND_PIECEWISE"):
        build_scheduler(_specctl(), tiny_model, cudagraph_mode="FULL_AND_PIECEWISE")
    # the V2 model runner too: its drafter replays the captured number of draft steps
    with pytest.raises(ValueError, match=r"FULL CUDA graphs \(cudagraph_mode=FULL\)"):
        build_scheduler(_specctl(), tiny_model, cudagraph_mode="FULL")
    # fine: piecewise graphs, a Dynamic SD table (vLLM went piecewise), data parallelism
    for kwargs in (
        {"cudagraph_mode": "PIECEWISE"},
        {"cudagraph_mode": "FULL_AND_PIECEWISE", "per_batch_size": [(1, 1, 4)]},
        {"cudagraph_mode": "FULL_AND_PIECEWISE", "data_parallel_size": 2},
    ):
        build_scheduler(_specctl(), tiny_model, **kwargs).shutdown()


# -- 8. async scheduling with outputs in flight ------------------------------------------------


def _async_kv_pressure_scheduler(cls: type, tiny_model: str, num_speculative_tokens: int) -> Any:
    return build_scheduler(
        cls, tiny_model, num_speculative_tokens=num_speculative_tokens, async_scheduling=True,
        num_blocks=5, max_num_batched_tokens=512,
    )  # fmt: skip


@pytest.mark.parametrize("pp_size", [1, 3])
def test_k_changing_every_step_keeps_vllms_in_flight_accounting(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch, pp_size: int
) -> None:
    """vLLM's reset-under-KV-pressure scenario with K drawn from 1..3 on every step."""
    from scheduler_support import reset_under_kv_pressure

    failures = {}
    for seed in range(20):
        monkeypatch.setenv("SPECCTL_SEED", str(seed))
        scheduler = _async_kv_pressure_scheduler(_specctl(), tiny_model, 3)
        entry = pb.ClassPolicy(
            workload_class="default", load_bucket=0,
            arms=["ngram/k=1", "ngram/k=2", "ngram/k=3"], probabilities=[1 / 3] * 3,
        )  # fmt: skip
        client = scheduler.specctl_client
        client.close()
        client.view = compile_policy(
            pb.Policy(version=2, fallback_arm="ngram/k=3", entries=[entry]), {"ngram": 3}
        )
        problems = reset_under_kv_pressure(scheduler, pp_size)
        scheduler.shutdown()
        if problems:
            failures[seed] = problems
    assert failures == {}


def test_stale_count_on_a_finished_request_is_vllms_own_without_speculation(
    tiny_model: str,
) -> None:
    """vLLM's AsyncScheduler with no speculative decoding reaches the same end state.

    A request preempted under KV pressure with two outputs in flight finishes
    on the first one's tokens and is freed before the second arrives, so its
    stale-token counter stays at 1 on the freed request. A step that verifies
    no drafts for a request (specctl's ``off``) schedules as this engine does;
    when vLLM changes this, the tripwire fails and docs/engine-safety.md is
    updated.
    """
    from scheduler_support import reset_under_kv_pressure
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    scheduler = _async_kv_pressure_scheduler(AsyncScheduler, tiny_model, 0)
    assert scheduler.num_spec_tokens == 0
    assert reset_under_kv_pressure(scheduler, 3) == ["1: num_stale_output_tokens=1"]


def test_a_failing_hook_leaves_the_step_to_the_users_table(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = build_scheduler(_specctl(), tiny_model, per_batch_size=TABLE)
    _pin(scheduler, {"default": "ngram/k=4"})

    def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("bookkeeping bug")

    monkeypatch.setattr(scheduler.specctl, "on_schedule", broken)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", list(range(1, 33)), max_tokens=400))
    outputs = [sync_step(scheduler) for _ in range(3)]
    assert [o.num_spec_tokens_to_schedule for o in outputs] == [1, 1, 1]  # the table's K at 4
    assert all(len(o.num_scheduled_tokens) == 4 for o in outputs)  # the requests run
    scheduler.shutdown()


# -- in fallback on the engine's own setting, the scheduler is vLLM's -------------------------


@pytest.mark.parametrize("pp_size", [1, 3])
def test_fallback_schedules_every_step_as_vllm_under_async_preemption(
    tiny_model: str, pp_size: int
) -> None:
    """vLLM's reset-under-KV-pressure scenario, step by step, against vLLM's AsyncScheduler."""
    from scheduler_support import reset_under_kv_pressure
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    runs = []
    for cls in (AsyncScheduler, _specctl()):
        scheduler = _async_kv_pressure_scheduler(cls, tiny_model, 3)
        steps: list[Any] = []
        schedule = scheduler.schedule

        def recording_schedule(*args: Any, _schedule: Any = schedule, _steps: Any = steps) -> Any:
            output = _schedule(*args)
            _steps.append(
                (
                    dict(output.num_scheduled_tokens),
                    {k: list(v) for k, v in output.scheduled_spec_decode_tokens.items()},
                    output.num_spec_tokens_to_schedule,
                    sorted(output.preempted_req_ids or ()),
                )
            )
            return output

        scheduler.schedule = recording_schedule
        reset_under_kv_pressure(scheduler, pp_size)
        runs.append(steps)
        if cls is not AsyncScheduler:
            scheduler.shutdown()
    assert len(runs[0]) > 20
    assert runs[1] == runs[0]
