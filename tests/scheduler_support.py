"""Build vLLM schedulers (vLLM's own and specctl's) from a real config, with no model runner.

Like vLLM's scheduler tests: a ``VllmConfig`` for the tiny model with the
n-gram drafter (or the tiny model as its own ``draft_model``), a KV cache
config of plain full-attention blocks, and the model runner's part played
by the test (sampled tokens, drafts). Nothing here starts an engine.
"""

from __future__ import annotations

from typing import Any

from specctl.testing.scheduler_driver import BLOCK_SIZE, kv_cache_config
from specctl.testing.tiny_model import MAX_MODEL_LEN


def build_scheduler(
    scheduler_cls: type,
    model_path: str,
    *,
    num_speculative_tokens: int = 4,
    async_scheduling: bool = False,
    data_parallel_size: int = 1,
    enable_prefix_caching: bool = False,
    num_blocks: int = 2000,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    per_batch_size: list[tuple[int, int, int]] | None = None,
    cudagraph_mode: str | None = None,
    method: str = "ngram",
    draft_sample_method: str = "greedy",
) -> Any:
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=model_path, dtype="float32", max_model_len=MAX_MODEL_LEN)
    parallel_config = ParallelConfig(data_parallel_size=data_parallel_size)
    speculative_config = (
        SpeculativeConfig(
            method=method,
            num_speculative_tokens=num_speculative_tokens,
            target_model_config=model_config,
            target_parallel_config=parallel_config,
            num_speculative_tokens_per_batch_size=per_batch_size,
            **(
                {"prompt_lookup_max": 3, "prompt_lookup_min": 1}
                if method == "ngram"
                # the target is its own draft: the scheduler never runs either
                else {"model": model_path, "draft_sample_method": draft_sample_method}
            ),
        )
        if num_speculative_tokens > 0
        else None
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=False,
        ),
        parallel_config=parallel_config,
        cache_config=CacheConfig(
            block_size=BLOCK_SIZE, enable_prefix_caching=enable_prefix_caching
        ),
        speculative_config=speculative_config,
    )
    # The CPU platform turns async scheduling off; the scheduler code is the same.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    if cudagraph_mode is not None:
        # The CPU platform turns CUDA graphs off; set the mode a GPU engine would run.
        from vllm.config import CUDAGraphMode

        vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode[cudagraph_mode]
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config(num_blocks),
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
    )


def make_request(
    req_id: str,
    prompt: list[int],
    *,
    workload_class: str | None = None,
    max_tokens: int = 16,
    resumable: bool = False,
) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    extra = {"workload_class": workload_class} if workload_class is not None else None
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra
    )
    return Request(
        req_id,
        list(prompt),
        params,
        None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
        resumable=resumable,
    )


def model_output(output: Any, accepted: int | None = None) -> Any:
    """What a model runner returns for ``output``: every draft accepted (or ``accepted``)."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for req_id in req_ids:
        scheduled = output.num_scheduled_tokens[req_id]
        drafts = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
        n = drafts if accepted is None else min(accepted, drafts)
        sampled.append([7] * (n + 1) if scheduled >= 1 else [])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def sync_step(scheduler: Any, accepted: int | None = None) -> Any:
    """One synchronous step: schedule, model output, drafts of the step's K (ids 7)."""
    from vllm.v1.outputs import DraftTokenIds

    output = scheduler.schedule()
    scheduler.update_from_output(output, model_output(output, accepted))
    req_ids = [r for r in output.num_scheduled_tokens if r in scheduler.requests]
    k = output.num_spec_tokens_to_schedule
    scheduler.update_draft_token_ids(DraftTokenIds(req_ids, [[7] * k for _ in req_ids]))
    return output


class Pipeline:
    """vLLM's engine core with a batch queue, over a scheduler, with the runner's own view.

    Schedules until ``depth`` steps are in flight, then hands the oldest one
    its model output, as ``EngineCore.step_with_batch_queue`` does; with
    ``depth`` > 1 a preempted request can still have output on its way. The
    runner keeps its own (length, computed) per request from what the
    scheduler sends it, so a token delivered for a position the runner has
    since resampled shows: each emitted token is unique and remembers the
    position it was sampled for.
    """

    def __init__(self, scheduler: Any, depth: int, accept: Any) -> None:
        from collections import deque

        self.scheduler = scheduler
        self.depth = depth
        self.accept = accept  # (step, req_id, drafts) -> accepted drafts
        self.in_flight: deque[tuple[Any, list[tuple[str, int, int]]]] = deque()
        self.runner: dict[str, list[int]] = {}
        self.emitted: dict[str, list[int]] = {}
        self.position: dict[int, int] = {}
        self.steps = 0
        self._next_token = 1000

    def _schedule(self) -> None:
        output = self.scheduler.schedule()
        self.steps += 1
        new = [
            (r.req_id, len(r.prefill_token_ids or r.prompt_token_ids or ()), r.num_computed_tokens)
            for r in output.scheduled_new_reqs
        ]
        self.in_flight.append((output, new))

    def _process_oldest(self) -> None:
        from vllm.v1.outputs import ModelRunnerOutput

        output, new = self.in_flight.popleft()
        for req_id in (*(output.preempted_req_ids or ()), *(output.finished_req_ids or ())):
            self.runner.pop(req_id, None)
        for req_id, length, computed in new:
            self.runner[req_id] = [length, computed]
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            view = self.runner.get(req_id)
            if view is None:
                sampled.append([])
                continue
            end = view[1] + output.num_scheduled_tokens[req_id]
            if end < view[0]:
                view[1] = end  # a prefill chunk: nothing sampled
                sampled.append([])
                continue
            drafts = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
            accepted = min(self.accept(self.steps, req_id, drafts), drafts) if drafts else 0
            tokens = list(range(self._next_token, self._next_token + 1 + accepted))
            self._next_token += len(tokens)
            view[1] = end - (drafts - accepted)
            view[0] = view[1] + 1
            for i, token in enumerate(tokens):
                self.position[token] = view[0] - len(tokens) + i
            self.emitted.setdefault(req_id, []).extend(tokens)
            sampled.append(tokens)
        self.scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=sampled,
            ),
        )

    def run(self, before_step: Any = None, max_steps: int = 2000) -> None:
        scheduler = self.scheduler
        for i in range(max_steps):
            if not scheduler.has_requests() and not self.in_flight:
                return
            if before_step is not None:
                before_step(i, self)
            if scheduler.has_requests() and len(self.in_flight) < self.depth:
                self._schedule()
                if len(self.in_flight) < self.depth:
                    continue
            if self.in_flight:
                self._process_oldest()
        raise AssertionError("the engine loop did not finish")


def reset_under_kv_pressure(scheduler: Any, pp_size: int) -> list[str]:
    """vLLM's test_reset_prefix_cache_with_inflight_output_under_kv_pressure, on ``scheduler``.

    ``scheduler`` is an async scheduler built with 5 blocks of 16 tokens and 3
    speculative tokens. Returns what went wrong (nothing: an empty list).
    """
    scheduler.use_v2_model_runner = True
    scheduler.pp_size = pp_size
    scheduler.use_pp = pp_size > 1
    requests = [make_request(str(i), [i] * 8, max_tokens=24) for i in range(8)]
    pending = list(requests)
    for _ in range(2):
        scheduler.add_request(pending.pop(0))
    reset_steps = {6, 14} if pp_size == 1 else {6, 7, 18, 19}

    def before_step(step: int, pipeline: Pipeline) -> None:
        if pending:
            scheduler.add_request(pending.pop(0))
        if step in reset_steps and (pipeline.in_flight or scheduler.running):
            scheduler.reset_prefix_cache(reset_running_requests=True)

    pipeline = Pipeline(
        scheduler, pp_size + 1, lambda step, req_id, n: (step + int(req_id)) % (n + 1)
    )
    problems: list[str] = []
    try:
        pipeline.run(before_step)
    except AssertionError as exc:
        return [f"{type(exc).__name__}: {exc}"]
    for request in requests:
        rid = request.request_id
        if not request.is_finished() or request.num_output_tokens != 24:
            problems.append(f"{rid}: {request.num_output_tokens} tokens, {request.status}")
        emitted = iter(pipeline.emitted.get(rid, ()))
        if not all(token in emitted for token in request.output_token_ids):
            problems.append(f"{rid}: tokens out of order or twice")
        for i, token in enumerate(request.output_token_ids):
            if pipeline.position[token] != request.num_prompt_tokens + i:
                problems.append(f"{rid}: output {i} was sampled for another position")
                break
        if request.num_stale_output_tokens != 0:
            problems.append(f"{rid}: num_stale_output_tokens={request.num_stale_output_tokens}")
    return problems
