"""Drive a real vLLM scheduler with synthetic model outputs, without a model runner.

The per-step overhead benchmark and the async-scheduling tests need vLLM's
own scheduler classes running their real code, with hundreds of requests in
decode, but no forward pass: this builds the scheduler from a real
``VllmConfig`` (the tiny model's config, the n-gram drafter) and plays the
model runner's part (sampled tokens, drafts) deterministically.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from specctl.testing.tiny_model import HEAD_DIM, MAX_MODEL_LEN, NUM_HEADS

BLOCK_SIZE = 16


def kv_cache_config(num_blocks: int) -> Any:
    """``num_blocks`` plain full-attention blocks of the tiny model's shape, no tensors.

    The scheduler only counts blocks; no model runner allocates them.
    """
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer.0"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE,
                    num_kv_heads=NUM_HEADS,
                    head_size=HEAD_DIM,
                    dtype=torch.float32,
                ),
            )
        ],
    )


@dataclass
class DriverStats:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0


class SchedulerDriver:
    """One scheduler, ``num_requests`` requests, and a fake model that accepts drafts at random.

    ``acceptance`` is the probability that each draft position is accepted
    (stopping at the first rejection), like a real verifier.
    """

    def __init__(
        self,
        scheduler_cls: type,
        model_path: str,
        *,
        num_requests: int,
        num_speculative_tokens: int = 4,
        async_scheduling: bool = False,
        acceptance: float = 0.5,
        classes: tuple[str, ...] = ("default",),
        seed: int = 0,
        prompt_len: int = 32,
        max_tokens: int = MAX_MODEL_LEN - 64,
        forward_delay_s: float = 0.0,
        method: str = "ngram",
    ) -> None:
        from vllm.config import (
            CacheConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            SpeculativeConfig,
            VllmConfig,
        )
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        max_model_len = MAX_MODEL_LEN
        model_config = ModelConfig(
            model=model_path, dtype="float32", max_model_len=max_model_len, seed=seed
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=max(num_requests, 1),
            max_num_batched_tokens=max(8192, num_requests * (prompt_len + 8)),
            max_model_len=max_model_len,
            is_encoder_decoder=False,
        )
        speculative_config = SpeculativeConfig(
            method=method,  # type: ignore[arg-type]
            num_speculative_tokens=num_speculative_tokens,
            target_model_config=model_config,
            target_parallel_config=ParallelConfig(),
            # a model drafter: the target is its own draft (no model is ever run here)
            **(
                {"prompt_lookup_max": 3, "prompt_lookup_min": 1}
                if method == "ngram"
                else {"model": model_path}
            ),
        )
        vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False),
            speculative_config=speculative_config,
        )
        # The CPU platform turns async scheduling off; the scheduler code is the same.
        vllm_config.scheduler_config.async_scheduling = async_scheduling
        blocks_per_request = (max_model_len + BLOCK_SIZE - 1) // BLOCK_SIZE
        num_blocks = num_requests * blocks_per_request + 16
        vllm_config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler: Any = scheduler_cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config(num_blocks),
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK_SIZE,
        )
        self.async_scheduling = async_scheduling
        self.k = num_speculative_tokens
        self.acceptance = acceptance
        # each step sleeps this long between schedule and output, as for a device forward
        self.forward_delay_s = forward_delay_s
        self.rng = random.Random(seed)
        self.stats = DriverStats()
        self._pending: Any = None
        self.requests = []
        for i in range(num_requests):
            params = SamplingParams(
                temperature=0.0,
                max_tokens=max_tokens,
                ignore_eos=True,
                extra_args={"workload_class": classes[i % len(classes)]},
            )
            request = Request(f"req-{i}", list(range(1, prompt_len + 1)), params, None)
            self.requests.append(request)
            self.scheduler.add_request(request)

    def step(self) -> Any:
        """schedule -> (model) -> update_from_output -> update_draft_token_ids.

        Under async scheduling the next step is scheduled before the previous
        one's output is processed, as vLLM's engine core does.
        """
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        scheduler = self.scheduler
        output = scheduler.schedule()
        if self.async_scheduling:
            output, self._pending = self._pending, output
            if output is None:
                return None
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        spec = output.scheduled_spec_decode_tokens
        rand = self.rng.random
        for req_id in req_ids:
            drafted = len(spec.get(req_id, ()))
            accepted = 0
            while accepted < drafted and rand() < self.acceptance:
                accepted += 1
            self.stats.drafted += drafted
            self.stats.accepted += accepted
            sampled.append([7] * (accepted + 1))
        if self.forward_delay_s > 0.0:
            time.sleep(self.forward_delay_s)  # the device's forward pass: the CPU waits
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        scheduler.update_from_output(output, runner_output)
        if not self.async_scheduling:
            k = output.num_spec_tokens_to_schedule
            scheduler.update_draft_token_ids(DraftTokenIds(req_ids, [[7] * k for _ in req_ids]))
        self.stats.steps += 1
        return output
