"""vLLM general plugin: tell vLLM, before it builds its configuration, that K varies per step.

specctl changes the number of speculative tokens each step verifies. vLLM
knows how to run safely when that happens, but only for its own Dynamic SD
(``num_speculative_tokens_per_batch_size``): it then switches the V1 model
runner's CUDA graphs from FULL to PIECEWISE (the graphs replay a fixed
verification length), captures the V2 runner's graphs, its drafter's
included, per length, and turns Dynamic SD off under data parallelism. The
configuration is built before any scheduler exists, so the scheduler cannot
arrange this itself.

Registered as a ``vllm.general_plugins`` entry point, :func:`register` runs in
every vLLM process before the engine's configuration is built. When the engine
runs specctl's scheduler with speculative decoding and no Dynamic SD table of
the user's, it gives the speculative config the one-row table
``[(1, 1, num_speculative_tokens)]``: the same K at every batch size (vLLM
carries the last row forward), so vLLM's own safety applies and nothing else
changes. A user's own table is left as it is, and so is an engine with data
parallelism (specctl keeps vLLM's static K there). Where the plugin is not loaded
(``VLLM_PLUGINS`` excludes it), the scheduler refuses FULL CUDA graphs without
a table at start-up (see ``specctl.engine.scheduler``).
"""

from __future__ import annotations

from typing import Any

SCHEDULER_CLASSES = (
    "specctl.engine.scheduler.SpecctlScheduler",
    "specctl.engine.scheduler.SpecctlAsyncScheduler",
)


def uses_specctl(scheduler_cls: object) -> bool:
    """Whether ``--scheduler-cls`` (a qualified name or a class) is specctl's scheduler."""
    if isinstance(scheduler_cls, str):
        return scheduler_cls in SCHEDULER_CLASSES
    if isinstance(scheduler_cls, type):
        return f"{scheduler_cls.__module__}.{scheduler_cls.__qualname__}" in SCHEDULER_CLASSES
    return False


def declares_varying_k(engine_args: Any) -> bool:
    """Whether an engine with these ``EngineArgs`` gets the constant table.

    Under data parallelism specctl keeps vLLM's static K, and vLLM would drop
    the table (with a warning about a table the user never gave).
    """
    single_rank = int(getattr(engine_args, "data_parallel_size", 1) or 1) <= 1
    return single_rank and uses_specctl(getattr(engine_args, "scheduler_cls", None))


def declare_varying_k(speculative_config: Any) -> None:
    """Give a speculative config without a Dynamic SD table the constant one-row table."""
    if speculative_config is None:
        return
    k = int(getattr(speculative_config, "num_speculative_tokens", 0) or 0)
    if k > 0 and speculative_config.num_speculative_tokens_per_batch_size is None:
        speculative_config.num_speculative_tokens_per_batch_size = [(1, 1, k)]


def register() -> None:
    """The entry point: wrap ``EngineArgs.create_speculative_config`` once per process."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return
    original = getattr(EngineArgs, "create_speculative_config", None)
    if original is None or getattr(original, "_specctl_wrapped", False):
        return

    def create_speculative_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = original(self, *args, **kwargs)
        if declares_varying_k(self):
            declare_varying_k(config)
        return config

    create_speculative_config._specctl_wrapped = True  # type: ignore[attr-defined]
    EngineArgs.create_speculative_config = create_speculative_config  # type: ignore[method-assign]
