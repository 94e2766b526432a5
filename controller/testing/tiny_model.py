"""A tiny random Llama with a byte-level BPE tokenizer, built locally in seconds.

Tests and the engine benchmark's built-in ``tiny`` model need a real model
that vLLM's CPU build can load, and no model can be downloaded. A random
2-layer Llama is enough: under greedy decoding it falls into loops, so n-gram
drafts are often accepted, while at temperature 1.0 its output is noise and
they almost never are, which gives two workload classes with very different
best arms. head_dim is 64 because the CPU attention kernels reject smaller heads.
"""

from __future__ import annotations

import json
from pathlib import Path

from specctl.demo.tokenizer import MAX_MODEL_LEN, build_tokenizer

SEED = 0
HIDDEN_SIZE = 128
NUM_HEADS = 2
HEAD_DIM = 64  # vLLM's CPU attention kernels reject smaller heads
NUM_LAYERS = 2
_MARKER = "specctl-tiny-model.json"


def build_tiny_model(path: str | Path) -> Path:
    """Write the model and tokenizer to ``path`` (a directory) unless already there."""
    out = Path(path)
    marker = out / _MARKER
    if marker.exists():
        return out

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    fast = build_tokenizer()
    fast.save_pretrained(out)

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=4 * HIDDEN_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    marker.write_text(json.dumps({"seed": SEED, "vocab_size": len(fast)}))
    return out


if __name__ == "__main__":
    import sys

    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama"))
