"""A workload of the real-engine benchmark: what the engine serves, what is sent, and when.

A workload names the model (the built-in testbed or tiny model, built at run
time, or a local directory), vLLM's speculative configuration, the workload
classes (sampling parameters, prompt source and lengths, output lengths, share
of the concurrent clients), the load phases (concurrency over time) and the
benchmark's settings (repetitions, warm-up, which policies and static arms).
These are its values, checked once when the file is read
(:mod:`specctl.bench.workload_file`), so the benchmark trusts them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.engine.hybrid import CONTEXT_DRAFTERS
from specctl.engine.ngram import NGRAM

BUILTIN_MODELS = ("testbed", "tiny")
STEP_CLOCKS = ("process_cpu", "wall")
# SamplingParams fields a class may set, with their valid ranges (None: no bound).
SAMPLING_KEYS: dict[str, tuple[type, float | None, float | None]] = {
    "temperature": (float, 0.0, 2.0),
    "top_p": (float, 1e-6, 1.0),
    "top_k": (int, -1, None),
    "min_p": (float, 0.0, 1.0),
    "repetition_penalty": (float, 1e-6, None),
    "presence_penalty": (float, -2.0, 2.0),
    "frequency_penalty": (float, -2.0, 2.0),
}
BUILTIN_PROMPTS = "builtin"


@dataclass(frozen=True)
class ModelSpec:
    """The target model: a built-in one (built without downloads) or a local directory."""

    builtin: str | None = "testbed"
    path: Path | None = None
    # TestbedConfig fields for the testbed (hidden_size, num_layers, ...)
    testbed: Mapping[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    max_model_len: int = 512
    max_num_seqs: int = 32

    @property
    def label(self) -> str:
        return self.builtin if self.builtin else str(self.path)


@dataclass(frozen=True)
class ClassSpec:
    """One workload class: how its requests are sampled and how long they are."""

    name: str
    share: float
    sampling: Mapping[str, float | int]
    # "builtin", or a resolved path of a .txt (a prompt per line) or .jsonl ({"prompt": ...})
    prompts: str = BUILTIN_PROMPTS
    # prompt length in tokens, drawn uniformly in [lo, hi]; None: the prompt as written
    prompt_tokens: tuple[int, int] | None = None
    # max_tokens per request (generated to the end: ignore_eos), drawn uniformly in [lo, hi]
    output_tokens: tuple[int, int] = (64, 64)

    @property
    def temperature(self) -> float:
        return float(self.sampling.get("temperature", 1.0))


@dataclass(frozen=True)
class PhaseSpec:
    """A load phase: this many concurrent clients, for ``seconds`` of measurement."""

    name: str
    seconds: float
    # total concurrency, split over the classes by share; or clients per class
    concurrency: int | Mapping[str, int]

    def clients(self, classes: Sequence[ClassSpec]) -> dict[str, int]:
        """Clients per class. A total is split by share with largest remainders, so every
        class keeps at least one client whenever the total allows it."""
        if not isinstance(self.concurrency, int):
            return {c.name: int(self.concurrency.get(c.name, 0)) for c in classes}
        return split_by_share(self.concurrency, {c.name: c.share for c in classes})

    @property
    def total_concurrency(self) -> int:
        if isinstance(self.concurrency, int):
            return self.concurrency
        return sum(self.concurrency.values())


@dataclass(frozen=True)
class BenchSpec:
    """How the benchmark runs the workload."""

    repetitions: int = 3
    # unmeasured seconds at the start of each learning policy's segment (per phase)
    warmup_s: float = 20.0
    # unmeasured seconds at the start of each static arm's segment (ramp-up of the load)
    settle_s: float = 3.0
    # policies to run (None: every static arm, specctl and every peer)
    policies: tuple[str, ...] | None = None
    # static arms to sweep (None: every arm the engine offers)
    static_arms: tuple[str, ...] | None = None
    # learning policies keep their learned state from one of their segments to the next
    carry_state: bool = True
    # seconds between evidence samples of a learning policy (the timeline and live view)
    sample_every_s: float = 2.0


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    model: ModelSpec
    # vLLM's speculative_config; for the testbed without "model", the derived draft is used
    speculative: Mapping[str, Any]
    step_clock: str
    engine_env: Mapping[str, str]
    engine_args: tuple[str, ...]
    load_bucket_bounds: tuple[int, ...] | None
    # per policy name, sidecar policy parameters
    policy_params: Mapping[str, Mapping[str, Any]]
    bench: BenchSpec
    classes: tuple[ClassSpec, ...]
    phases: tuple[PhaseSpec, ...]
    source: str = ""

    @property
    def drafter(self) -> str:
        return str(self.speculative["method"])

    @property
    def max_k(self) -> int:
        return int(self.speculative["num_speculative_tokens"])

    @property
    def ngram_max_k(self) -> int:
        """The longest n-gram arm the engine offers next to a model drafter (0: none).

        As the engine decides it (docs/drafters.md): the engine's K unless the
        workload's ``[engine] env`` sets ``SPECCTL_NGRAM_MAX_K``; none when the
        engine's drafter already drafts from the context.
        """
        if self.drafter in CONTEXT_DRAFTERS:
            return 0
        return min(int(self.engine_env.get("SPECCTL_NGRAM_MAX_K", self.max_k)), self.max_k)

    def arms(self) -> list[str]:
        """The arms the engine offers: ``off``, the drafter at every K up to its maximum, and
        n-gram next to a model drafter."""
        arms = ["off"] + [f"{self.drafter}/k={k}" for k in range(1, self.max_k + 1)]
        return arms + [f"{NGRAM}/k={k}" for k in range(1, self.ngram_max_k + 1)]

    def static_arms(self) -> list[str]:
        return list(self.bench.static_arms) if self.bench.static_arms else self.arms()

    def to_json(self) -> dict[str, Any]:
        """The workload as it ran, with defaults filled in (for the benchmark's JSON)."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "model": {
                "builtin": self.model.builtin,
                "path": str(self.model.path) if self.model.path else None,
                "testbed": dict(self.model.testbed),
                "dtype": self.model.dtype,
                "max_model_len": self.model.max_model_len,
                "max_num_seqs": self.model.max_num_seqs,
            },
            "speculative": dict(self.speculative),
            "engine": {
                "step_clock": self.step_clock,
                "env": dict(self.engine_env),
                "args": list(self.engine_args),
            },
            "sidecar": {
                "load_bucket_bounds": list(self.load_bucket_bounds)
                if self.load_bucket_bounds
                else None,
                "params": {k: dict(v) for k, v in self.policy_params.items()},
            },
            "bench": {
                "repetitions": self.bench.repetitions,
                "warmup_s": self.bench.warmup_s,
                "settle_s": self.bench.settle_s,
                "policies": list(self.bench.policies) if self.bench.policies else None,
                "static_arms": self.static_arms(),
                "carry_state": self.bench.carry_state,
                "sample_every_s": self.bench.sample_every_s,
            },
            "classes": [
                {
                    "name": c.name,
                    "share": c.share,
                    "sampling": dict(c.sampling),
                    "prompts": c.prompts,
                    "prompt_tokens": list(c.prompt_tokens) if c.prompt_tokens else None,
                    "output_tokens": list(c.output_tokens),
                }
                for c in self.classes
            ],
            "phases": [
                {
                    "name": p.name,
                    "seconds": p.seconds,
                    "concurrency": p.concurrency
                    if isinstance(p.concurrency, int)
                    else dict(p.concurrency),
                    "clients": p.clients(self.classes),
                }
                for p in self.phases
            ],
        }


def split_by_share(total: int, shares: Mapping[str, float]) -> dict[str, int]:
    """``total`` clients over the classes in proportion to ``shares`` (largest remainders);
    while ``total`` is at least the number of classes, every class gets one."""
    names = list(shares)
    if not names:
        return {}
    weight = sum(shares.values())
    floor_each = 1 if total >= len(names) else 0
    rest = total - floor_each * len(names)
    exact = {n: rest * shares[n] / weight for n in names}
    out = {n: floor_each + math.floor(exact[n]) for n in names}
    left = total - sum(out.values())
    # ties go to the class listed first, so the split is deterministic
    order = sorted(names, key=lambda n: (-(exact[n] - math.floor(exact[n])), names.index(n)))
    for n in order[:left]:
        out[n] += 1
    return out
