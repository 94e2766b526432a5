"""Whether an engine can offer n-gram drafts next to its model drafter, decided at start-up.

Replacing a request's model drafts with n-gram drafts in the scheduler is
exact only where three things hold, and each is checked here against the
engine's configuration:

- the drafts pass through the scheduler: the V1 model runner with synchronous
  scheduling. Under async scheduling, and with Model Runner V2, drafts stay on
  the device and the scheduler sees placeholders; per-class K and ``off``
  still work there, the drafter choice does not;
- the model drafter's tokens are verified as deterministic proposals: greedy
  draft sampling (``draft_sample_method="greedy"``) and the standard rejection
  sampler, so no draft probabilities reach the sampler. With probabilistic
  drafting it would weigh n-gram tokens with the model's probabilities;
- the engine's drafter is a model drafter: an ``ngram``, ``ngram_gpu`` or
  ``suffix`` engine already drafts from the context.

Where one does not hold, the engine runs its model drafter alone and logs
why, once; a start-up never fails for it. Limits that are wrong whatever the
engine (an n-gram K above the engine's ``num_speculative_tokens``, which sizes
the verification buffers) are refused with a ConfigError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specctl.engine.config import ConfigError, EngineConfig
from specctl.engine.ngram import NGRAM, NgramSettings

# Drafters that already propose from the request's own context.
CONTEXT_DRAFTERS = frozenset({NGRAM, "ngram_gpu", "suffix"})


@dataclass(frozen=True)
class HybridDecision:
    """n-gram settings when the engine offers n-gram arms, else why not (empty: not asked)."""

    ngram: NgramSettings | None
    refused_because: str = ""


def decide_hybrid(vllm_config: Any, config: EngineConfig) -> HybridDecision:
    """Decide from the engine's configuration whether n-gram arms run next to its drafter."""
    spec = vllm_config.speculative_config
    method = str(spec.method)
    max_k = int(spec.num_speculative_tokens)
    if config.ngram_max_k == 0 or method in CONTEXT_DRAFTERS:
        return HybridDecision(None)
    ngram_k = max_k if config.ngram_max_k is None else config.ngram_max_k
    if ngram_k > max_k:
        raise ConfigError(
            f"ngram_max_k={ngram_k} is above the engine's num_speculative_tokens={max_k}, "
            "which sizes the verification buffers: lower SPECCTL_NGRAM_MAX_K or raise "
            "num_speculative_tokens"
        )
    settings = NgramSettings(
        ngram_k, config.ngram_prompt_lookup_min, config.ngram_prompt_lookup_max
    )
    reason = _not_exact_because(vllm_config)
    return HybridDecision(None, reason) if reason else HybridDecision(settings)


def _not_exact_because(vllm_config: Any) -> str:
    """Why substituting n-gram drafts would not be exact on this engine ("" when it is)."""
    spec = vllm_config.speculative_config
    on_device = "keeps drafts on the device, so the scheduler cannot replace them"
    if bool(vllm_config.scheduler_config.async_scheduling):
        return f"async scheduling {on_device} with n-gram drafts"
    if bool(vllm_config.use_v2_model_runner):
        return f"Model Runner V2 {on_device} with n-gram drafts"
    draft_sampling = str(getattr(spec, "draft_sample_method", "greedy"))
    if draft_sampling != "greedy":
        return (
            f"draft_sample_method={draft_sampling!r}: the rejection sampler would weigh "
            "n-gram drafts with the model drafter's probabilities, so substituting them "
            "would not be exact"
        )
    rejection = str(getattr(spec, "rejection_sample_method", "standard"))
    if rejection != "standard":
        return (
            f"rejection_sample_method={rejection!r}: substitution is exact only with the "
            "standard rejection sampler"
        )
    return ""
