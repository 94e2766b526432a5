"""Workload files of the real-engine benchmark: TOML, read and validated whole.

The format, with an example, is in docs/engine-bench.md. :func:`load_workload`
parses a file (or a packaged workload by name) with :mod:`tomllib` and checks
every table and key (:mod:`specctl.bench.workload_values`): an unknown key or a
bad value raises :class:`~.workload_values.WorkloadError` naming the file, the
key and what is wrong, before anything starts.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from specctl.arms import ArmError, parse_arm
from specctl.bench.hindsight import HINDSIGHT
from specctl.bench.policy_names import (
    learning_policy_problem,
    policy_name_problem,
    policy_params,
    registered_policy,
)
from specctl.bench.workload import (
    BUILTIN_MODELS,
    BUILTIN_PROMPTS,
    SAMPLING_KEYS,
    STEP_CLOCKS,
    BenchSpec,
    ClassSpec,
    ModelSpec,
    PhaseSpec,
    Workload,
)
from specctl.bench.workload_values import (
    Where,
    WorkloadError,
    as_bool,
    as_int,
    as_number,
    as_range,
    as_str,
    as_str_list,
    as_table,
    check_keys,
    resolve_path,
)
from specctl.steps import validate_class_name

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


def _model(w: Where, raw: Any, base: Path | None) -> ModelSpec:
    t = as_table(w, raw, "model")
    check_keys(
        w, t, "model", ["builtin", "path", "testbed", "dtype", "max_model_len", "max_num_seqs"]
    )
    if "builtin" in t and "path" in t:
        raise w.error("model", "give either builtin or path, not both")
    builtin: str | None = None
    path: Path | None = None
    if "path" in t:
        path = resolve_path(base, as_str(w, t["path"], "model.path"))
    else:
        builtin = as_str(w, t.get("builtin", "testbed"), "model.builtin")
        if builtin not in BUILTIN_MODELS:
            raise w.error(
                "model.builtin", f"={builtin!r}: must be one of {', '.join(BUILTIN_MODELS)}"
            )
    testbed = as_table(w, t.get("testbed", {}), "model.testbed")
    if testbed:
        if builtin != "testbed":
            raise w.error("model.testbed", "only applies to builtin = 'testbed'")
        from specctl.demo.testbed_model import TestbedConfig

        known = [f for f in TestbedConfig.__dataclass_fields__ if not f.startswith("_")]
        check_keys(w, testbed, "model.testbed", known)
        try:
            TestbedConfig(**testbed)
        except (TypeError, ValueError) as exc:
            raise w.error("model.testbed", str(exc)) from None
    dtype = as_str(w, t.get("dtype", "float32"), "model.dtype")
    return ModelSpec(
        builtin=builtin,
        path=path,
        testbed=testbed,
        dtype=dtype,
        max_model_len=as_int(w, t.get("max_model_len", 512), "model.max_model_len", 16),
        max_num_seqs=as_int(w, t.get("max_num_seqs", 32), "model.max_num_seqs", 1),
    )


def _speculative(w: Where, raw: Any, model: ModelSpec, base: Path | None) -> dict[str, Any]:
    if raw is None:
        if model.builtin is None:
            raise w.error(
                "speculative",
                "is required with model.path (vLLM's speculative_config: method, "
                "num_speculative_tokens, ...)",
            )
        return dict(_DEFAULT_SPECULATIVE[model.builtin])
    t = dict(as_table(w, raw, "speculative"))
    method = as_str(w, t.get("method"), "speculative.method")
    try:
        parse_arm(f"{method}/k=1")
    except ArmError as exc:
        raise w.error("speculative.method", str(exc)) from None
    t["num_speculative_tokens"] = as_int(
        w, t.get("num_speculative_tokens"), "speculative.num_speculative_tokens", 1, 64
    )
    if "model" in t:
        t["model"] = str(resolve_path(base, as_str(w, t["model"], "speculative.model")))
    elif method == "draft_model" and model.builtin != "testbed":
        raise w.error("speculative.model", "is required for method 'draft_model'")
    return t


def _engine(w: Where, raw: Any) -> tuple[str, dict[str, str], tuple[str, ...]]:
    t = as_table(w, raw or {}, "engine")
    check_keys(w, t, "engine", ["step_clock", "env", "args"])
    clock = as_str(w, t.get("step_clock", "wall"), "engine.step_clock")
    if clock not in STEP_CLOCKS:
        raise w.error("engine.step_clock", f"={clock!r}: must be one of {', '.join(STEP_CLOCKS)}")
    env = as_table(w, t.get("env", {}), "engine.env")
    for k, v in env.items():
        if not isinstance(v, str | int | float) or isinstance(v, bool):
            raise w.error(f"engine.env.{k}", f"must be a string or a number, not {v!r}")
    ngram_k = env.get("SPECCTL_NGRAM_MAX_K")
    if ngram_k is not None and not (isinstance(ngram_k, int) or str(ngram_k).isdigit()):
        raise w.error("engine.env.SPECCTL_NGRAM_MAX_K", f"={ngram_k!r}: must be an integer >= 0")
    args = as_str_list(w, t["args"], "engine.args") if "args" in t else ()
    return clock, {k: str(v) for k, v in env.items()}, args


def _sidecar(w: Where, raw: Any) -> tuple[tuple[int, ...] | None, dict[str, dict[str, Any]]]:
    from specctl.policy.registry import make_policy

    t = as_table(w, raw or {}, "sidecar")
    check_keys(w, t, "sidecar", ["load_bucket_bounds", "params"])
    bounds: tuple[int, ...] | None = None
    if "load_bucket_bounds" in t:
        value = t["load_bucket_bounds"]
        if not isinstance(value, list) or not value:
            raise w.error("sidecar.load_bucket_bounds", f"must be a list of integers: {value!r}")
        bounds = tuple(
            as_int(w, b, f"sidecar.load_bucket_bounds[{i}]", 1) for i, b in enumerate(value)
        )
        if list(bounds) != sorted(set(bounds)):
            raise w.error("sidecar.load_bucket_bounds", f"={list(bounds)}: must increase")
    params = as_table(w, t.get("params", {}), "sidecar.params")
    out: dict[str, dict[str, Any]] = {}
    for name, p in params.items():
        key = f"sidecar.params.{name}"
        problem = learning_policy_problem(name)
        if problem is not None:
            raise w.error(key, problem)
        out[name] = dict(as_table(w, p, key))
    for name in out:
        # a variant runs with its policy's parameters and its own over them
        key = f"sidecar.params.{name}"
        try:
            make_policy(
                registered_policy(name), policy_params(out, name), load_bucket_bounds=bounds
            )
        except ValueError as exc:
            raise w.error(key, str(exc)) from None
    return bounds, out


def _sampling(w: Where, raw: Any, key: str) -> dict[str, float | int]:
    t = as_table(w, raw, key)
    check_keys(w, t, key, list(SAMPLING_KEYS))
    out: dict[str, float | int] = {}
    for k, v in t.items():
        kind, lo, hi = SAMPLING_KEYS[k]
        n = as_number(w, v, f"{key}.{k}", lo=lo, hi=hi, integer=kind is int)
        out[k] = int(n) if kind is int else float(n)
    return out


def _class(w: Where, raw: Any, i: int, base: Path | None) -> ClassSpec:
    key = f"class[{i}]"
    t = as_table(w, raw, key)
    check_keys(
        w, t, key, ["name", "share", "sampling", "prompts", "prompt_tokens", "output_tokens"]
    )
    name = as_str(w, t.get("name"), f"{key}.name")
    problem = validate_class_name(name)
    if problem is not None:
        raise w.error(f"{key}.name", f"={name!r}: {problem}")
    share = as_number(w, t.get("share", 1.0), f"{key}.share", lo=0.0, lo_open=True)
    sampling = _sampling(w, t.get("sampling", {}), f"{key}.sampling")
    prompts = as_str(w, t.get("prompts", BUILTIN_PROMPTS), f"{key}.prompts")
    if prompts != BUILTIN_PROMPTS:
        path = resolve_path(base, prompts)
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
        as_range(w, t["prompt_tokens"], f"{key}.prompt_tokens", 1) if "prompt_tokens" in t else None
    )
    output = as_range(w, t.get("output_tokens", 64), f"{key}.output_tokens", 1)
    return ClassSpec(name, float(share), sampling, prompts, prompt_tokens, output)


def _phase(w: Where, raw: Any, i: int, classes: Sequence[ClassSpec]) -> PhaseSpec:
    key = f"phase[{i}]"
    t = as_table(w, raw, key)
    check_keys(w, t, key, ["name", "seconds", "concurrency"])
    name = as_str(w, t.get("name", f"phase{i}"), f"{key}.name")
    if not _PHASE_NAME.match(name):
        raise w.error(f"{key}.name", f"={name!r}: must be 1-32 of [A-Za-z0-9_.-]")
    if "seconds" not in t:
        raise w.error(f"{key}.seconds", "is required (seconds measured per policy)")
    seconds = as_number(w, t["seconds"], f"{key}.seconds", lo=0.0, lo_open=True)
    if "concurrency" not in t:
        raise w.error(f"{key}.concurrency", "is required (concurrent clients)")
    value = t["concurrency"]
    concurrency: int | dict[str, int]
    if isinstance(value, dict):
        names = [c.name for c in classes]
        check_keys(w, value, f"{key}.concurrency", names)
        concurrency = {c: as_int(w, n, f"{key}.concurrency.{c}", 0) for c, n in value.items()}
        if sum(concurrency.values()) < 1:
            raise w.error(f"{key}.concurrency", "needs at least one client")
    else:
        concurrency = as_int(w, value, f"{key}.concurrency", 1)
    return PhaseSpec(name, float(seconds), concurrency)


def _bench(w: Where, raw: Any, arms: Sequence[str]) -> BenchSpec:
    t = as_table(w, raw or {}, "bench")
    check_keys(
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
        static_arms = as_str_list(w, t["static_arms"], "bench.static_arms")
        for i, a in enumerate(static_arms):
            if a not in arms:
                raise w.error(
                    f"bench.static_arms[{i}]",
                    f"={a!r}: not an arm the engine offers ({', '.join(arms)})",
                )
    policies = None
    if "policies" in t:
        policies = as_str_list(w, t["policies"], "bench.policies")
        for i, p in enumerate(policies):
            problem = policy_name_problem(p, arms)
            if problem:
                raise w.error(f"bench.policies[{i}]", f"={p!r}: {problem}")
        if HINDSIGHT in policies and not any(p.startswith("static") for p in policies):
            raise w.error(
                "bench.policies", f"{HINDSIGHT} pins the static arms' best: list static arms too"
            )
    defaults = BenchSpec()
    return BenchSpec(
        repetitions=as_int(w, t.get("repetitions", defaults.repetitions), "bench.repetitions", 1),
        warmup_s=float(as_number(w, t.get("warmup_s", defaults.warmup_s), "bench.warmup_s", lo=0)),
        settle_s=float(as_number(w, t.get("settle_s", defaults.settle_s), "bench.settle_s", lo=0)),
        policies=policies,
        static_arms=static_arms,
        carry_state=as_bool(w, t.get("carry_state", defaults.carry_state), "bench.carry_state"),
        sample_every_s=float(
            as_number(
                w,
                t.get("sample_every_s", defaults.sample_every_s),
                "bench.sample_every_s",
                lo=0.1,
            )
        ),
    )


def parse_workload(data: Mapping[str, Any], source: str = "", base: Path | None = None) -> Workload:
    """Validate a parsed workload file. ``base`` resolves relative paths in it."""
    w = Where(source)
    check_keys(
        w,
        data,
        "",
        ["name", "description", "model", "speculative", "engine", "sidecar", "bench", "class",
         "phase"],
    )  # fmt: skip
    name = as_str(w, data.get("name", Path(source).stem if source else "workload"), "name")
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
