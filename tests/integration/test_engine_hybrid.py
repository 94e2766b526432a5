"""n-gram drafts next to a model drafter, chosen per class, in vLLM's real scheduler.

The scheduler is built for a ``draft_model`` engine (the tiny model drafting
for itself) with no model runner; the test plays the runner: it samples the
next token of a repeating pattern and hands back model drafts of a token the
pattern never holds, so every verified draft shows where it came from.
"""

from __future__ import annotations

from typing import Any

import pytest
from scheduler_support import build_scheduler, make_request

from specctl.api import pb
from specctl.engine.config import ConfigError
from specctl.engine.policy_view import compile_policy

PERIOD = 8
MODEL_DRAFT = 999  # never in the pattern


@pytest.fixture(autouse=True)
def _no_sidecar(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("SPECCTL_ADDRESS", f"unix://{tmp_path}/nobody.sock")
    monkeypatch.setenv("SPECCTL_SEED", "0")
    monkeypatch.setenv("SPECCTL_NGRAM_PROMPT_LOOKUP_MIN", "2")
    monkeypatch.setenv("SPECCTL_NGRAM_PROMPT_LOOKUP_MAX", "4")


def _specctl() -> type:
    from specctl.engine.scheduler import SpecctlScheduler

    return SpecctlScheduler


def _pattern(position: int) -> int:
    return position % PERIOD + 1


def _pin(scheduler: Any, arms: dict[str, str]) -> None:
    entries = [
        pb.ClassPolicy(workload_class=c, load_bucket=0, arms=[a], probabilities=[1.0])
        for c, a in arms.items()
    ]
    client = scheduler.specctl_client
    client.close()
    client.view = compile_policy(
        pb.Policy(version=5, fallback_arm="draft_model/k=4", entries=entries),
        {"draft_model": 4, "ngram": 4},
    )


def _step(scheduler: Any, starts: dict[str, int] | None = None) -> Any:
    """Schedule; every draft that matches the pattern is accepted; model drafts follow.

    ``starts`` receives the position of each request's first draft.
    """
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    output = scheduler.schedule()
    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        computed = request.num_computed_tokens  # already advanced by the scheduler
        if computed < request.num_tokens:  # a prefill chunk
            sampled.append([])
            continue
        drafts = output.scheduled_spec_decode_tokens.get(req_id, [])
        start = request.num_tokens  # the position of the first draft
        if starts is not None:
            starts[req_id] = start
        tokens = []
        for i, draft in enumerate(drafts):
            if draft != _pattern(start + i):
                break
            tokens.append(draft)
        tokens.append(_pattern(start + len(tokens)))
        sampled.append(tokens)
    scheduler.update_from_output(
        output,
        ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        ),
    )
    live = [r for r in req_ids if r in scheduler.requests]
    k = output.num_spec_tokens_to_schedule
    scheduler.update_draft_token_ids(DraftTokenIds(live, [[MODEL_DRAFT] * k for _ in live]))
    return output


def _add(scheduler: Any, name: str, workload_class: str) -> None:
    prompt = [_pattern(i) for i in range(4 * PERIOD)]
    scheduler.add_request(make_request(name, prompt, workload_class=workload_class, max_tokens=200))


def test_engine_offers_its_model_drafter_and_ngram(tiny_model: str) -> None:
    scheduler = build_scheduler(_specctl(), tiny_model, method="draft_model")
    hello = scheduler.specctl_client.hello
    assert [(d.method, d.max_k) for d in hello.drafters] == [("draft_model", 4), ("ngram", 4)]
    scheduler.shutdown()


def test_each_class_verifies_the_drafts_of_its_own_drafter(tiny_model: str) -> None:
    scheduler = build_scheduler(_specctl(), tiny_model, method="draft_model")
    _pin(scheduler, {"copy": "ngram/k=3", "free": "draft_model/k=2", "none": "off"})
    for i in range(2):
        _add(scheduler, f"c{i}", "copy")
        _add(scheduler, f"f{i}", "free")
        _add(scheduler, f"n{i}", "none")
    starts: list[dict[str, int]] = [{} for _ in range(6)]
    outputs = [_step(scheduler, starts[i]) for i in range(6)]
    # the engine's drafter is asked for the model classes' K only
    assert {o.num_spec_tokens_to_schedule for o in outputs[1:]} == {2}
    for output, start in zip(outputs[1:], starts[1:], strict=True):
        drafts = output.scheduled_spec_decode_tokens
        for req_id in ("c0", "c1"):
            assert drafts[req_id] == [_pattern(start[req_id] + i) for i in range(3)]
        assert drafts["f0"] == drafts["f1"] == [MODEL_DRAFT] * 2
        assert "n0" not in drafts and "n1" not in drafts
    # what ran is what is reported: the n-gram class drafted 3 and had all 3 accepted
    from specctl.engine.recorder import RawStep

    raw = [s for s in scheduler.specctl_client.queue if isinstance(s, RawStep)]
    # each step reports the K the engine's drafter proposed in it, not the arms' (a step late)
    assert [s.record().draft_k for s in raw] == [
        o.num_spec_tokens_to_schedule for o in outputs[-len(raw) :]
    ]
    rows = raw[-1].record()
    by_class = {(c, a): (d, n) for c, a, d, n in zip(
        rows.classes, rows.arms, rows.drafted, rows.accepted, strict=True
    )}  # fmt: skip
    assert by_class[("copy", "ngram/k=3")] == (3, 3)
    assert by_class[("free", "draft_model/k=2")] == (2, 0)
    assert by_class[("none", "off")] == (0, 0)
    scheduler.shutdown()


def test_only_ngram_classes_leave_the_model_drafter_idle(tiny_model: str) -> None:
    scheduler = build_scheduler(_specctl(), tiny_model, method="draft_model")
    _pin(scheduler, {"copy": "ngram/k=4"})
    _add(scheduler, "c", "copy")
    outputs = [_step(scheduler) for _ in range(5)]
    assert {o.num_spec_tokens_to_schedule for o in outputs[1:]} == {0}
    assert len(outputs[-1].scheduled_spec_decode_tokens["c"]) == 4
    scheduler.shutdown()


def test_finished_requests_free_their_rows(tiny_model: str) -> None:
    scheduler = build_scheduler(_specctl(), tiny_model, method="draft_model")
    _pin(scheduler, {"copy": "ngram/k=2"})
    for i in range(3):
        _add(scheduler, f"c{i}", "copy")
    for _ in range(3):
        _step(scheduler)
    ngram = scheduler._specctl_ngram
    assert len(ngram._row_of) == 3
    for i in range(3):
        scheduler.finish_requests(f"c{i}", _finished_status())
    _step(scheduler)
    _step(scheduler)
    assert ngram._row_of == {}
    scheduler.shutdown()


def _finished_status() -> Any:
    from vllm.v1.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"async_scheduling": True}, "async scheduling keeps drafts on the device"),
        (
            {"draft_sample_method": "probabilistic"},
            "draft_sample_method='probabilistic': the rejection sampler would weigh",
        ),
    ],
)  # fmt: skip
def test_where_substitution_is_not_exact_the_model_drafter_runs_alone(
    tiny_model: str, kwargs: dict[str, Any], reason: str
) -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        scheduler = build_scheduler(_specctl(), tiny_model, method="draft_model", **kwargs)
    hello = scheduler.specctl_client.hello
    assert [d.method for d in hello.drafters] == ["draft_model"]
    assert scheduler._specctl_ngram is None
    refused = [e for e in logs if e["event"] == "specctl_ngram_drafts_refused"]
    assert len(refused) == 1 and reason in refused[0]["reason"], logs
    scheduler.shutdown()


def test_ngram_settings_are_checked_at_start_up(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECCTL_NGRAM_MAX_K", "6")
    with pytest.raises(ConfigError, match=r"ngram_max_k=6 is above .*num_speculative_tokens=4"):
        build_scheduler(_specctl(), tiny_model, method="draft_model")
    monkeypatch.setenv("SPECCTL_NGRAM_MAX_K", "0")
    scheduler = build_scheduler(_specctl(), tiny_model, method="draft_model")
    assert [d.method for d in scheduler.specctl_client.hello.drafters] == ["draft_model"]
    scheduler.shutdown()
    monkeypatch.setenv("SPECCTL_NGRAM_MAX_K", "2")
    monkeypatch.setenv("SPECCTL_NGRAM_PROMPT_LOOKUP_MIN", "5")
    with pytest.raises(ConfigError, match="ngram_prompt_lookup_min=5 and ngram_prompt_lookup_max"):
        build_scheduler(_specctl(), tiny_model, method="draft_model")


def test_ngram_drafts_are_vllms_matcher_over_each_requests_context() -> None:
    """Real vLLM requests, more than the buffer's first rows, contexts that grow and change."""
    import numpy as np
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens as vllm_match,
    )

    from specctl.engine.ngram import NgramDrafter, NgramSettings

    drafter = NgramDrafter(NgramSettings(4, 2, 4), max_model_len=4096)
    drafter.warm_up()
    rng = np.random.default_rng(0)
    requests = []
    for i in range(70):
        prompt = rng.integers(1, 8, size=int(rng.integers(8, 300))).tolist()
        request = make_request(f"r{i}", prompt, max_tokens=400)
        request.num_computed_tokens = request.num_tokens - 1  # as after its prefill
        requests.append(request)

    def expected(request: Any, k: int) -> list[int]:
        context = np.array(request.all_token_ids, dtype=np.int32)
        return [int(t) for t in vllm_match(context, 2, 4, 4096, k)]

    for step in range(6):
        if step == 3:  # a new request under a live id, and a session whose tokens change
            requests[5] = make_request("r5", [9, 8, 7, 9, 8], max_tokens=400)
            requests[5].num_computed_tokens = 4
            tokens = requests[6]._all_token_ids  # same length, other tokens, another last
            a, b = (1, 3) if tokens[-1] not in (1, 3) else (2, 4)
            tokens[:] = ([b, a] * len(tokens))[-len(tokens) :]
        assert drafter.draft([(4, requests[:35]), (2, requests[35:])]) == 70
        for i, request in enumerate(requests):
            assert request.spec_token_ids == expected(request, 4 if i < 35 else 2), (step, i)
        for request in requests:  # the target accepts nothing and samples a token
            request.append_output_token_ids(int(rng.integers(1, 8)))
            request.num_computed_tokens = request.num_tokens - 1
    assert sum(1 for r in requests if r.spec_token_ids) > 20  # the comparison compares drafts
    # a request in prefill gets no drafts, and loses the model's
    requests[0].num_computed_tokens = 0
    requests[0].spec_token_ids = [5, 5]
    assert drafter.draft([(4, requests[:1])]) == 0
    assert requests[0].spec_token_ids == []
    drafter.release([r.request_id for r in requests])
    assert drafter._row_of == {}
