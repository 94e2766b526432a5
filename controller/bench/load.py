"""Closed-loop load through vLLM's OpenAI-compatible completions API.

Every client belongs to one workload class and keeps one request of it in
flight: when a response arrives it sends the next. Classes have their own
clients (a phase's concurrency is split over them by share), so a class that
speeds up does not change how many requests another class has running, and a
class's tokens per second add up to the engine's.

Prompts are sent as token ids, so prompt lengths are exact: texts from the
class's source are tokenized with the model's tokenizer and concatenated in a
random order, then cut, to a length drawn in ``prompt_tokens``. Requests name
their class in ``vllm_xargs``, as production clients do, and generate
``max_tokens`` tokens to the end (``ignore_eos``). Each client draws its
prompts, lengths and sampling seeds from its own seeded generator, so every
policy measured in a phase sees the same sequence of requests.

Clients start in steady state. Started together with full-length requests,
a phase's clients are a cohort: nobody finishes, so nobody prefills, until
the shortest output is done (64 rounds in the shipped workloads, about 10 s
at a concurrency of 32 on the testbed). A segment measured a few seconds in
would see a fraction of the prefill a running server does, and a learning
policy's segment, measured after its longer warm-up, the full share: the
static arms would be measured on cheaper steps. So each client's first
request generates what a request in flight at a random instant still has to
generate (:func:`residual_output_tokens`), and the engine prefills at its
steady rate from the first seconds.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.bench.workload import BUILTIN_PROMPTS, ClassSpec

BUILTIN_TEXTS = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Speculative decoding drafts tokens that the target model verifies in one pass.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "SELECT name, count(*) FROM orders GROUP BY name ORDER BY 2 DESC;",
    "Goodput is the number of committed tokens per second of engine time.",
    "Once upon a time, in a city by the sea, there lived an old clockmaker.",
    '{"workload_class": "chat", "max_tokens": 128, "temperature": 0.7}',
    "Summarize the following report in three sentences for a busy reader.",
    "Translate into French: the weather is nice today and the market is open.",
    "0123456789 abcdefghij klmnopqrst uvwxyz ABCDEFGHIJ",
    "Question: what is the capital of Australia? Answer step by step.",
    "Dear team, the deployment is scheduled for Friday at noon; please review.",
)


def read_prompts(source: str) -> list[str]:
    """The texts of a class's prompt source: built in, a .txt (a prompt per non-empty
    line) or a .jsonl file (one object per line with a ``prompt`` string)."""
    if source == BUILTIN_PROMPTS:
        return list(BUILTIN_TEXTS)
    path = Path(source)
    texts: list[str] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise ValueError(f"{path}:{n}: needs an object with a 'prompt' string")
            texts.append(obj["prompt"])
        else:
            texts.append(line)
    if not texts:
        raise ValueError(f"{path}: no prompts")
    return texts


def residual_output_tokens(rng: random.Random, low: int, high: int) -> int:
    """Tokens left to generate for a request found in flight at a random instant, when
    output lengths are uniform in ``[low, high]``.

    A random instant falls in a request with probability proportional to its length
    (draw the length size-biased), and anywhere along it (draw what is left
    uniformly): ``P(left = r) = P(length >= r) / E[length]``, the renewal process's
    residual life.
    """
    while True:
        length = rng.randint(low, high)
        if rng.random() * high < length:
            return rng.randint(1, length)


class PromptPool:
    """Tokenized prompt texts of one class, and prompts of a drawn length made from them."""

    def __init__(self, texts: Sequence[str], tokenizer: Any, spec: ClassSpec) -> None:
        self.spec = spec
        self.texts = list(texts)
        self.ids = [list(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
        if not any(self.ids):
            raise ValueError(f"class {spec.name}: its prompts tokenize to nothing")

    def draw(self, rng: random.Random) -> list[int] | str:
        """Token ids of a length in ``prompt_tokens``; without it, one text as written."""
        if self.spec.prompt_tokens is None:
            return rng.choice(self.texts)
        length = rng.randint(*self.spec.prompt_tokens)
        out: list[int] = []
        while len(out) < length:
            out += rng.choice(self.ids)
        return out[:length]


@dataclass
class ClassStats:
    completed: int = 0
    failed: int = 0
    output_tokens: int = 0
    errors: list[str] = field(default_factory=list)


class LoadGenerator:
    """Runs clients per class against one server until told to stop."""

    def __init__(
        self,
        base_url: str,
        model: str,
        classes: Sequence[ClassSpec],
        pools: Mapping[str, PromptPool],
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.classes = {c.name: c for c in classes}
        self.pools = pools

    def _body(self, spec: ClassSpec, rng: random.Random, *, first: bool) -> dict[str, Any]:
        """A request of ``spec``; a client's ``first`` one as if found in flight."""
        prompt = self.pools[spec.name].draw(rng)
        low, high = spec.output_tokens
        max_tokens = residual_output_tokens(rng, low, high) if first else rng.randint(low, high)
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "seed": rng.randrange(2**31),
            **dict(spec.sampling),
            "vllm_xargs": {"workload_class": spec.name},
        }

    async def run(
        self, clients: Mapping[str, int], seed: Sequence[int], stop: asyncio.Event
    ) -> dict[str, ClassStats]:
        """Closed loop until ``stop`` is set; in-flight requests are then cancelled (the
        server aborts them). ``seed`` seeds every client's generator with its class and
        index, so the request sequence depends on the seed, not on the policy."""
        import aiohttp

        stats = {name: ClassStats() for name in clients}
        timeout = aiohttp.ClientTimeout(total=600)
        connector = aiohttp.TCPConnector(limit=0)

        async def client(session: aiohttp.ClientSession, name: str, index: int) -> None:
            spec = self.classes[name]
            rng = random.Random(f"{'/'.join(map(str, seed))}/{name}/{index}")
            s = stats[name]
            first = True
            while not stop.is_set():
                body = self._body(spec, rng, first=first)
                first = False
                try:
                    async with session.post(f"{self.base_url}/v1/completions", json=body) as r:
                        payload = await r.json(content_type=None)
                        if r.status != 200:
                            s.failed += 1
                            if len(s.errors) < 5:
                                s.errors.append(f"HTTP {r.status}: {str(payload)[:300]}")
                            await asyncio.sleep(0.5)
                            continue
                except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                    if stop.is_set():
                        return
                    s.failed += 1
                    if len(s.errors) < 5:
                        s.errors.append(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.5)
                    continue
                s.completed += 1
                s.output_tokens += int(payload.get("usage", {}).get("completion_tokens", 0))

        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            tasks = [
                asyncio.create_task(client(session, name, i))
                for name, n in clients.items()
                for i in range(n)
            ]
            await stop.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return stats


def load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
