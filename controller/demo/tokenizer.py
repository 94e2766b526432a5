"""A byte-level BPE tokenizer trained on a few strings, built locally in seconds.

The tiny test model and the testbed models share it: no tokenizer can be
downloaded, and a byte-level one encodes any text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 512
MAX_MODEL_LEN = 2048
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
