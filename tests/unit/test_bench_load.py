"""The benchmark's clients start as if the closed loop had been running."""

from __future__ import annotations

import random

import numpy as np

from specctl.bench.load import LoadGenerator, PromptPool, residual_output_tokens
from specctl.bench.workload import ClassSpec
from specctl.demo.tokenizer import build_tokenizer


def test_residual_output_tokens_follow_the_renewal_residual_life() -> None:
    rng = random.Random(7)
    low, high = 64, 128
    draws = np.array([residual_output_tokens(rng, low, high) for _ in range(40_000)])
    lengths = np.arange(low, high + 1)
    mean_length = lengths.mean()
    # P(left = r) = P(length >= r) / E[length], r = 1..high
    r = np.arange(1, high + 1)
    survival = np.array([(lengths >= v).mean() for v in r])
    expected = survival / mean_length
    assert abs(expected.sum() - 1.0) < 1e-9
    assert draws.min() >= 1 and draws.max() <= high
    # the mean is (E[L^2] + E[L]) / (2 E[L]): 50.3 here, where a full request averages 96
    assert abs(draws.mean() - float((r * expected).sum())) < 0.6
    observed = np.bincount(draws, minlength=high + 1)[1:] / draws.size
    # below the shortest length every residual is equally likely, then it falls to 0
    assert np.abs(observed - expected).max() < 0.003


def test_only_a_clients_first_request_is_found_in_flight() -> None:
    spec = ClassSpec("c", 1.0, {"temperature": 0.0}, prompt_tokens=(4, 8), output_tokens=(64, 128))
    pool = PromptPool(["some text to cut prompts from"], build_tokenizer(), spec)
    generator = LoadGenerator("http://unused", "model", [spec], {"c": pool})
    rng = random.Random(3)
    first = [generator._body(spec, rng, first=True)["max_tokens"] for _ in range(2000)]
    later = [generator._body(spec, rng, first=False)["max_tokens"] for _ in range(2000)]
    assert min(later) >= 64 and max(later) <= 128
    assert np.mean(first) < 60 and min(first) < 64
