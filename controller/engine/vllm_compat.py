"""What specctl's engine side relies on in vLLM, and checks of it against vLLM's code.

The scheduler plugin subclasses vLLM's schedulers and reads vLLM's objects, so
a vLLM release that renames a hook or drops a field breaks it, sometimes
silently (a hook vLLM no longer calls is simply never run). :data:`INVENTORY`
lists every such hook, method, field and attribute in one table, and two
checks read it, so they cannot drift apart:

- :func:`runtime_problems`, at start-up against the imported vLLM (with
  ``inspect``): the hooks and the declared fields;
- :func:`check_source`, against vLLM's source files read with ``ast`` (nothing
  imported): every item, including the attributes vLLM assigns in methods
  and the reads inside vLLM's own methods that specctl's hooks depend on. It
  takes an unpacked source tree or a wheel, so a new release can be checked
  before it is installed (``benchmarks/check_vllm_source.py``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# vLLM minor versions whose scheduler code specctl's hooks have been checked against.
SUPPORTED_VLLM_VERSIONS = ("0.32", "0.33")

_SCHEDULER = "vllm.v1.core.sched.scheduler"
_ASYNC_SCHEDULER = "vllm.v1.core.sched.async_scheduler"
_OUTPUT = "vllm.v1.core.sched.output"


@dataclass(frozen=True)
class Method:
    """A method specctl overrides or calls, with the parameters (after ``self``) it relies on.

    ``exact``: vLLM's parameters must be exactly these, because specctl's
    override has a fixed signature and vLLM's callers would pass any new
    one. Otherwise (the override forwards ``*args, **kwargs``, or specctl only
    calls the method) vLLM's parameters must start with these.
    """

    module: str
    cls: str
    name: str
    params: tuple[str, ...]
    exact: bool
    why: str


@dataclass(frozen=True)
class Field:
    """An attribute specctl reads or writes on a vLLM object.

    ``declared``: a class-level annotation (a dataclass, config or struct
    field), checked at start-up too. ``assigned``: an instance attribute
    vLLM sets with ``self.<name> = ...`` in one of the class's methods, which
    only the source check can see. ``property``: a property of the class.
    """

    module: str
    cls: str
    name: str
    kind: Literal["declared", "assigned", "property"]
    why: str


@dataclass(frozen=True)
class Function:
    """A module-level function specctl calls, with the parameters it passes, in order."""

    module: str
    name: str
    params: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Read:
    """A use of an attribute inside one of vLLM's methods that specctl depends on.

    A call of a hook (vLLM still runs it) or a read of a field specctl sets.

    ``expr`` is the dotted expression as written in vLLM's code (for example
    ``self.dynamic_sd_lookup``): the source check only confirms the method
    still uses it; what the method does with it is reviewed by hand.
    """

    module: str
    cls: str
    method: str
    expr: str
    why: str


@dataclass(frozen=True)
class Subclass:
    """A vLLM class that must derive from another defined in the same module or imported."""

    module: str
    cls: str
    base: str
    why: str


Item = Method | Field | Read | Subclass | Function

_SCHEDULER_INIT = (
    "vllm_config",
    "kv_cache_config",
    "structured_output_manager",
    "block_size",
    "hash_block_size",
    "mm_registry",
    "include_finished_set",
    "log_stats",
)

INVENTORY: tuple[Item, ...] = (
    # -- the scheduler hooks (controller/engine/scheduler.py) -------------------------------------
    Method(_SCHEDULER, "Scheduler", "__init__", _SCHEDULER_INIT, False,
           "overridden (*args, **kwargs); vllm_config is read to choose the async variant"),
    Method(_SCHEDULER, "Scheduler", "add_request", ("request",), True,
           "overridden: classifies each new request"),
    Method(_SCHEDULER, "Scheduler", "_update_request_as_session", ("session", "update"), True,
           "overridden: a streaming-input session moves to its next chunk's class"),
    Method(_SCHEDULER, "Scheduler", "schedule", ("throttle_prefills",), False,
           "overridden (*args, **kwargs): reads the policy, sets the dynamic-SD lookup"),
    Method(_SCHEDULER, "Scheduler", "_update_after_schedule", ("scheduler_output",), True,
           "overridden: samples the arms and sets the step's K on the output"),
    Method(_SCHEDULER, "Scheduler", "update_draft_token_ids", ("draft_token_ids",), True,
           "overridden: cuts each request's drafts to its class's K"),
    Method(_SCHEDULER, "Scheduler", "update_from_output",
           ("scheduler_output", "model_runner_output"), True,
           "overridden: records drafted and accepted per request"),
    Method(_SCHEDULER, "Scheduler", "shutdown", (), True,
           "overridden: closes the sidecar client"),
    Method(_ASYNC_SCHEDULER, "AsyncScheduler", "_update_after_schedule",
           ("scheduler_output",), True,
           "SpecctlAsyncScheduler's override runs before it: it sizes the placeholders"),
    Subclass(_ASYNC_SCHEDULER, "AsyncScheduler", "Scheduler",
             "one mixin serves both schedulers"),
    # -- scheduler state read or written by the hooks ---------------------------------------------
    Field(_SCHEDULER, "Scheduler", "vllm_config", "assigned", "read at start-up"),
    Field(_SCHEDULER, "Scheduler", "num_spec_tokens", "assigned",
          "the engine's K: specctl's maximum"),
    Field(_SCHEDULER, "Scheduler", "requests", "assigned",
          "live ids (a session's next chunk), the async placeholders"),
    Field(_SCHEDULER, "Scheduler", "finished_req_ids", "assigned",
          "requests that leave their classes at the next step"),
    Field(_SCHEDULER, "Scheduler", "dynamic_sd_lookup", "assigned",
          "the user's Dynamic SD table; specctl's per-step lookup replaces it"),
    Read(_SCHEDULER, "Scheduler", "schedule", "self._update_after_schedule",
         "vLLM still calls the hook that sets the step's K"),
    Read(_SCHEDULER, "Scheduler", "add_request", "self._update_request_as_session",
         "vLLM still folds a session's next chunk through the hook"),
    Read(_SCHEDULER, "Scheduler", "schedule", "self.dynamic_sd_lookup",
         "the step's K and the first-decode padding follow the lookup specctl sets"),
    Read(_ASYNC_SCHEDULER, "AsyncScheduler", "_update_after_schedule",
         "scheduler_output.num_spec_tokens_to_schedule",
         "placeholders are sized from the K specctl sets before it runs"),
    Read(_SCHEDULER, "Scheduler", "update_draft_token_ids", "request.spec_token_ids",
         "the drafts specctl cuts afterwards are stored on the request"),
    # -- the engine core's loop: it still calls the hooks -----------------------------
    Read("vllm.v1.engine.core", "EngineCore", "add_request", "self.scheduler.add_request",
         "each request reaches the hook"),
    Read("vllm.v1.engine.core", "EngineCore", "step", "self.scheduler.schedule",
         "each step starts with the hook"),
    Read("vllm.v1.engine.core", "EngineCore", "step", "self.scheduler.update_from_output",
         "each step's output reaches the hook"),
    Read("vllm.v1.engine.core", "EngineCore", "post_step",
         "self.scheduler.update_draft_token_ids",
         "synchronous scheduling hands the drafts to the hook after each step"),
    # -- per-step objects -------------------------------------------------------------------------
    Field(_OUTPUT, "SchedulerOutput", "num_scheduled_tokens", "declared",
          "the step's requests and their token counts"),
    Field(_OUTPUT, "SchedulerOutput", "total_num_scheduled_tokens", "declared",
          "recorded per step"),
    Field(_OUTPUT, "SchedulerOutput", "scheduled_spec_decode_tokens", "declared",
          "drafts verified per request"),
    Field(_OUTPUT, "SchedulerOutput", "num_spec_tokens_to_schedule", "declared",
          "the step's K, which specctl sets"),
    Field("vllm.v1.outputs", "ModelRunnerOutput", "req_id_to_index", "declared",
          "maps requests to their sampled tokens"),
    Field("vllm.v1.outputs", "ModelRunnerOutput", "sampled_token_ids", "declared",
          "accepted drafts = sampled - 1"),
    # -- requests ---------------------------------------------------------------------------------
    Field("vllm.v1.request", "Request", "request_id", "assigned", "the request's key"),
    Field("vllm.v1.request", "Request", "sampling_params", "assigned",
          "extra_args name the workload class"),
    Field("vllm.v1.request", "Request", "num_prompt_tokens", "assigned",
          "class from prompt length"),
    Field("vllm.v1.request", "Request", "spec_token_ids", "assigned",
          "drafts and async placeholders, cut to the class's K"),
    Method("vllm.v1.request", "Request", "is_finished", (), True,
           "a finished request leaves its class, a live one reusing its id stays"),
    Field("vllm.sampling_params", "SamplingParams", "extra_args", "declared",
          "the workload class key"),
    # -- configuration ----------------------------------------------------------------------------
    Field("vllm.config.vllm", "VllmConfig", "speculative_config", "declared", "read at start-up"),
    Field("vllm.config.vllm", "VllmConfig", "parallel_config", "declared", "read at start-up"),
    Field("vllm.config.vllm", "VllmConfig", "compilation_config", "declared", "read at start-up"),
    Field("vllm.config.vllm", "VllmConfig", "model_config", "declared", "read at start-up"),
    Field("vllm.config.vllm", "VllmConfig", "scheduler_config", "declared", "read at start-up"),
    Field("vllm.config.speculative", "SpeculativeConfig", "method", "declared", "the drafter"),
    Field("vllm.config.speculative", "SpeculativeConfig", "num_speculative_tokens", "declared",
          "the engine's K"),
    Field("vllm.config.speculative", "SpeculativeConfig",
          "num_speculative_tokens_per_batch_size", "declared",
          "the Dynamic SD table the plugin declares and the scheduler reads"),
    Field("vllm.config.parallel", "ParallelConfig", "data_parallel_size", "declared",
          "under data parallelism the step's K stays vLLM's"),
    Field("vllm.config.compilation", "CompilationConfig", "cudagraph_mode", "declared",
          "FULL graphs without a table are refused"),
    Method("vllm.config.compilation", "CUDAGraphMode", "has_full_cudagraphs", (), True,
           "FULL graphs without a table are refused"),
    Field("vllm.config.model", "ModelConfig", "model", "declared", "sent to the sidecar"),
    Field("vllm.config.model", "ModelConfig", "served_model_name", "declared",
          "sent to the sidecar"),
    Field("vllm.config.scheduler", "SchedulerConfig", "max_num_seqs", "declared",
          "sent to the sidecar"),
    Field("vllm.config.scheduler", "SchedulerConfig", "async_scheduling", "declared",
          "chooses SpecctlAsyncScheduler"),
    # -- the general plugin (controller/engine/vllm_plugin.py) ------------------------------------
    Method("vllm.engine.arg_utils", "EngineArgs", "create_speculative_config", (), False,
           "wrapped (*args, **kwargs) to declare the constant Dynamic SD table"),
    Field("vllm.engine.arg_utils", "EngineArgs", "scheduler_cls", "declared",
          "whether the engine runs specctl's scheduler"),
    Field("vllm.engine.arg_utils", "EngineArgs", "data_parallel_size", "declared",
          "no table under data parallelism"),
    # -- n-gram drafts next to a model drafter (controller/engine/ngram.py, hybrid.py) -----------
    Function("vllm.v1.spec_decode.ngram_proposer",
             "_find_longest_matched_ngram_and_propose_tokens",
             ("origin_tokens", "min_ngram", "max_ngram", "max_model_len", "k"),
             "vLLM's own n-gram matcher, called from specctl's compiled batch loop"),
    Read(_SCHEDULER, "Scheduler", "update_draft_token_ids",
         "self.structured_output_manager.validate_tokens",
         "n-gram drafts of a constrained request are validated the same way"),
    Field(_SCHEDULER, "Scheduler", "structured_output_manager", "assigned",
          "validates n-gram drafts of constrained requests"),
    Field("vllm.v1.request", "Request", "num_computed_tokens", "assigned",
          "only decoding requests get n-gram drafts"),
    Field("vllm.v1.request", "Request", "_all_token_ids", "assigned",
          "the context n-gram drafts are matched in (the list behind all_token_ids)"),
    Field("vllm.v1.request", "Request", "num_tokens", "property",
          "the context's length"),
    Field("vllm.v1.request", "Request", "use_structured_output", "property",
          "constrained requests' n-gram drafts are validated"),
    Field("vllm.config.vllm", "VllmConfig", "use_v2_model_runner", "property",
          "no n-gram drafts where drafts stay on the device"),
    Field("vllm.config.speculative", "SpeculativeConfig", "draft_sample_method", "declared",
          "n-gram drafts only with greedy draft sampling"),
    Field("vllm.config.speculative", "SpeculativeConfig", "rejection_sample_method", "declared",
          "n-gram drafts only with the standard rejection sampler"),
    Field("vllm.config.model", "ModelConfig", "max_model_len", "declared",
          "sizes the n-gram token buffer"),
)  # fmt: skip


def describe(item: Item) -> str:
    """A short name for an inventory item, as the checks report it."""
    if isinstance(item, Method):
        return f"{item.cls}.{item.name}({', '.join(item.params)})"
    if isinstance(item, Field):
        return f"{item.cls}.{item.name}"
    if isinstance(item, Read):
        return f"{item.cls}.{item.method} uses {item.expr}"
    if isinstance(item, Function):
        return f"{item.name}({', '.join(item.params)})"
    return f"{item.cls}({item.base})"


def version_supported(version: str) -> bool:
    """Whether a vLLM version string is one of :data:`SUPPORTED_VLLM_VERSIONS` (any patch)."""
    return any(version == v or version.startswith(v + ".") for v in SUPPORTED_VLLM_VERSIONS)


def _param_problem(item: Method | Function, got: tuple[str, ...]) -> str | None:
    expected = item.params
    if isinstance(item, Function):
        if got[: len(expected)] != expected:
            return f"takes ({', '.join(got)}), specctl passes ({', '.join(expected)})"
        return None
    if item.exact and got != expected:
        return f"takes ({', '.join(got)}), specctl's override takes ({', '.join(expected)})"
    if not item.exact and got[: len(expected)] != expected:
        return f"takes ({', '.join(got)}), not starting with ({', '.join(expected)})"
    return None


# -- start-up check on the imported vLLM ----------------------------------------------------------


def _signature_names(method: Callable[..., object], skip: int = 1) -> tuple[str, ...]:
    """Parameter names after the first ``skip`` (``self``); a compiled function's too."""
    names: list[str] = []
    function = getattr(method, "py_func", method)  # numba keeps the Python function
    for param in list(inspect.signature(function).parameters.values())[skip:]:
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            names.append("*" + param.name)
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            names.append("**" + param.name)
        else:
            names.append(param.name)
    return tuple(names)


def runtime_problems() -> list[str]:
    """Check the imported vLLM: methods, subclasses and declared fields of :data:`INVENTORY`.

    Attributes assigned in methods and reads inside vLLM's methods need the
    source: :func:`check_source` covers them.
    """
    problems: list[str] = []
    for item in INVENTORY:
        if isinstance(item, Read) or (isinstance(item, Field) and item.kind == "assigned"):
            continue
        if isinstance(item, Function):
            function = getattr(importlib.import_module(item.module), item.name, None)
            if function is None:
                problems.append(f"{item.module}.{item.name} is missing")
                continue
            problem = _param_problem(item, _signature_names(function, skip=0))
            if problem is not None:
                problems.append(f"{item.name} {problem}")
            continue
        cls = getattr(importlib.import_module(item.module), item.cls, None)
        if not isinstance(cls, type):
            problems.append(f"{item.module}.{item.cls} is missing")
            continue
        if isinstance(item, Method):
            method = getattr(cls, item.name, None)
            if method is None:
                problems.append(f"{item.cls}.{item.name} is missing")
                continue
            problem = _param_problem(item, _signature_names(method))
            if problem is not None:
                problems.append(f"{item.cls}.{item.name} {problem}")
        elif isinstance(item, Field) and item.kind == "property":
            if not isinstance(getattr(cls, item.name, None), property):
                problems.append(f"{item.cls} has no property {item.name!r}")
        elif isinstance(item, Field):
            if not any(item.name in vars(k).get("__annotations__", {}) for k in cls.__mro__):
                problems.append(f"{item.cls} has no field {item.name!r}")
        else:
            base = getattr(importlib.import_module(item.module), item.base, None)
            if not isinstance(base, type) or not issubclass(cls, base):
                problems.append(f"{item.cls} is not a subclass of {item.base}")
    return problems


# -- source check, without importing vLLM ---------------------------------------------------------


class VllmSource:
    """vLLM's Python files from an unpacked tree or a wheel, read without importing them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip: zipfile.ZipFile | None = None
        self._root: Path | None = None
        if path.is_file():
            self._zip = zipfile.ZipFile(path)
        elif (path / "vllm" / "__init__.py").is_file():
            self._root = path
        elif path.name == "vllm" and (path / "__init__.py").is_file():
            self._root = path.parent
        else:
            raise FileNotFoundError(f"{path} is neither a wheel nor a directory holding vllm/")
        self._trees: dict[str, ast.Module | None] = {}

    def read(self, relpath: str) -> str | None:
        """A file's text by its path under the package root (``vllm/...``), None if absent."""
        if self._zip is not None:
            try:
                return self._zip.read(relpath).decode()
            except KeyError:
                return None
        assert self._root is not None
        file = self._root / relpath
        return file.read_text() if file.is_file() else None

    def module(self, name: str) -> ast.Module | None:
        """A module's syntax tree, None if vLLM has no such module."""
        if name not in self._trees:
            base = name.replace(".", "/")
            text = self.read(base + ".py")
            if text is None:
                text = self.read(base + "/__init__.py")
            self._trees[name] = None if text is None else ast.parse(text)
        return self._trees[name]

    def version(self) -> str:
        """vLLM's version as its build recorded it ("unknown" if not found)."""
        text = self.read("vllm/_version.py")
        if text is not None:
            match = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
            if match:
                return match.group(1)
        if self._zip is not None:
            for name in self._zip.namelist():
                if name.endswith(".dist-info/METADATA"):
                    match = re.search(r"^Version: (\S+)", self._zip.read(name).decode(), re.M)
                    if match:
                        return match.group(1)
        return "unknown"


@dataclass(frozen=True)
class Finding:
    """One inventory item checked against a source: ``problem`` is None when it holds."""

    item: Item
    problem: str | None


def _find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


_FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _find_function(tree: ast.Module, name: str) -> _FunctionNode | None:
    found = None
    for node in tree.body:
        if isinstance(node, _FunctionNode) and node.name == name:
            found = node
    return found


def _find_method(cls: ast.ClassDef, name: str) -> _FunctionNode | None:
    found = None
    for node in cls.body:
        if isinstance(node, _FunctionNode) and node.name == name:
            found = node  # the last definition wins, as in Python
    return found


def _ast_param_names(func: _FunctionNode) -> tuple[str, ...]:
    args = func.args
    names = [a.arg for a in [*args.posonlyargs, *args.args]][1:]
    if args.vararg is not None:
        names.append("*" + args.vararg.arg)
    names.extend(a.arg for a in args.kwonlyargs)
    if args.kwarg is not None:
        names.append("**" + args.kwarg.arg)
    return tuple(names)


def _declares(cls: ast.ClassDef, name: str) -> bool:
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == name:
                return True
    return False


def _assigns(cls: ast.ClassDef, name: str) -> bool:
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if (
                    isinstance(sub, ast.Attribute)
                    and sub.attr == name
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    return True
    return _declares(cls, name)


def _reads(func: _FunctionNode, expr: str) -> bool:
    return any(
        isinstance(node, ast.Attribute) and ast.unparse(node) == expr for node in ast.walk(func)
    )


def _bases(cls: ast.ClassDef) -> list[str]:
    return [ast.unparse(b).rsplit(".", 1)[-1] for b in cls.bases]


def check_item(source: VllmSource, item: Item) -> str | None:
    """What differs for one inventory item in this source, None if it holds."""
    tree = source.module(item.module)
    if tree is None:
        return f"module {item.module} is missing"
    if isinstance(item, Function):
        function = _find_function(tree, item.name)
        if function is None:
            return f"function {item.name} is missing from {item.module}"
        args = function.args
        problem = _param_problem(item, tuple(a.arg for a in [*args.posonlyargs, *args.args]))
        return None if problem is None else f"{item.name} {problem}"
    cls = _find_class(tree, item.cls)
    if cls is None:
        return f"class {item.cls} is missing from {item.module}"
    if isinstance(item, Method):
        func = _find_method(cls, item.name)
        if func is None:
            return f"{item.cls}.{item.name} is not defined in {item.cls}"
        problem = _param_problem(item, _ast_param_names(func))
        return None if problem is None else f"{item.cls}.{item.name} {problem}"
    if isinstance(item, Field) and item.kind == "property":
        getter = _find_method(cls, item.name)
        if getter is not None and any(ast.unparse(d) == "property" for d in getter.decorator_list):
            return None
        return f"{item.cls} has no property {item.name!r}"
    if isinstance(item, Field):
        found = _declares(cls, item.name) if item.kind == "declared" else _assigns(cls, item.name)
        if found:
            return None
        if item.kind == "declared":
            return f"{item.cls} declares no field {item.name!r}"
        return f"{item.cls} never assigns self.{item.name}"
    if isinstance(item, Read):
        func = _find_method(cls, item.method)
        if func is None:
            return f"{item.cls}.{item.method} is not defined in {item.cls}"
        if _reads(func, item.expr):
            return None
        return f"{item.cls}.{item.method} no longer uses {item.expr}"
    if item.base not in _bases(cls):
        return f"{item.cls} derives from ({', '.join(_bases(cls))}), not {item.base}"
    return None


def check_source(source: VllmSource) -> list[Finding]:
    """Every item of :data:`INVENTORY` checked against a vLLM source, in table order."""
    return [Finding(item, check_item(source, item)) for item in INVENTORY]
