"""Build vLLM schedulers (vLLM's own and specctl's) from a real config, with no model runner.

Like vLLM's scheduler tests: a ``VllmConfig`` for the tiny model with the
n-gram drafter, a KV cache config of plain full-attention blocks, and the
model runner's part played by the test (sampled tokens, drafts). Nothing
here starts an engine.
"""

from __future__ import annotations

from typing import Any

BLOCK_SIZE = 16
MAX_MODEL_LEN = 2048


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
) -> Any:
    import torch
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=model_path, dtype="float32", max_model_len=MAX_MODEL_LEN)
    parallel_config = ParallelConfig(data_parallel_size=data_parallel_size)
    speculative_config = SpeculativeConfig(
        method="ngram",
        num_speculative_tokens=num_speculative_tokens,
        prompt_lookup_max=3,
        prompt_lookup_min=1,
        target_model_config=model_config,
        target_parallel_config=parallel_config,
        num_speculative_tokens_per_batch_size=per_batch_size,
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
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer.0"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32
                ),
            )
        ],
    )
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
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
