"""Workload files of the real-engine benchmark: what the engine serves, what is sent, and when.

A workload file is TOML (format and an example in docs/engine-bench.md). It
names the model (the built-in testbed or tiny model, built at run time, or a
local directory), vLLM's speculative configuration, the workload classes
(sampling parameters, prompt source and lengths, output lengths, share of the
concurrent clients), the load phases (concurrency over time) and the
benchmark's settings (repetitions, warm-up, which policies and static arms).

:func:`load_workload` parses it with :mod:`tomllib` and validates every key:
an unknown key or a bad value raises :class:`WorkloadError` naming the file,
the key (``class[1].sampling.temperature``) and what is wrong, so a typo in a
long file never silently falls back to a default.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from specctl.arms import ArmError, parse_arm
from specctl.steps import validate_class_name

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
_PHASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_DEFAULT_SPECULATIVE: dict[str, dict[str, Any]] = {
    # the testbed's derived 1-layer draft model; its path is filled in at run time
    "testbed": {"method": "draft_model", "num_speculative_tokens": 4},
    # the tiny random model loops under greedy decoding, which the n-gram drafter exploits
    "tiny": {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    },
}
PACKAGED = resources.files("specctl.bench") / "workloads"


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message names the file and the key."""


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

    def arms(self) -> list[str]:
        """The arms the engine offers: ``off`` and the drafter at every K up to its maximum."""
        return ["off"] + [f"{self.drafter}/k={k}" for k in range(1, self.max_k + 1)]

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


# ---------------------------------------------------------------------------------------
# parsing and validation


class _Where:
    """Builds error messages that name the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, message: str) -> WorkloadError:
        prefix = f"{self.source}: " if self.source else ""
        sep = "" if message.startswith("=") else ": "  # "key=value: what is wrong"
        return WorkloadError(f"{prefix}{key}{sep}{message}")


def _table(w: _Where, value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise w.error(key, f"must be a table, not {type(value).__name__} {value!r}")
    return value


def _check_keys(w: _Where, table: Mapping[str, Any], key: str, known: Sequence[str]) -> None:
    for k in table:
        if k not in known:
            where = f"{key}.{k}" if key else k
            raise w.error(where, f"unknown key; known: {', '.join(sorted(known))}")


def _number(
    w: _Where,
    value: Any,
    key: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    integer: bool = False,
    lo_open: bool = False,
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise w.error(key, f"must be a number, not {value!r}")
    if integer and not isinstance(value, int):
        raise w.error(key, f"must be an integer, not {value!r}")
    if not math.isfinite(value):
        raise w.error(key, f"must be finite, not {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise w.error(key, f"={value}: must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and value > hi:
        raise w.error(key, f"={value}: must be <= {hi}")
    return value


def _int(w: _Where, value: Any, key: str, lo: int | None = None, hi: int | None = None) -> int:
    return int(_number(w, value, key, lo=lo, hi=hi, integer=True))


def _str(w: _Where, value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise w.error(key, f"must be a non-empty string, not {value!r}")
    return value


def _bool(w: _Where, value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise w.error(key, f"must be true or false, not {value!r}")
    return value


def _range(w: _Where, value: Any, key: str, lo: int) -> tuple[int, int]:
    """An int (fixed) or [min, max]."""
    if isinstance(value, list):
        if len(value) != 2:
            raise w.error(key, f"must be an integer or [min, max], not {value!r}")
        a = _int(w, value[0], f"{key}[0]", lo)
        b = _int(w, value[1], f"{key}[1]", lo)
        if b < a:
            raise w.error(key, f"={value}: max must be >= min")
        return a, b
    n = _int(w, value, key, lo)
    return n, n


def _str_list(w: _Where, value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise w.error(key, f"must be a non-empty list of strings, not {value!r}")
    return tuple(_str(w, v, f"{key}[{i}]") for i, v in enumerate(value))


def _resolve(base: Path | None, value: str) -> Path:
    p = Path(value).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    return p


def _model(w: _Where, raw: Any, base: Path | None) -> ModelSpec:
    t = _table(w, raw, "model")
    _check_keys(
        w, t, "model", ["builtin", "path", "testbed", "dtype", "max_model_len", "max_num_seqs"]
    )
    if "builtin" in t and "path" in t:
        raise w.error("model", "give either builtin or path, not both")
    builtin: str | None = None
    path: Path | None = None
    if "path" in t:
        path = _resolve(base, _str(w, t["path"], "model.path"))
    else:
        builtin = _str(w, t.get("builtin", "testbed"), "model.builtin")
        if builtin not in BUILTIN_MODELS:
            raise w.error(
                "model.builtin", f"={builtin!r}: must be one of {', '.join(BUILTIN_MODELS)}"
            )
    testbed = _table(w, t.get("testbed", {}), "model.testbed")
    if testbed:
        if builtin != "testbed":
            raise w.error("model.testbed", "only applies to builtin = 'testbed'")
        from specctl.demo.testbed_model import TestbedConfig

        known = [f for f in TestbedConfig.__dataclass_fields__ if not f.startswith("_")]
        _check_keys(w, testbed, "model.testbed", known)
        try:
            TestbedConfig(**testbed)
        except (TypeError, ValueError) as exc:
            raise w.error("model.testbed", str(exc)) from None
    dtype = _str(w, t.get("dtype", "float32"), "model.dtype")
    return ModelSpec(
        builtin=builtin,
        path=path,
        testbed=testbed,
        dtype=dtype,
        max_model_len=_int(w, t.get("max_model_len", 512), "model.max_model_len", 16),
        max_num_seqs=_int(w, t.get("max_num_seqs", 32), "model.max_num_seqs", 1),
    )


def _speculative(w: _Where, raw: Any, model: ModelSpec, base: Path | None) -> dict[str, Any]:
    if raw is None:
        if model.builtin is None:
            raise w.error(
                "speculative",
                "is required with model.path (vLLM's speculative_config: method, "
                "num_speculative_tokens, ...)",
            )
        return dict(_DEFAULT_SPECULATIVE[model.builtin])
    t = dict(_table(w, raw, "speculative"))
    method = _str(w, t.get("method"), "speculative.method")
    try:
        parse_arm(f"{method}/k=1")
    except ArmError as exc:
        raise w.error("speculative.method", str(exc)) from None
    t["num_speculative_tokens"] = _int(
        w, t.get("num_speculative_tokens"), "speculative.num_speculative_tokens", 1, 64
    )
    if "model" in t:
        t["model"] = str(_resolve(base, _str(w, t["model"], "speculative.model")))
    elif method == "draft_model" and model.builtin != "testbed":
        raise w.error("speculative.model", "is required for method 'draft_model'")
    return t


def _engine(w: _Where, raw: Any) -> tuple[str, dict[str, str], tuple[str, ...]]:
    t = _table(w, raw or {}, "engine")
    _check_keys(w, t, "engine", ["step_clock", "env", "args"])
    clock = _str(w, t.get("step_clock", "wall"), "engine.step_clock")
    if clock not in STEP_CLOCKS:
        raise w.error("engine.step_clock", f"={clock!r}: must be one of {', '.join(STEP_CLOCKS)}")
    env = _table(w, t.get("env", {}), "engine.env")
    for k, v in env.items():
        if not isinstance(v, str | int | float) or isinstance(v, bool):
            raise w.error(f"engine.env.{k}", f"must be a string or a number, not {v!r}")
    args = _str_list(w, t["args"], "engine.args") if "args" in t else ()
    return clock, {k: str(v) for k, v in env.items()}, args


def _sidecar(w: _Where, raw: Any) -> tuple[tuple[int, ...] | None, dict[str, dict[str, Any]]]:
    from specctl.policy.registry import POLICIES, make_policy

    t = _table(w, raw or {}, "sidecar")
    _check_keys(w, t, "sidecar", ["load_bucket_bounds", "params"])
    bounds: tuple[int, ...] | None = None
    if "load_bucket_bounds" in t:
        value = t["load_bucket_bounds"]
        if not isinstance(value, list) or not value:
            raise w.error("sidecar.load_bucket_bounds", f"must be a list of integers: {value!r}")
        bounds = tuple(
            _int(w, b, f"sidecar.load_bucket_bounds[{i}]", 1) for i, b in enumerate(value)
        )
        if list(bounds) != sorted(set(bounds)):
            raise w.error("sidecar.load_bucket_bounds", f"={list(bounds)}: must increase")
    params = _table(w, t.get("params", {}), "sidecar.params")
    out: dict[str, dict[str, Any]] = {}
    for name, p in params.items():
        key = f"sidecar.params.{name}"
        if name not in POLICIES or POLICIES[name].stationary:
            known = sorted(n for n, cls in POLICIES.items() if not cls.stationary)
            raise w.error(key, f"unknown policy; known: {', '.join(known)}")
        p = _table(w, p, key)
        try:
            make_policy(name, p, load_bucket_bounds=bounds)
        except ValueError as exc:
            raise w.error(key, str(exc)) from None
        out[name] = dict(p)
    return bounds, out


def _sampling(w: _Where, raw: Any, key: str) -> dict[str, float | int]:
    t = _table(w, raw, key)
    _check_keys(w, t, key, list(SAMPLING_KEYS))
    out: dict[str, float | int] = {}
    for k, v in t.items():
        kind, lo, hi = SAMPLING_KEYS[k]
        n = _number(w, v, f"{key}.{k}", lo=lo, hi=hi, integer=kind is int)
        out[k] = int(n) if kind is int else float(n)
    return out


def _class(w: _Where, raw: Any, i: int, base: Path | None) -> ClassSpec:
    key = f"class[{i}]"
    t = _table(w, raw, key)
    _check_keys(
        w, t, key, ["name", "share", "sampling", "prompts", "prompt_tokens", "output_tokens"]
    )
    name = _str(w, t.get("name"), f"{key}.name")
    problem = validate_class_name(name)
    if problem is not None:
        raise w.error(f"{key}.name", f"={name!r}: {problem}")
    share = _number(w, t.get("share", 1.0), f"{key}.share", lo=0.0, lo_open=True)
    sampling = _sampling(w, t.get("sampling", {}), f"{key}.sampling")
    prompts = _str(w, t.get("prompts", BUILTIN_PROMPTS), f"{key}.prompts")
    if prompts != BUILTIN_PROMPTS:
        path = _resolve(base, prompts)
        if path.suffix not in (".txt", ".jsonl"):
            raise w.error(
                f"{key}.prompts",
                f"={prompts!r}: must be 'builtin', a .txt file (a prompt per line) or a "
                ".jsonl file (objects with a 'prompt' string)",
            )
        if not path.is_file():
            raise w.error(f"{key}.prompts", f"={prompts!r}: no such file ({path})")
        prompts = str(path)
    prompt_tokens = (
        _range(w, t["prompt_tokens"], f"{key}.prompt_tokens", 1) if "prompt_tokens" in t else None
    )
    output = _range(w, t.get("output_tokens", 64), f"{key}.output_tokens", 1)
    return ClassSpec(name, float(share), sampling, prompts, prompt_tokens, output)


def _phase(w: _Where, raw: Any, i: int, classes: Sequence[ClassSpec]) -> PhaseSpec:
    key = f"phase[{i}]"
    t = _table(w, raw, key)
    _check_keys(w, t, key, ["name", "seconds", "concurrency"])
    name = _str(w, t.get("name", f"phase{i}"), f"{key}.name")
    if not _PHASE_NAME.match(name):
        raise w.error(f"{key}.name", f"={name!r}: must be 1-32 of [A-Za-z0-9_.-]")
    if "seconds" not in t:
        raise w.error(f"{key}.seconds", "is required (seconds measured per policy)")
    seconds = _number(w, t["seconds"], f"{key}.seconds", lo=0.0, lo_open=True)
    if "concurrency" not in t:
        raise w.error(f"{key}.concurrency", "is required (concurrent clients)")
    value = t["concurrency"]
    concurrency: int | dict[str, int]
    if isinstance(value, dict):
        names = [c.name for c in classes]
        _check_keys(w, value, f"{key}.concurrency", names)
        concurrency = {c: _int(w, n, f"{key}.concurrency.{c}", 0) for c, n in value.items()}
        if sum(concurrency.values()) < 1:
            raise w.error(f"{key}.concurrency", "needs at least one client")
    else:
        concurrency = _int(w, value, f"{key}.concurrency", 1)
    return PhaseSpec(name, float(seconds), concurrency)


def _bench(w: _Where, raw: Any, arms: Sequence[str]) -> BenchSpec:
    t = _table(w, raw or {}, "bench")
    _check_keys(
        w,
        t,
        "bench",
        [
            "repetitions",
            "warmup_s",
            "settle_s",
            "policies",
            "static_arms",
            "carry_state",
            "sample_every_s",
        ],
    )
    static_arms = None
    if "static_arms" in t:
        static_arms = _str_list(w, t["static_arms"], "bench.static_arms")
        for i, a in enumerate(static_arms):
            if a not in arms:
                raise w.error(
                    f"bench.static_arms[{i}]",
                    f"={a!r}: not an arm the engine offers ({', '.join(arms)})",
                )
    policies = None
    if "policies" in t:
        policies = _str_list(w, t["policies"], "bench.policies")
        for i, p in enumerate(policies):
            problem = policy_name_problem(p, arms)
            if problem:
                raise w.error(f"bench.policies[{i}]", f"={p!r}: {problem}")
    defaults = BenchSpec()
    return BenchSpec(
        repetitions=_int(w, t.get("repetitions", defaults.repetitions), "bench.repetitions", 1),
        warmup_s=float(_number(w, t.get("warmup_s", defaults.warmup_s), "bench.warmup_s", lo=0)),
        settle_s=float(_number(w, t.get("settle_s", defaults.settle_s), "bench.settle_s", lo=0)),
        policies=policies,
        static_arms=static_arms,
        carry_state=_bool(w, t.get("carry_state", defaults.carry_state), "bench.carry_state"),
        sample_every_s=float(
            _number(
                w,
                t.get("sample_every_s", defaults.sample_every_s),
                "bench.sample_every_s",
                lo=0.1,
            )
        ),
    )


def learning_policies() -> list[str]:
    """specctl first, then every peer the sidecar can run (all but the stationary ``static``)."""
    from specctl.policy.registry import POLICIES

    learning = (n for n, cls in POLICIES.items() if not cls.stationary)
    return sorted(learning, key=lambda n: (n != "specctl", n))


def policy_name_problem(name: str, arms: Sequence[str]) -> str | None:
    """Why the benchmark cannot run ``name`` (``static:<arm>``, ``static``, or a learning
    policy), or None."""
    if name == "static":
        return None
    if name.startswith("static:"):
        arm = name.removeprefix("static:")
        if arm not in arms:
            return f"{arm!r} is not an arm the engine offers ({', '.join(arms)})"
        return None
    known = learning_policies()
    if name not in known:
        return f"unknown policy; known: static, static:<arm>, {', '.join(known)}"
    return None


def parse_workload(data: Mapping[str, Any], source: str = "", base: Path | None = None) -> Workload:
    """Validate a parsed workload file. ``base`` resolves relative paths in it."""
    w = _Where(source)
    _check_keys(
        w,
        data,
        "",
        ["name", "description", "model", "speculative", "engine", "sidecar", "bench", "class",
         "phase"],
    )  # fmt: skip
    name = _str(w, data.get("name", Path(source).stem if source else "workload"), "name")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise w.error("description", f"must be a string, not {description!r}")
    model = _model(w, data.get("model", {}), base)
    speculative = _speculative(w, data.get("speculative"), model, base)
    step_clock, env, args = _engine(w, data.get("engine"))
    bounds, params = _sidecar(w, data.get("sidecar"))

    raw_classes = data.get("class")
    if not isinstance(raw_classes, list) or not raw_classes:
        raise w.error("class", "at least one [[class]] table is required")
    classes = tuple(_class(w, c, i, base) for i, c in enumerate(raw_classes))
    seen: set[str] = set()
    for i, c in enumerate(classes):
        if c.name in seen:
            raise w.error(f"class[{i}].name", f"={c.name!r}: appears twice")
        seen.add(c.name)
    for i, c in enumerate(classes):
        longest = (c.prompt_tokens[1] if c.prompt_tokens else 0) + c.output_tokens[1]
        if longest > model.max_model_len:
            raise w.error(
                f"class[{i}]",
                f"prompt_tokens + output_tokens can reach {longest}, above "
                f"model.max_model_len={model.max_model_len}",
            )

    raw_phases = data.get("phase")
    if not isinstance(raw_phases, list) or not raw_phases:
        raise w.error("phase", "at least one [[phase]] table is required")
    phases = tuple(_phase(w, p, i, classes) for i, p in enumerate(raw_phases))
    if len({p.name for p in phases}) != len(phases):
        raise w.error("phase", "phase names must differ")
    for i, p in enumerate(phases):
        if p.total_concurrency > model.max_num_seqs:
            raise w.error(
                f"phase[{i}].concurrency",
                f"={p.total_concurrency}: above model.max_num_seqs={model.max_num_seqs}",
            )

    workload = Workload(
        name=name,
        description=description,
        model=model,
        speculative=speculative,
        step_clock=step_clock,
        engine_env=env,
        engine_args=args,
        load_bucket_bounds=bounds,
        policy_params=params,
        bench=BenchSpec(),
        classes=classes,
        phases=phases,
        source=source,
    )
    bench = _bench(w, data.get("bench"), workload.arms())
    return Workload(**{**workload.__dict__, "bench": bench})


def packaged_workloads() -> list[str]:
    """Names of the workloads shipped with specctl (``specctl bench --workload NAME``)."""
    return sorted(
        p.name.removesuffix(".toml") for p in PACKAGED.iterdir() if p.name.endswith(".toml")
    )


def load_workload(name_or_path: str | Path) -> Workload:
    """Read a workload file, or a packaged workload by name (``demo``)."""
    path = Path(name_or_path)
    if not path.exists() and isinstance(name_or_path, str) and "/" not in name_or_path:
        packaged = PACKAGED / f"{name_or_path}.toml"
        if packaged.is_file():
            text = packaged.read_text()
            return _parse_text(text, f"{name_or_path} (packaged)", None)
        raise WorkloadError(
            f"{name_or_path}: no such file, and no packaged workload of that name "
            f"(packaged: {', '.join(packaged_workloads())})"
        )
    try:
        text = path.read_text()
    except OSError as exc:
        raise WorkloadError(f"{path}: {exc.strerror or exc}") from None
    return _parse_text(text, str(path), path.resolve().parent)


def _parse_text(text: str, source: str, base: Path | None) -> Workload:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadError(f"{source}: not valid TOML: {exc}") from None
    return parse_workload(data, source, base)
