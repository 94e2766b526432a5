"""The testbed models (specctl.demo.testbed_model), checked without starting vLLM.

The target must be the documented shape (its size is what puts a CPU in the
GPU-like regime, docs/testbed.md), the draft must be the target's own
embeddings, first layer, norm and head (vLLM's draft_model method needs the same
vocabulary and tokenizer), and the draft must agree with the target often under
greedy decoding, or the testbed would show nothing about speculation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specctl.demo.testbed_model import (
    HEAD_DIM,
    TestbedConfig,
    build_testbed_models,
    draft_state_dict,
)

CONFIG = TestbedConfig()


def _tensors(model_dir: str | Path) -> dict[str, object]:
    from safetensors import safe_open

    out = {}
    with safe_open(str(Path(model_dir) / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            out[name] = f.get_tensor(name)
    return out


def _expected_parameters(config: TestbedConfig, num_layers: int, vocab: int) -> int:
    h, i = config.hidden_size, config.intermediate_size
    per_layer = 4 * h * h + 3 * h * i + 2 * h  # q, k, v, o; gate, up, down; two norms
    return num_layers * per_layer + 2 * vocab * h + h  # embeddings, lm_head, final norm


def test_configs_load_and_describe_the_testbed(testbed_models: tuple[str, str]) -> None:
    from transformers import AutoConfig, AutoTokenizer

    target_dir, draft_dir = testbed_models
    target, draft = AutoConfig.from_pretrained(target_dir), AutoConfig.from_pretrained(draft_dir)
    for c, layers in ((target, CONFIG.num_layers), (draft, CONFIG.draft_layers)):
        assert c.model_type == "llama"
        assert c.num_hidden_layers == layers
        assert c.hidden_size == CONFIG.hidden_size
        assert c.intermediate_size == CONFIG.intermediate_size
        assert c.hidden_size // c.num_attention_heads == HEAD_DIM  # the CPU kernels need 64
        assert c.tie_word_embeddings is False
    # vLLM's draft_model method requires one vocabulary (and here one tokenizer).
    assert target.vocab_size == draft.vocab_size
    t_tok, d_tok = (
        AutoTokenizer.from_pretrained(target_dir),
        AutoTokenizer.from_pretrained(draft_dir),
    )
    assert len(t_tok) == target.vocab_size
    assert t_tok.get_vocab() == d_tok.get_vocab()
    text = "Speculative decoding drafts tokens."
    assert t_tok(text).input_ids == d_tok(text).input_ids
    assert t_tok.decode(t_tok(text).input_ids, skip_special_tokens=True) == text


def test_parameter_counts_and_shared_weights(testbed_models: tuple[str, str]) -> None:
    import torch

    target_dir, draft_dir = testbed_models
    target, draft = _tensors(target_dir), _tensors(draft_dir)
    vocab = json.loads((Path(target_dir) / "config.json").read_text())["vocab_size"]
    assert sum(t.numel() for t in target.values()) == _expected_parameters(  # type: ignore[attr-defined]
        CONFIG, CONFIG.num_layers, vocab
    )
    assert sum(t.numel() for t in draft.values()) == _expected_parameters(  # type: ignore[attr-defined]
        CONFIG, CONFIG.draft_layers, vocab
    )
    assert all(t.dtype == torch.float32 for t in target.values())  # type: ignore[attr-defined]

    # Every draft tensor is the target's, bit for bit; nothing else is in the draft.
    assert set(draft) == set(draft_state_dict(target, CONFIG.draft_layers))
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= set(draft)
    for name, tensor in draft.items():
        assert torch.equal(tensor, target[name]), name  # type: ignore[arg-type]

    # The layers the draft skips only nudge the residual stream: their output projections
    # are the initializer's scale times residual_scale, the first layer's are not scaled.
    std0 = target["model.layers.0.self_attn.o_proj.weight"].std().item()  # type: ignore[attr-defined]
    for layer in range(CONFIG.draft_layers, CONFIG.num_layers):
        for proj in ("self_attn.o_proj", "mlp.down_proj"):
            std = target[f"model.layers.{layer}.{proj}.weight"].std().item()  # type: ignore[attr-defined]
            assert std == pytest.approx(CONFIG.residual_scale * std0, rel=0.05), (layer, proj)
        q = target[f"model.layers.{layer}.self_attn.q_proj.weight"].std().item()  # type: ignore[attr-defined]
        assert q == pytest.approx(std0, rel=0.05)


def test_draft_agrees_with_the_target_under_greedy_decoding(
    testbed_models: tuple[str, str],
) -> None:
    # Teacher-forced on the target's own greedy continuation: how often the draft's argmax
    # is the target's, the first-position acceptance of greedy speculation.
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    target_dir, draft_dir = testbed_models
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = LlamaForCausalLM.from_pretrained(target_dir).eval()
    draft = LlamaForCausalLM.from_pretrained(draft_dir).eval()
    agree = total = 0
    with torch.no_grad():
        for prompt in ("The quick brown fox", "def add(a, b):", "Goodput is"):
            ids = tok(prompt, return_tensors="pt").input_ids
            seq = target.generate(ids, max_new_tokens=24, do_sample=False)
            n = ids.shape[1]
            t_next = target(seq).logits[0, n - 1 : -1].argmax(-1)
            d_next = draft(seq).logits[0, n - 1 : -1].argmax(-1)
            agree += int((t_next == d_next).sum())
            total += t_next.numel()
    assert agree / total >= 0.5, f"draft agrees with the target on {agree}/{total} tokens"


def test_cached_by_configuration(tmp_path: Path) -> None:
    small = TestbedConfig(hidden_size=128, num_layers=2, seed=1)
    target, draft = build_testbed_models(tmp_path, small)
    weights = target / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert build_testbed_models(tmp_path, small) == (target, draft)
    assert weights.stat().st_mtime_ns == mtime, "the same configuration was rebuilt"
    marker = json.loads((tmp_path / "specctl-testbed.json").read_text())
    assert marker["config"]["hidden_size"] == 128
    assert marker["target_parameters"] == _expected_parameters(small, 2, marker["vocab_size"])

    other = TestbedConfig(hidden_size=128, num_layers=3, seed=1)
    build_testbed_models(tmp_path, other)
    assert json.loads((tmp_path / "specctl-testbed.json").read_text())["config"]["num_layers"] == 3
    assert len([n for n in _tensors(target) if n.endswith("mlp.down_proj.weight")]) == 3


def test_invalid_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 64"):
        TestbedConfig(hidden_size=100)
    with pytest.raises(ValueError, match="draft_layers"):
        TestbedConfig(num_layers=2, draft_layers=2)
    with pytest.raises(ValueError, match="residual_scale"):
        TestbedConfig(residual_scale=2.0)
