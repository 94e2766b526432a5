"""A mixed workload sent through vLLM's OpenAI-compatible HTTP API.

Each workload class has its own sampling temperature, which is what decides
n-gram acceptance on a tiny random model: greedy decoding loops (drafts are
accepted), temperature 1.0 does not (drafts are wasted). Requests carry their
class in ``vllm_xargs``, as production clients would.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp


@dataclass(frozen=True)
class WorkloadClass:
    name: str
    temperature: float
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"class {self.name}: temperature {self.temperature} not in [0, 2]")
        if self.weight <= 0.0:
            raise ValueError(f"class {self.name}: weight {self.weight} must be positive")


DEMO_CLASSES = (
    WorkloadClass("extract", temperature=0.0),
    WorkloadClass("chat", temperature=0.6),
    WorkloadClass("creative", temperature=1.0),
)

PROMPTS = (
    "the quick brown fox jumps over the lazy dog",
    "speculative decoding drafts tokens that the target verifies",
    "a b c d e f g h i j k l m n o p",
    "hello world hello world hello",
    "one two three four five six seven",
)


@dataclass
class PhaseResult:
    """What one phase of the workload measured."""

    name: str
    wall_s: float = 0.0
    requests: int = 0
    failed: int = 0
    output_tokens: int = 0
    tokens_by_class: dict[str, int] = field(default_factory=dict)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


async def run_phase(
    name: str,
    base_url: str,
    model: str,
    *,
    duration_s: float,
    concurrency: int,
    max_tokens: int,
    classes: Sequence[WorkloadClass] = DEMO_CLASSES,
    seed: int = 0,
    on_tick: Callable[[], None] | None = None,
) -> PhaseResult:
    """Closed loop: ``concurrency`` clients send requests until ``duration_s`` is over."""
    result = PhaseResult(name)
    rng = random.Random(seed)
    weights = [c.weight for c in classes]
    deadline = time.monotonic() + duration_s
    timeout = aiohttp.ClientTimeout(total=300)

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            cls = rng.choices(classes, weights)[0]
            body = {
                "model": model,
                "prompt": rng.choice(PROMPTS),
                "max_tokens": max_tokens,
                "temperature": cls.temperature,
                "ignore_eos": True,
                "vllm_xargs": {"workload_class": cls.name},
            }
            try:
                async with session.post(f"{base_url}/v1/completions", json=body) as resp:
                    payload = await resp.json()
                    if resp.status != 200:
                        result.failed += 1
                        continue
            except (TimeoutError, aiohttp.ClientError):
                result.failed += 1
                continue
            tokens = int(payload["usage"]["completion_tokens"])
            result.requests += 1
            result.output_tokens += tokens
            result.tokens_by_class[cls.name] = result.tokens_by_class.get(cls.name, 0) + tokens

    async def ticker() -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(2.0)
            if on_tick is not None:
                on_tick()

    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tick = asyncio.create_task(ticker())
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        tick.cancel()
    result.wall_s = time.monotonic() - start
    return result
