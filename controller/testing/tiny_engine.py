"""vLLM's offline engine on the tiny model, with specctl's scheduler and the n-gram drafter.

The engine tests and the benchmarks that record a trace or measure throughput on
the CPU build run the same engine: the tiny random Llama
(:mod:`specctl.testing.tiny_model`), n-gram drafts of up to 4 tokens, float32,
eager mode and a fixed seed. Building it in one place keeps them measuring the
same thing.
"""

from __future__ import annotations

from typing import Any

from specctl.bench.vllm_server import SCHEDULER_CLS

NGRAM: dict[str, Any] = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
MAX_MODEL_LEN = 512


def tiny_ngram_llm(model: str, *, max_num_seqs: int = 32, log_stats: bool = False) -> Any:
    """vLLM's ``LLM`` on ``model`` (a directory from ``build_tiny_model``).

    specctl's scheduler reads its settings (``SPECCTL_ADDRESS`` and the other
    ``SPECCTL_*`` variables) from the environment as the engine starts: set them
    first. ``log_stats`` keeps vLLM's own metrics for ``llm.get_metrics()``; like
    ``LLM``'s default, they are off otherwise.
    """
    from vllm import LLM

    return LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=max_num_seqs,
        seed=0,
        speculative_config=NGRAM,
        scheduler_cls=SCHEDULER_CLS,
        disable_log_stats=not log_stats,
    )
