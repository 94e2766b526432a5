"""The real-engine benchmark: every policy on one vLLM engine, phase by phase, repeated.

One vLLM server (specctl's scheduler) runs for the whole benchmark, and one
sidecar at a time at the same socket. For each repetition and each load
phase, every policy runs one *segment* in an order rotated from phase to
phase and repetition to repetition (so that no policy always runs first, or
always right after a given one):

- a static arm ``static:<arm>``: the reference sidecar (policy ``static``)
  pins every class to the arm through its operator override, on the same
  engine; ``static:off`` is no speculation;
- a learning policy (``specctl`` and each peer): the sidecar is restarted with
  ``--policy NAME``; the engine reconnects by itself. With ``carry_state``
  (the default) the policy's sidecar keeps its state in a directory of its
  own and restores it on its next start, so each learning policy goes
  through the phases in order as if it alone had run through the load swing;
- ``hindsight``: the reference sidecar pins each class to its best static arm
  of the phase so far, all at once (:mod:`.hindsight`): the oracle's choice,
  run as one workload;
- a variant ``<policy>@<label>``: the policy with parameters of its own, run
  and kept apart like any other learning policy, so a change of parameters is
  measured against the policy it would replace in the same repetitions.

A segment starts the phase's clients (see :mod:`.load`), lets them run
unmeasured for ``settle_s`` (static arms: the closed loop ramping up) or
``warmup_s`` (learning policies: the ramp-up, the reconnect and the policy
adapting to the phase's load), then measures for the phase's ``seconds``: the
committed tokens per class (the sidecar's request-rounds plus accepted
drafts, what the engine reported), the engine's CPU seconds (engine core and
model workers, :func:`~.engine_cpu.engine_cpu_seconds`) and the wall time. The
clients are then cancelled and the engine drained before the next segment.
Learning policies' evidence is sampled every ``sample_every_s`` (the
timeline: arm probabilities and decision stability per context).

:mod:`.schedule` lays the segments out, :mod:`.readings` reads the counters,
:mod:`.timeline` turns evidence samples into rows, and :mod:`.analysis` turns
the segments into goodput, the oracle and the ratios.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specctl.bench.engine_model import prepare_model
from specctl.bench.hindsight import hindsight_arms
from specctl.bench.load import LoadGenerator, PromptPool, load_tokenizer, read_prompts
from specctl.bench.readings import Reading, read_caught_up, vllm_tokens
from specctl.bench.schedule import PolicyRun, estimate_seconds, expand_policies, schedule
from specctl.bench.sidecar_process import SidecarProcess
from specctl.bench.timeline import evidence_rows
from specctl.bench.vllm_server import SERVED_MODEL_NAME, VllmServer
from specctl.bench.workload import Workload

REFERENCE_SIDECAR = "static"
Progress = Callable[[str], None]


@dataclass
class BenchOptions:
    out: Path
    models_dir: Path
    repetitions: int | None = None
    warmup_s: float | None = None
    policies: Sequence[str] | None = None
    seed: int = 0
    port: int = 0
    progress: Progress | None = None
    # called with each evidence sample of a learning policy (a list of timeline rows)
    on_sample: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None
    # called after each segment with its record
    on_segment: Callable[[dict[str, Any]], None] | None = None


class EngineBench:
    """Runs a workload's schedule on one engine; :meth:`run` returns the segments and the
    timeline (raw measurements), which :func:`specctl.bench.analysis.summarize` reads."""

    def __init__(self, workload: Workload, options: BenchOptions) -> None:
        self.workload = workload
        self.options = options
        self.repetitions = options.repetitions or workload.bench.repetitions
        self.warmup_s = workload.bench.warmup_s if options.warmup_s is None else options.warmup_s
        self.runs = expand_policies(workload, options.policies)
        if not self.runs:
            raise ValueError("no policies to run")
        from specctl.sidecar.config import PolicyConfig

        self.bounds = tuple(workload.load_bucket_bounds or PolicyConfig().load_bucket_bounds)
        self.started = time.monotonic()
        self.segments: list[dict[str, Any]] = []
        self.timeline: list[dict[str, Any]] = []
        self.engine_info: dict[str, Any] = {}
        self._sidecar: SidecarProcess | None = None
        self._server: VllmServer | None = None
        self._sidecar_mode = ""  # "static" or a learning policy's name
        self._state_root: Path | None = None
        self._pools: dict[str, PromptPool] = {}

    # -- helpers -------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def progress(self, line: str) -> None:
        if self.options.progress is not None:
            self.options.progress(line)

    def _use_policy(self, run: PolicyRun, pins: Mapping[str, str]) -> None:
        """Point the engine at ``run``: re-pin the reference sidecar (each class to its arm
        in ``pins``), or restart the sidecar with the learning policy."""
        assert self._sidecar is not None
        sidecar = self._sidecar
        if run.learning:
            state_dir = None
            if self.workload.bench.carry_state and self._state_root is not None:
                state_dir = self._state_root / run.name
            sidecar.start(run.policy, run.params, state_dir=state_dir)
            self._sidecar_mode = run.name
        else:
            if self._sidecar_mode != REFERENCE_SIDECAR:
                # its decision log holds the static segments' steps, next to the policies'
                reference_dir = None
                if self._state_root is not None:
                    reference_dir = self._state_root / REFERENCE_SIDECAR
                sidecar.start(REFERENCE_SIDECAR, {"arm": "off"}, state_dir=reference_dir)
                self._sidecar_mode = REFERENCE_SIDECAR
            for c in self.workload.classes:
                sidecar.override(c.name, pins[c.name])
        sidecar.wait_connected()
        if not run.learning:
            time.sleep(0.6)  # the pinned policy is pushed (min_push_interval_s 0.5 s)

    def _evidence_rows(self, meta: dict[str, Any]) -> list[dict[str, Any]]:
        assert self._sidecar is not None
        response = self._sidecar.evidence()
        return evidence_rows(response, self.workload, self.bounds, meta, round(self.elapsed(), 2))

    # -- one segment ---------------------------------------------------------------------

    def run_segment(self, rep: int, phase_index: int, position: int, run: PolicyRun) -> dict:
        assert self._server is not None
        phase = self.workload.phases[phase_index]
        clients = phase.clients(self.workload.classes)
        lead = self.warmup_s if run.learning else self.workload.bench.settle_s
        index = len(self.segments)
        meta: dict[str, Any] = {
            "segment": index,
            "policy": run.name,
            "repetition": rep,
            "phase": phase.name,
            "phase_index": phase_index,
        }
        self.progress(
            f"rep {rep + 1}/{self.repetitions} phase {phase.name} (concurrency "
            f"{phase.total_concurrency}) {run.name}: "
            f"{'warm-up' if run.learning else 'settle'} {lead:.0f} s, measure {phase.seconds:.0f} s"
        )
        pins: dict[str, str] = {}
        if run.hindsight:
            pins = hindsight_arms(
                self.segments, phase.name, [c.name for c in self.workload.classes]
            )
            self.progress(f"    pinned: {', '.join(f'{c} {a}' for c, a in pins.items())}")
        elif run.static_arm is not None:
            pins = {c.name: run.static_arm for c in self.workload.classes}
        t_switch = time.monotonic()
        self._use_policy(run, pins)
        switch_s = time.monotonic() - t_switch
        started_s = self.elapsed()
        start, end, (vllm_tokens, vllm_window), stats = asyncio.run(
            self._drive(run, phase.seconds, lead, clients, rep, meta)
        )
        window = clock_window = max(end.t - start.t, 1e-9)
        if start.learned_until > 0.0 and end.learned_until > start.learned_until:
            # the engine time the counters cover
            window = end.learned_until - start.learned_until
        # the CPU clocks are read at the instants, not at the engine time the counters
        # cover: their rate over the instants, over the window
        cpu_scale = window / clock_window
        per_class: dict[str, dict[str, Any]] = {}
        for c in self.workload.classes:
            arm_rounds = {
                arm: end.arm_rounds.get((c.name, arm), 0.0)
                - start.arm_rounds.get((c.name, arm), 0.0)
                for arm in sorted({a for (k, a) in end.arm_rounds if k == c.name})
            }
            arm_rounds = {a: round(v) for a, v in arm_rounds.items() if v > 0}
            rounds = sum(arm_rounds.values())
            accepted = end.accepted.get(c.name, 0.0) - start.accepted.get(c.name, 0.0)
            drafted = end.drafted.get(c.name, 0.0) - start.drafted.get(c.name, 0.0)
            s = stats[c.name] if c.name in stats else None
            per_class[c.name] = {
                "clients": clients.get(c.name, 0),
                "tokens": round(rounds + accepted),
                "rounds": rounds,
                "accepted": round(accepted),
                "drafted": round(drafted),
                "arm_rounds": arm_rounds,
                "completed": s.completed if s else 0,
                "failed": s.failed if s else 0,
                "errors": s.errors if s else [],
            }
        record: dict[str, Any] = {
            "index": index,
            "repetition": rep,
            "phase": phase.name,
            "position": position,
            "policy": run.name,
            "learning": run.learning,
            # the arm each class was pinned to (static arms and hindsight)
            "pinned": pins,
            "started_s": round(started_s, 2),
            "switch_s": round(switch_s, 2),
            "unmeasured_s": lead,
            "window_s": round(window, 4),
            "engine_cpu_s": round((end.engine_cpu_s - start.engine_cpu_s) * cpu_scale, 4),
            "worker_cpu_s": round((end.worker_cpu_s - start.worker_cpu_s) * cpu_scale, 4),
            # the sidecar's own CPU over the window: on a machine the engine keeps busy,
            # what a policy's learning takes from it
            "sidecar_cpu_s": round(
                max(end.sidecar_cpu_s - start.sidecar_cpu_s, 0.0) * cpu_scale, 4
            ),
            "vllm_generation_tokens": round(vllm_tokens),
            "vllm_window_s": round(vllm_window, 4),
            "scrape_s": [round(start.scrape_s, 3), round(end.scrape_s, 3)],
            # how long the readings waited for the sidecar to learn up to their instant
            "caught_up_s": [round(start.caught_up_s, 3), round(end.caught_up_s, 3)],
            "classes": per_class,
        }
        self.segments.append(record)
        tokens = sum(c["tokens"] for c in per_class.values())
        failed = sum(c["failed"] for c in per_class.values())
        offs = [
            f"{name} {c['arm_rounds'].get('off', 0) / c['rounds']:.0%}"
            for name, c in per_class.items()
            if c["rounds"]
        ]
        self.progress(
            f"    {run.name}: {tokens / max(record['engine_cpu_s'], 1e-9):.1f} tok/engine CPU s, "
            f"{tokens / max(window, 1e-9):.1f} tok/s; "
            f"sidecar {record['sidecar_cpu_s'] / max(window, 1e-9):.1%} of a core; "
            f"off: {', '.join(offs)}" + (f"; {failed} failed requests" if failed else "")
        )
        if self.options.on_segment is not None:
            self.options.on_segment(record)
        return record

    async def _drive(
        self,
        run: PolicyRun,
        seconds: float,
        lead: float,
        clients: Mapping[str, int],
        rep: int,
        meta: dict[str, Any],
    ) -> tuple[Reading, Reading, tuple[float, float], dict[str, Any]]:
        server, sidecar = self._server, self._sidecar
        assert server is not None and sidecar is not None
        stop = asyncio.Event()
        generator = LoadGenerator(
            server.base_url, SERVED_MODEL_NAME, self.workload.classes, self._pools
        )
        phase_index = meta["phase_index"]
        load = asyncio.create_task(
            generator.run(
                {c: n for c, n in clients.items() if n > 0},
                (self.options.seed, rep, phase_index),
                stop,
            )
        )
        sampler: asyncio.Task[None] | None = None
        if run.learning:
            sampler = asyncio.create_task(self._sample(meta, stop))
        try:
            await self._sleep_watching(lead, load)
            # vLLM's counter is read from the same instant: the start reading can wait
            # seconds for a busy sidecar to catch up, and the cross-check covers the window
            vllm_start = asyncio.create_task(asyncio.to_thread(vllm_tokens, server))
            start = await asyncio.to_thread(read_caught_up, server, sidecar, time.time())
            meta["measured"] = True
            # the window runs from the engine time the start reading covers
            end_at = (start.learned_until or time.time()) + seconds
            await self._sleep_watching(end_at - time.time(), load)
            end = await asyncio.to_thread(read_caught_up, server, sidecar, end_at)
            vllm_end = await asyncio.to_thread(vllm_tokens, server)
            vllm_begin = await vllm_start
            vllm = (vllm_end[0] - vllm_begin[0], vllm_end[1] - vllm_begin[1])
        finally:
            stop.set()
            stats = await load
            if sampler is not None:
                await sampler
        await asyncio.to_thread(server.wait_idle)
        return start, end, vllm, stats

    async def _sleep_watching(self, seconds: float, load: asyncio.Task[Any]) -> None:
        """Sleep, checking that the engine and the sidecar are alive."""
        assert self._server is not None and self._sidecar is not None
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(1.0, left))
            if load.done():
                load.result()  # raises what stopped the clients
            self._server.check_alive()
            self._sidecar.check_alive()

    async def _sample(self, meta: dict[str, Any], stop: asyncio.Event) -> None:
        every = self.workload.bench.sample_every_s
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=every)
                return
            except TimeoutError:
                pass
            try:
                rows = await asyncio.to_thread(self._evidence_rows, dict(meta))
            except Exception as exc:  # a missed sample only leaves a gap in the timeline
                self.progress(f"    (evidence sample failed: {type(exc).__name__}: {exc})")
                continue
            self.timeline.extend(rows)
            if self.options.on_sample is not None:
                self.options.on_sample(meta, rows)

    # -- the whole run -------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Start the engine and the sidecar, run every segment, stop both (also on error or
        Ctrl-C); returns the raw measurements."""
        out = self.options.out
        logs = out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="specctl-b-"))  # short: a unix socket path
        self._state_root = workdir / "state"
        try:
            self.progress(f"preparing the model ({self.workload.model.label}) ...")
            t0 = time.monotonic()
            model, spec = prepare_model(self.workload, self.options.models_dir)
            build_s = time.monotonic() - t0
            tokenizer = load_tokenizer(model)
            self._pools = {
                c.name: PromptPool(read_prompts(c.prompts), tokenizer, c)
                for c in self.workload.classes
            }
            self._sidecar = SidecarProcess(workdir, logs, self.workload.load_bucket_bounds)
            self._sidecar.start(REFERENCE_SIDECAR, {"arm": "off"})
            self._sidecar_mode = REFERENCE_SIDECAR
            m = self.workload.model
            self._server = VllmServer(
                model=model,
                speculative=spec,
                sidecar_address=self._sidecar.address,
                log_path=logs / "vllm.log",
                dtype=m.dtype,
                max_model_len=m.max_model_len,
                max_num_seqs=m.max_num_seqs,
                step_clock=self.workload.step_clock,
                env=self.workload.engine_env,
                extra_args=self.workload.engine_args,
                seed=self.options.seed,
                port=self.options.port,
            )
            self.progress("starting vLLM with specctl's scheduler ...")
            start_s = self._server.start()
            self.progress(f"vLLM up in {start_s:.0f} s on {self._server.base_url}")
            self.engine_info = {
                "model": model,
                "speculative_config": spec,
                "arms": self.workload.arms(),
                "load_bucket_bounds": list(self.bounds),
                "model_build_s": round(build_s, 1),
                "engine_start_s": round(start_s, 1),
                "command": self._server.cmd,
            }
            plan = schedule(self.workload, self.runs, self.repetitions)
            self.progress(
                f"{len(plan)} segments ({len(self.runs)} policies x {len(self.workload.phases)} "
                f"phases x {self.repetitions} repetitions), about "
                f"{estimate_seconds(self.workload, self.runs, self.repetitions) / 60:.1f} min "
                "of load"
            )
            positions: dict[tuple[int, int], int] = {}
            for rep, p, run in plan:
                pos = positions.get((rep, p), 0)
                positions[(rep, p)] = pos + 1
                self.run_segment(rep, p, pos, run)
        finally:
            if self._server is not None:
                self._server.stop()
            if self._sidecar is not None:
                self._sidecar.stop()
            # the decision logs and snapshots (the policies' and the static arms'), for
            # `specctl replay`
            if self._state_root.is_dir():
                shutil.rmtree(out / "state", ignore_errors=True)
                shutil.copytree(self._state_root, out / "state")
            shutil.rmtree(workdir, ignore_errors=True)
        return {
            "engine": self.engine_info,
            "segments": self.segments,
            "timeline": self.timeline,
            "repetitions": self.repetitions,
            "warmup_s": self.warmup_s,
            "policies": [
                {
                    "name": r.name,
                    "policy": r.policy if r.learning else None,
                    "static_arm": r.static_arm,
                    "params": dict(r.params),
                }
                for r in self.runs
            ],
            "elapsed_s": round(self.elapsed(), 1),
        }
