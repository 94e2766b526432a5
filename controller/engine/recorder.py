"""Per-step bookkeeping on the scheduler's hot path, kept free of vLLM imports.

Timeline of one request's drafts under synchronous scheduling: in step t the
scheduler decides who runs; the model verifies the drafts proposed in step
t-1 and proposes new ones with the step-level K; after the step the drafts
arrive (``update_draft_token_ids``) and are truncated to each request's own K.
So an arm sampled at schedule time in step t governs the drafts verified in
step t+1, and that is where its outcome (drafted, accepted, the step's time)
is recorded, with the propensity it was sampled with.

Two attributes live on each vLLM ``Request``: ``specctl_class`` (set once when
the request arrives) and ``specctl_choice`` (the :class:`Assignment` that
governs its next drafts). Assignments are shared by every request of a class
in a step, so the per-request cost is an attribute store, not an allocation.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Mapping, MutableSequence
from dataclasses import dataclass
from typing import Any

import structlog

from controller.engine.client import SidecarClient
from controller.engine.config import EngineConfig
from controller.steps import StepRecord, validate_class_name

log = structlog.get_logger("controller.engine.recorder")

# Distinct invalid class values warned about; beyond that they are only counted.
_MAX_WARNED_CLASSES = 100


@dataclass(frozen=True, slots=True)
class Assignment:
    """An arm sampled for one workload class in one step."""

    workload_class: str
    arm_name: str
    k: int
    propensity: float
    policy_version: int
    load_bucket: int


@dataclass(slots=True)
class _Plan:
    """What one scheduler output verifies: the assignment of each scheduled request."""

    start_monotonic: float
    batch_size: int
    previous: list[Assignment | None]


class StepRecorder:
    """Samples arms, truncates drafts and records outcomes for one engine."""

    def __init__(self, config: EngineConfig, client: SidecarClient, max_k: int) -> None:
        self.config = config
        self.client = client
        self.max_k = max_k
        self.rng = random.Random(config.seed)
        self.known_classes: set[str] = {config.default_class}
        self.invalid_class_total = 0
        self._warned: set[str] = set()
        self._plans: dict[int, _Plan] = {}
        self._step_index = 0
        self._last_end = 0.0
        # Whether the last step assigned different K to different requests.
        self.mixed_k = False

    # -- request arrival ---------------------------------------------------------------------

    def classify(self, extra_args: Mapping[str, Any] | None, num_prompt_tokens: int) -> str:
        """The request's workload class; never raises (bad values warn once and fall back)."""
        value = extra_args.get(self.config.class_key) if extra_args else None
        if value is None:
            if self.config.class_from_prompt_len:
                return self.config.class_for_prompt_len(num_prompt_tokens)
            return self.config.default_class
        name = value if isinstance(value, str) else str(value)
        if name in self.known_classes:
            return name
        problem = validate_class_name(name)
        if problem is None and len(self.known_classes) >= self.config.max_classes:
            problem = f"workload class {name!r} would exceed max_classes={self.config.max_classes}"
        if problem is not None:
            self.invalid_class_total += 1
            key = name[:80]
            if key not in self._warned and len(self._warned) < _MAX_WARNED_CLASSES:
                self._warned.add(key)
                log.warning(
                    "specctl_invalid_workload_class", key=self.config.class_key, problem=problem,
                    using=self.config.default_class,
                )  # fmt: skip
            return self.config.default_class
        self.known_classes.add(name)
        return name

    # -- schedule ----------------------------------------------------------------------------

    def on_schedule(
        self,
        output_id: int,
        num_scheduled_tokens: Mapping[str, int],
        requests: Mapping[str, Any],
        start_monotonic: float,
    ) -> int:
        """Sample an arm per class present, assign it to each request; return the step's K.

        Each scheduled request's previous assignment (what governs the drafts
        verified in this step) is kept, in the output's order, for :meth:`on_output`.
        """
        view = self.client.view
        batch_size = len(num_scheduled_tokens)
        bucket = view.load_bucket(batch_size)
        previous: list[Assignment | None] = []
        append = previous.append
        chosen: dict[str, Assignment] = {}
        for req_id in num_scheduled_tokens:
            request = requests[req_id]
            append(request.specctl_choice)
            if request.is_prefill_chunk:
                request.specctl_choice = None
                continue
            workload_class = request.specctl_class
            assignment = chosen.get(workload_class)
            if assignment is None:
                choice = view.choose(workload_class, bucket, self.rng.random())
                arm = choice.arm
                assignment = Assignment(
                    workload_class, arm.name, arm.k, choice.propensity, view.version, bucket
                )
                chosen[workload_class] = assignment
            request.specctl_choice = assignment
        self._plans[output_id] = _Plan(start_monotonic, batch_size, previous)
        if not chosen:
            self.mixed_k = False
            return 0
        ks = {a.k for a in chosen.values()}
        self.mixed_k = len(ks) > 1
        return min(max(ks), self.max_k)

    # -- drafts ------------------------------------------------------------------------------

    def truncate_drafts(
        self,
        req_ids: Iterable[str],
        drafts: Iterable[MutableSequence[int]],
        requests: Mapping[str, Any],
    ) -> None:
        """Cut each request's drafts to its arm's K (synchronous scheduling)."""
        if not self.mixed_k:
            return  # every request drafted exactly the step's K
        for req_id, draft in zip(req_ids, drafts, strict=False):
            request = requests.get(req_id)
            if request is None:
                continue
            choice = request.specctl_choice
            if choice is not None and len(draft) > choice.k:
                del draft[choice.k :]

    def placeholders(self, req_ids: Iterable[str], requests: Mapping[str, Any]) -> None:
        """Size each request's draft placeholders to its arm's K (async scheduling).

        vLLM sized them all to the engine's maximum K before the arms were sampled.
        """
        by_k: dict[int, list[int]] = {}
        for req_id in req_ids:
            request = requests[req_id]
            choice = request.specctl_choice
            if choice is None or not request.spec_token_ids:
                continue
            k = choice.k
            if len(request.spec_token_ids) != k:
                ph = by_k.get(k)
                if ph is None:
                    ph = by_k[k] = [-1] * k
                request.spec_token_ids = ph

    # -- output ------------------------------------------------------------------------------

    def on_output(
        self,
        output_id: int,
        num_scheduled_tokens: Mapping[str, int],
        total_num_scheduled_tokens: int,
        spec_tokens: Mapping[str, list[int]],
        req_id_to_index: Mapping[str, int],
        sampled_token_ids: list[list[int]] | Any,
    ) -> None:
        """Record the step's outcome per request that was in decode, and queue it."""
        plan = self._plans.pop(output_id, None)
        if plan is None:
            return
        now = time.monotonic()
        step_time = now - max(plan.start_monotonic, self._last_end)
        self._last_end = now
        if step_time <= 0.0:
            step_time = 1e-9
        classes: list[str] = []
        arms: list[str] = []
        propensity: list[float] = []
        drafted_col: list[int] = []
        accepted_col: list[int] = []
        first: Assignment | None = None
        for (req_id, n), choice in zip(num_scheduled_tokens.items(), plan.previous, strict=False):
            if choice is None:
                continue
            spec = spec_tokens.get(req_id)
            drafted = len(spec) if spec else 0
            if n != drafted + 1:
                continue  # not a decode step for this request
            accepted = 0
            if drafted:
                index = req_id_to_index.get(req_id)
                if index is None or not sampled_token_ids:
                    continue
                accepted = len(sampled_token_ids[index]) - 1
                if accepted < 0:
                    continue
                if accepted > drafted:
                    accepted = drafted
            if first is None:
                first = choice
            classes.append(choice.workload_class)
            arms.append(choice.arm_name)
            propensity.append(choice.propensity)
            drafted_col.append(drafted)
            accepted_col.append(accepted)
        self._step_index += 1
        view = self.client.view
        self.client.push(
            StepRecord(
                step_index=self._step_index,
                step_time_s=step_time,
                batch_size=plan.batch_size,
                num_scheduled_tokens=total_num_scheduled_tokens,
                policy_version=first.policy_version if first else view.version,
                load_bucket=first.load_bucket if first else view.load_bucket(plan.batch_size),
                step_end_unix_s=time.time(),
                classes=classes,
                arms=arms,
                propensity=propensity,
                drafted=drafted_col,
                accepted=accepted_col,
            )
        )
