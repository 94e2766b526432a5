"""A tiny random Llama with a byte-level BPE tokenizer, built locally in seconds.

Tests and the demo need a real model that vLLM's CPU build can load, and no
model can be downloaded. A random 2-layer Llama is enough: under greedy
decoding it falls into loops, so n-gram drafts are often accepted, while at
temperature 1.0 its output is noise and they almost never are, which gives two
workload classes with very different best arms. head_dim is 64 because the CPU
attention kernels reject smaller heads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SEED = 0
VOCAB_SIZE = 512
HIDDEN_SIZE = 128
NUM_HEADS = 2  # head_dim 64
NUM_LAYERS = 2
MAX_MODEL_LEN = 2048
_MARKER = "specctl-tiny-model.json"
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens that the target model verifies in one pass.",
    "def add(a, b):\n    return a + b\n",
    "SELECT name, count(*) FROM requests GROUP BY name ORDER BY 2 DESC;",
    "Goodput is committed tokens per second of engine time, not acceptance.",
    "Once upon a time there was a scheduler that never waited on its controller.",
    '{"workload_class": "chat", "temperature": 0.7, "max_tokens": 128}',
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few strings (deterministic), as a fast tokenizer.

    Byte-level, so any text encodes; ``<s>``, ``</s>`` and ``<unk>`` are its special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=MAX_MODEL_LEN,
    )


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
