"""vLLM scheduler subclasses that apply specctl's policy: load with ``--scheduler-cls``.

``specctl.engine.scheduler.SpecctlScheduler`` works for both of vLLM's
schedulers: when the engine runs with async scheduling it builds a
:class:`SpecctlAsyncScheduler` (a subclass of vLLM's ``AsyncScheduler``)
instead, so the choice always matches the engine's configuration. Both classes
are importable by qualified name, which vLLM's spawned engine-core process
needs.

The hooks, all in vLLM's ``Scheduler`` (0.32 and 0.33; the full list of what
the plugin relies on is ``specctl.engine.vllm_compat.INVENTORY``):

- ``add_request``: the request's workload class, once (a streaming-input
  session's next chunk is folded into the session by vLLM, and
  ``_update_request_as_session`` moves the session to the chunk's class).
- ``schedule`` / ``_update_after_schedule``: sample an arm per (class, load
  bucket) from the current policy and set the step-level K the drafter
  proposes, through vLLM's dynamic speculative decoding lookup. In fallback on
  the engine's own setting, and under data parallelism, the step's K and
  lookup stay vLLM's; a user's Dynamic SD table caps K. See
  docs/engine-safety.md.
- ``update_draft_token_ids`` (sync) or the draft placeholders (async):
  truncate each request's drafts to its own arm's K (0 for ``off``).
- ``update_from_output``: record drafted and accepted per request, the step's
  wall time and batch size, and queue them for the sidecar.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import structlog

from specctl.arms import MAX_K
from specctl.engine.client import SidecarClient
from specctl.engine.config import EngineConfig, engine_default_arm
from specctl.engine.hybrid import decide_hybrid
from specctl.engine.ngram import NGRAM, NgramDrafter
from specctl.engine.recorder import StepRecorder
from specctl.engine.vllm_compat import (
    SUPPORTED_VLLM_VERSIONS,
    runtime_problems,
    version_supported,
)
from specctl.logs import configure_logging, get_logger
from specctl.protocol.hello import hello_message, validate_hello

log = get_logger(__name__)

_QUALNAME = "specctl.engine.scheduler.SpecctlScheduler"


class UnsupportedVllmError(RuntimeError):
    """The running vLLM does not have the scheduler hooks this plugin was written against."""


def check_vllm_supported() -> None:
    """Fail at start-up, naming the supported versions, if the hooks are not as expected.

    The hooks and fields checked are those of ``vllm_compat.INVENTORY``, the
    same table the source check reads for a release not yet installed.
    """
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    supported = ", ".join(f"{v}.x" for v in SUPPORTED_VLLM_VERSIONS)
    if not version_supported(version):
        raise UnsupportedVllmError(
            f"specctl's scheduler plugin supports vLLM {supported}; this is vLLM {version}"
        )
    problems = runtime_problems()
    if problems:
        raise UnsupportedVllmError(
            f"specctl's scheduler plugin supports vLLM {supported}, and vLLM {version} "
            f"does not match it: {'; '.join(problems)}"
        )


def _configure_logging() -> None:
    """The sidecar's log set-up, unless the process has one; vLLM's own logging is left alone.

    At debug level: the engine has no log settings of its own, and prints everything it logs.
    """
    if not structlog.is_configured():
        configure_logging("auto", "debug", route_stdlib=False)


class _StepK:
    """Stands in for vLLM's dynamic-SD lookup (batch size -> K) while specctl sets K.

    Setting a lookup also stops vLLM from padding new decodes to a fixed K.
    specctl overrides the K vLLM reads from it after scheduling; if that hook
    fails, the step runs with this K: the user's table's, else the engine's.
    """

    __slots__ = ("k", "size", "table")

    def __init__(self, k: int, table: list[int] | None, max_num_seqs: int) -> None:
        self.k = k
        self.table = table
        # vLLM's lookup is a list indexed by batch size 0..max_num_seqs.
        self.size = len(table) if table is not None else max_num_seqs + 1

    def __getitem__(self, batch_size: int) -> int:
        if not 0 <= batch_size < self.size:
            raise IndexError(f"batch size {batch_size} is outside 0..{self.size - 1}")
        table = self.table
        return self.k if table is None else table[batch_size]

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        return (self[i] for i in range(self.size))


class _SpecctlMixin:
    """The specctl hooks, shared by both scheduler classes."""

    specctl: StepRecorder | None
    specctl_client: SidecarClient | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_vllm_supported()
        _configure_logging()
        super().__init__(*args, **kwargs)
        self.specctl = None
        self.specctl_client = None
        vllm_config = self.vllm_config  # type: ignore[attr-defined]
        spec = vllm_config.speculative_config
        max_k = int(self.num_spec_tokens)  # type: ignore[attr-defined]
        if spec is None or max_k <= 0:
            log.warning("specctl_disabled", reason="the engine runs without speculative decoding")
            return
        if max_k > MAX_K:
            raise ValueError(
                f"specctl's scheduler supports at most {MAX_K} speculative tokens per step, "
                f"and this engine is configured with num_speculative_tokens={max_k}: lower it "
                f"to {MAX_K} or run without --scheduler-cls {_QUALNAME}"
            )
        data_parallel = int(vllm_config.parallel_config.data_parallel_size) > 1
        graphs = vllm_config.compilation_config.cudagraph_mode
        # Without a Dynamic SD table vLLM captures FULL graphs for one K: the V1 model
        # runner's target graphs replay one verification length, and the V2 runner's
        # drafter replays its captured number of draft steps for any K.
        if (
            not data_parallel
            and spec.num_speculative_tokens_per_batch_size is None
            and graphs.has_full_cudagraphs()
        ):
            raise ValueError(
                "specctl's scheduler changes the number of speculative tokens per step, which "
                f"FULL CUDA graphs (cudagraph_mode={graphs.name}) captured without a Dynamic "
                "SD table replay at one fixed K: let specctl's vLLM plugin declare it (if "
                "VLLM_PLUGINS is set, it must include 'specctl'), give --speculative-config a "
                "num_speculative_tokens_per_batch_size table, or set --compilation-config "
                '\'{"cudagraph_mode": "PIECEWISE"}\''
            )
        config = EngineConfig.load()
        method = str(spec.method)
        drafters = {method: max_k}
        hybrid = decide_hybrid(vllm_config, config)
        self._specctl_ngram: NgramDrafter | None = None
        if hybrid.ngram is not None:
            ngram = NgramDrafter(hybrid.ngram, int(vllm_config.model_config.max_model_len))
            ngram.warm_up()
            self._specctl_ngram = ngram
            drafters[NGRAM] = hybrid.ngram.max_k
        elif hybrid.refused_because:
            log.warning(
                "specctl_ngram_drafts_refused", drafter=method, reason=hybrid.refused_because
            )
        fallback = config.fallback(engine_default_arm(method, max_k))
        if not fallback.is_off and fallback.k > drafters.get(fallback.drafter, 0):
            offered = ", ".join(f"{d} up to K={k}" for d, k in drafters.items())
            raise ValueError(
                f"SPECCTL_FALLBACK_ARM={fallback.name!r} cannot run on this engine: it offers "
                f"{offered}"
            )
        import vllm

        hello = hello_message(
            config.engine_id, drafters, fallback,
            model=str(vllm_config.model_config.served_model_name or vllm_config.model_config.model),
            vllm_version=str(vllm.__version__),
            max_batch_size=int(vllm_config.scheduler_config.max_num_seqs),
            batch_drafter=method,
        )  # fmt: skip
        validate_hello(hello)  # what the sidecar will check, checked here first
        client = SidecarClient(config, hello, drafters, fallback)
        self.specctl_client = client
        # vLLM's dense lookup of the user's Dynamic SD table (None without one; vLLM drops
        # the table under data parallelism): it caps the step's K, the policy picks below.
        table: list[int] | None = self.dynamic_sd_lookup  # type: ignore[has-type]
        self._specctl_table = table
        # Under data parallelism every rank must propose the same number of drafts on
        # every step, or the ranks' collectives diverge: the step's K stays vLLM's.
        self._specctl_dp = data_parallel
        self.specctl = StepRecorder(
            config, client, max_k, k_by_batch_size=table, fixed_step_k=self._specctl_dp,
            substituted_drafter=NGRAM if self._specctl_ngram is not None else None,
        )  # fmt: skip
        self._specctl_engine_arm = engine_default_arm(method, max_k)
        self._specctl_lookup = _StepK(max_k, table, int(vllm_config.scheduler_config.max_num_seqs))
        self._specctl_view = client.view
        self._specctl_sets_k = False
        self._specctl_schedule_start = 0.0
        client.start()
        log.info(
            "specctl_started", engine_id=config.engine_id, address=config.address,
            scheduler=type(self).__name__, drafters=drafters, fallback_arm=fallback.name,
        )  # fmt: skip

    def add_request(self, request: Any) -> None:
        recorder = self.specctl
        if recorder is not None:
            try:
                # A live id is a streaming-input session's next chunk: vLLM folds it into
                # the session object, which keeps its place (see _update_request_as_session).
                if request.request_id not in self.requests:  # type: ignore[attr-defined]
                    self._specctl_classify(recorder, request)
            except Exception:  # a bookkeeping bug must never fail requests
                log.exception("specctl_hook_failed", hook="add_request")
        super().add_request(request)  # type: ignore[misc]

    def _update_request_as_session(self, session: Any, update: Any) -> None:
        super()._update_request_as_session(session, update)  # type: ignore[misc]
        recorder = self.specctl
        if recorder is not None:
            try:
                # The chunk's sampling parameters are now the session's: so is its class.
                self._specctl_classify(recorder, session)
            except Exception:
                log.exception("specctl_hook_failed", hook="_update_request_as_session")

    @staticmethod
    def _specctl_classify(recorder: StepRecorder, request: Any) -> None:
        params = request.sampling_params
        recorder.add(
            request.request_id,
            recorder.classify(
                params.extra_args if params is not None else None, request.num_prompt_tokens
            ),
            request,
        )

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        recorder = self.specctl
        if recorder is not None:
            # Requests that finished since the last step leave their classes first.
            finished = self.finished_req_ids  # type: ignore[attr-defined]
            if finished:
                try:
                    recorder.forget(finished)
                    if self._specctl_ngram is not None:
                        self._specctl_ngram.release(finished)
                except Exception:
                    log.exception("specctl_hook_failed", hook="schedule")
            self._specctl_schedule_start = recorder.clock()
            try:
                self._specctl_begin_step()
                if self._specctl_ngram is not None and recorder.substituted:
                    # The drafts this step verifies: n-gram ones for the classes that chose
                    # an n-gram arm last step, computed from the tokens that step produced.
                    self._specctl_ngram.draft(
                        recorder.substituted,
                        self.structured_output_manager.validate_tokens,  # type: ignore[attr-defined]
                    )
            except Exception:
                log.exception("specctl_hook_failed", hook="schedule")
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def _specctl_begin_step(self) -> None:
        """Read the policy once for the step and decide who sets the step's K.

        In fallback on the engine's own setting, and under data parallelism,
        the step runs exactly as in vLLM's scheduler: vLLM's K and vLLM's
        lookup (the user's table or none, so vLLM pads a request's first decode
        step to 1+K as it does without specctl). Otherwise specctl's lookup
        stands in, which also turns that padding off, as vLLM's Dynamic SD does.
        """
        view = self.specctl_client.view  # type: ignore[union-attr]
        self._specctl_view = view
        as_vllm = self._specctl_dp or (
            view.version == 0 and view.fallback == self._specctl_engine_arm
        )
        self._specctl_sets_k = not as_vllm
        self.dynamic_sd_lookup = self._specctl_table if as_vllm else self._specctl_lookup

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        recorder = self.specctl
        if recorder is not None:
            num_scheduled = scheduler_output.num_scheduled_tokens
            try:
                k = recorder.on_schedule(
                    id(scheduler_output),
                    len(num_scheduled),
                    self._specctl_schedule_start,
                    self._specctl_view,
                )
                if num_scheduled and self._specctl_sets_k:
                    # Read by the drafter, and by AsyncScheduler for its placeholders.
                    scheduler_output.num_spec_tokens_to_schedule = k
            except Exception:  # vLLM's own K stands for this step
                log.exception("specctl_hook_failed", hook="_update_after_schedule")
        super()._update_after_schedule(scheduler_output)  # type: ignore[misc]
        if recorder is not None:
            try:
                self._specctl_after_schedule(scheduler_output)
            except Exception:
                log.exception("specctl_hook_failed", hook="_update_after_schedule")

    def _specctl_after_schedule(self, scheduler_output: Any) -> None:
        """Per-variant step once vLLM has set up the next drafts."""

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        super().update_draft_token_ids(draft_token_ids)  # type: ignore[misc]
        recorder = self.specctl
        if recorder is not None:
            try:
                recorder.cut_drafts()
            except Exception:
                log.exception("specctl_hook_failed", hook="update_draft_token_ids")

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        recorder = self.specctl
        if recorder is not None:
            try:
                recorder.on_output(
                    id(scheduler_output),
                    scheduler_output.num_scheduled_tokens,
                    scheduler_output.total_num_scheduled_tokens,
                    scheduler_output.scheduled_spec_decode_tokens,
                    model_runner_output.req_id_to_index,
                    model_runner_output.sampled_token_ids,
                )
            except Exception:
                log.exception("specctl_hook_failed", hook="update_from_output")
        return outputs

    def shutdown(self) -> None:
        client = self.specctl_client
        if client is not None:
            client.close()
        super().shutdown()  # type: ignore[misc]


def _async_scheduling(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    vllm_config = kwargs.get("vllm_config", args[0] if args else None)
    return bool(getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False))


def _scheduler_base() -> type:
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


def _async_scheduler_base() -> type:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    return AsyncScheduler


class SpecctlAsyncScheduler(_SpecctlMixin, _async_scheduler_base()):  # type: ignore[misc]
    """vLLM's AsyncScheduler with specctl: drafts stay in the worker, so the per-request
    K is applied by shortening each request's draft placeholders."""

    def _specctl_after_schedule(self, scheduler_output: Any) -> None:
        # AsyncScheduler gave every request placeholders for the step's K.
        recorder = self.specctl
        assert recorder is not None
        recorder.cut_placeholders(scheduler_output.num_scheduled_tokens, self.requests)


class SpecctlScheduler(_SpecctlMixin, _scheduler_base()):  # type: ignore[misc]
    """vLLM's Scheduler with specctl; builds a SpecctlAsyncScheduler under async scheduling."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is SpecctlScheduler and _async_scheduling(args, kwargs):
            # Not a SpecctlScheduler instance, so Python does not call __init__ again.
            return SpecctlAsyncScheduler(*args, **kwargs)
        return super().__new__(cls)
