"""A target model and a draft model derived from it, for speculation that pays and then loses.

The tiny model (:mod:`specctl.testing.tiny_model`) is all per-step overhead on a
CPU, so speculation always loses on it. A GPU serving a real model is in a
different regime: decode at small batch is memory-bound (each step reads all
the weights for a handful of tokens, so verifying K more tokens is nearly free)
and at large batch compute-bound (each verified token costs its share of the
arithmetic, drafts rejected or not). A CPU shows the same two regimes once the
weights are far larger than its caches and the model's time per step is well
above vLLM's per-step overhead; that is what this target is sized for.

The draft is a 1-layer model derived from the target, so that it agrees with it
often without any training: it copies the target's embeddings, layer 0, final
norm and ``lm_head``, and the target's other layers have their output
projections (``o_proj``, ``down_proj``) scaled down, so that they only nudge the
residual stream that layer 0 wrote. Greedy decoding then accepts most drafts,
with acceptance falling with the draft position; at temperature 1.0 the two
models' distributions differ enough that few drafts are accepted.

Both directories share one byte-level BPE tokenizer (the tiny model's) and load
in vLLM as ``model=<target>`` with
``speculative_config={"method": "draft_model", "model": <draft>, ...}``.
Everything is seeded; a marker file caches the build per configuration.
See docs/testbed.md for the regime it produces and how it was chosen.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specctl.demo.tokenizer import MAX_MODEL_LEN, build_tokenizer

HEAD_DIM = 64  # vLLM's CPU attention kernels reject smaller heads
_MARKER = "specctl-testbed.json"
_BUILDER_VERSION = 1


@dataclass(frozen=True)
class TestbedConfig:
    """The target's shape and how its draft is derived. Defaults: the documented testbed."""

    __test__ = False  # not a pytest test class, despite its name

    hidden_size: int = 1024
    num_layers: int = 8
    # MLP width as a multiple of hidden_size.
    mlp_ratio: int = 4
    # o_proj and down_proj of layers 1.. are multiplied by this (layer 0 keeps its own).
    residual_scale: float = 0.05
    # Layers the draft copies from the target (0..draft_layers-1).
    draft_layers: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden_size <= 0 or self.hidden_size % HEAD_DIM:
            raise ValueError(f"hidden_size={self.hidden_size} must be a positive multiple of 64")
        if not 1 <= self.draft_layers < self.num_layers:
            raise ValueError(
                f"draft_layers={self.draft_layers} must be in 1..num_layers-1 ({self.num_layers})"
            )
        if self.mlp_ratio <= 0 or not 0.0 <= self.residual_scale <= 1.0:
            raise ValueError(
                f"mlp_ratio={self.mlp_ratio} must be > 0 and residual_scale="
                f"{self.residual_scale} in [0, 1]"
            )

    @property
    def num_heads(self) -> int:
        return self.hidden_size // HEAD_DIM

    @property
    def intermediate_size(self) -> int:
        return self.mlp_ratio * self.hidden_size

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "builder_version": _BUILDER_VERSION}


def _llama_config(config: TestbedConfig, num_layers: int, tokenizer: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )


def draft_state_dict(target_state: dict[str, Any], draft_layers: int) -> dict[str, Any]:
    """The target's tensors the draft copies: embeddings, layers < draft_layers, norm, head."""
    out = {}
    for name, tensor in target_state.items():
        if name.startswith("model.layers."):
            if int(name.split(".")[2]) >= draft_layers:
                continue
        out[name] = tensor
    return out


def build_testbed_models(
    path: str | Path, config: TestbedConfig | None = None
) -> tuple[Path, Path]:
    """Write the target and its draft under ``path``; returns ``(target_dir, draft_dir)``.

    Reuses what is there when its marker names the same configuration; otherwise
    (re)builds both. Seeded: the same configuration gives the same weights.
    """
    config = config or TestbedConfig()
    out = Path(path)
    target_dir, draft_dir = out / "target", out / "draft"
    marker = out / _MARKER
    if marker.exists():
        try:
            if json.loads(marker.read_text()).get("config") == config.to_json():
                return target_dir, draft_dir
        except (OSError, ValueError):
            pass
        marker.unlink()
    for d in (target_dir, draft_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)

    import torch
    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(config.seed)
    target = LlamaForCausalLM(_llama_config(config, config.num_layers, tokenizer))
    with torch.no_grad():
        for layer in target.model.layers[config.draft_layers :]:
            layer.self_attn.o_proj.weight.mul_(config.residual_scale)
            layer.mlp.down_proj.weight.mul_(config.residual_scale)
    target.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)

    draft = LlamaForCausalLM(_llama_config(config, config.draft_layers, tokenizer))
    missing, unexpected = draft.load_state_dict(
        draft_state_dict(target.state_dict(), config.draft_layers), strict=True
    )
    assert not missing and not unexpected, (missing, unexpected)
    draft.save_pretrained(draft_dir)
    tokenizer.save_pretrained(draft_dir)

    params = sum(p.numel() for p in target.parameters())
    draft_params = sum(p.numel() for p in draft.parameters())
    marker.write_text(
        json.dumps(
            {
                "config": config.to_json(),
                "target_parameters": params,
                "draft_parameters": draft_params,
                "vocab_size": len(tokenizer),
            }
        )
    )
    return target_dir, draft_dir


if __name__ == "__main__":
    import sys

    print(*build_testbed_models(sys.argv[1] if len(sys.argv) > 1 else "testbed-llama"))
