"""A workaround for a vLLM CPU-build bug that breaks sampled requests under speculative decoding.

In vLLM 0.32's CPU build, the stand-in for the Triton ``expand_kernel``
(``vllm/utils/cpu_triton_utils.py``, ``_expand_kernel_impl``) converts its
output buffer to int64 with ``.to()``, which makes a copy for float and int32
buffers: the kernel fills the copy and the caller's buffer is never written.
The rejection sampler uses that kernel to spread each request's temperature,
top-k and top-p over its draft tokens, so whenever a batch holds a request with
temperature > 0, the target's logits for the verified tokens are divided by
uninitialized memory (upstream: vllm-project/vllm issue 55005, fix proposed in
pull request 55006). Measured here: a greedy request batched with temperature
1.0 requests no longer produces its greedy text (the ``draft_model`` and
``ngram`` drafters alike), its acceptance falls from 0.75 to about 0.2, and the
sampled requests are verified against a distribution that is not theirs. No
engine without speculative decoding, and no batch of greedy requests only, is
affected; GPU builds run the real Triton kernel.

:class:`CpuSpecDecodeFixes` is a vLLM worker extension: naming it in
``worker_extension_cls`` makes vLLM import this module in its worker process,
which replaces the rejection sampler's ``expand_batch_to_tokens`` (the one
caller of that kernel) with an implementation in plain torch that computes what
the Triton kernel does (the replacement applied at the input's dtype, before
the store). It does so only on the CPU platform and only
while the shim still has the bug, so it is a no-op elsewhere and once fixed.
"""

from __future__ import annotations

import inspect
from typing import Any

WORKER_EXTENSION = "specctl.demo.vllm_cpu_fixes.CpuSpecDecodeFixes"


def expand_batch_to_tokens(
    x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: Any = 0, replace_to: Any = 0
) -> Any:
    """``out[t] = x[r]`` for every token t of request r (``cu_num_tokens`` is the running
    count of tokens per request), with ``replace_from`` rewritten to ``replace_to``: what
    vLLM's ``expand_batch_to_tokens`` returns with its Triton ``expand_kernel``."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(values, counts, output_size=num_tokens)


def expand_shim_is_broken() -> bool:
    """Whether this vLLM's CPU stand-in for ``expand_kernel`` drops its output."""
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return False
    impl = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if impl is None:
        return False
    try:
        source = inspect.getsource(impl)
    except (OSError, TypeError):
        return False
    return "_ensure_int64(output)" in source


def apply() -> bool:
    """Patch the rejection sampler in this process if needed; returns whether it did."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or not expand_shim_is_broken():
        return False
    from vllm.v1.sample import rejection_sampler

    if getattr(rejection_sampler, "_specctl_expand_fixed", False):
        return True
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    rejection_sampler._specctl_expand_fixed = True  # type: ignore[attr-defined]
    return True


class CpuSpecDecodeFixes:
    """Worker extension (``worker_extension_cls``) whose import applies the fix; no methods."""


APPLIED = apply()
