"""Per-step bookkeeping on the scheduler's hot path, kept free of vLLM imports.

Timeline of one request's drafts under synchronous scheduling: in step t the
scheduler decides who runs; the model verifies the drafts proposed in step
t-1 and proposes new ones with the step-level K; after the step the drafts
arrive (``update_draft_token_ids``) and are cut to each request's own K. So
the arms sampled at schedule time in step t govern the drafts verified in step
t+1, and that is where their outcome (drafted, accepted, the step's time) is
recorded, with the propensity each was sampled with. Under async scheduling
the drafts stay in the worker and the same K is applied to their placeholders.

All requests of a class share the class's arm in a step, so the step path
works per class, not per request: it samples one arm per class with live
requests, and only touches requests of classes whose K is below the step's K
(to cut their drafts). Per request it copies only the class (one C-level
``map``); turning the step into report rows happens on the client thread.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from specctl.engine.client import SidecarClient
from specctl.engine.config import EngineConfig
from specctl.engine.policy_view import Choice, PolicyView
from specctl.engine.step_clock import make_step_clock
from specctl.logs import get_logger
from specctl.steps import StepRecord, validate_class_name

log = get_logger(__name__)

# Distinct invalid class values warned about; beyond that they are only counted.
_MAX_WARNED_CLASSES = 100
_NO_DRAFTS: tuple[int, ...] = ()
# Scheduler outputs awaiting their model output; vLLM keeps at most a few in flight.
_MAX_PENDING_PLANS = 256


class _Plan(NamedTuple):
    """What a scheduler output verifies: the arms that governed its drafts."""

    start_clock: float
    governing: Mapping[str, Choice]
    policy_version: int
    load_bucket: int
    # the K the engine's drafter proposes in this step (verified in the next)
    draft_k: int


@dataclass(slots=True)
class RawStep:
    """One step as captured on the step path; :meth:`record` builds the report rows.

    ``num_scheduled``, ``spec_tokens``, ``req_id_to_index`` and ``sampled_token_ids``
    are vLLM's own per-step objects (from the scheduler output and the model
    runner output), which vLLM does not touch once the step's output is
    processed; only the classes are copied, as requests come and go.
    """

    step_index: int
    step_time_s: float
    step_end_unix_s: float
    num_scheduled_tokens: int
    plan: _Plan
    classes: list[str | None]
    num_scheduled: Mapping[str, int]
    spec_tokens: Mapping[str, Sequence[int]]
    req_id_to_index: Mapping[str, int]
    sampled_token_ids: Sequence[Sequence[int]]
    # Wall seconds of the step when tracing on a clock other than the wall (0: not measured).
    wall_time_s: float = 0.0

    def record(self) -> StepRecord:
        governing = self.plan.governing
        classes: list[str] = []
        arms: list[str] = []
        propensity: list[float] = []
        drafted_col: list[int] = []
        accepted_col: list[int] = []
        spec_tokens = self.spec_tokens
        req_id_to_index = self.req_id_to_index
        sampled = self.sampled_token_ids
        for (req_id, n), cls in zip(self.num_scheduled.items(), self.classes, strict=True):
            if cls is None:
                continue  # the request finished before the step was captured
            drafted = len(spec_tokens.get(req_id, _NO_DRAFTS))
            if n != drafted + 1:
                continue  # not a decode step for this request (prefill, resumption)
            choice = governing.get(cls)
            if choice is None or drafted > choice.arm.k:
                continue  # drafts from before this engine sampled an arm for the class
            accepted = 0
            if drafted:
                index = req_id_to_index.get(req_id)
                if index is None or index >= len(sampled):
                    continue
                accepted = min(max(len(sampled[index]) - 1, 0), drafted)
            classes.append(cls)
            arms.append(choice.arm.name)
            propensity.append(choice.propensity)
            drafted_col.append(drafted)
            accepted_col.append(accepted)
        return StepRecord(
            step_index=self.step_index,
            step_time_s=self.step_time_s,
            batch_size=len(self.num_scheduled),
            num_scheduled_tokens=self.num_scheduled_tokens,
            policy_version=self.plan.policy_version,
            load_bucket=self.plan.load_bucket,
            step_end_unix_s=self.step_end_unix_s,
            classes=classes,
            arms=arms,
            propensity=propensity,
            drafted=drafted_col,
            accepted=accepted_col,
            draft_k=self.plan.draft_k,
        )


class StepRecorder:
    """Samples arms, cuts drafts to each class's K and captures outcomes for one engine."""

    def __init__(
        self,
        config: EngineConfig,
        client: SidecarClient,
        max_k: int,
        *,
        k_by_batch_size: Sequence[int] | None = None,
        fixed_step_k: bool = False,
        substituted_drafter: str | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.max_k = max_k
        # A user's Dynamic SD table (vLLM's dense batch size -> K lookup): caps each step.
        self.k_by_batch_size = k_by_batch_size
        # Data parallelism: every step proposes max_k drafts, whatever the arms.
        self.fixed_step_k = fixed_step_k
        # The drafter whose drafts the scheduler computes itself (n-gram next to a model
        # drafter): its arms do not ask the engine's drafter for tokens.
        self.substituted_drafter = substituted_drafter
        # (K, requests) of the classes on a substituted arm in the last step: the scheduler
        # replaces their drafts before the next step verifies them.
        self.substituted: list[tuple[int, Iterable[Any]]] = []
        self.rng = random.Random(config.seed)
        self.invalid_class_total = 0
        self._warned: set[str] = set()
        # Live requests (waiting or running): class by id, and id -> vLLM request by class.
        self.class_of: dict[str, str] = {}
        self.members: dict[str, dict[str, Any]] = {}
        # The arms of the last step, per class: they govern the drafts now being proposed.
        self.chosen: dict[str, Choice] = {}
        self.step_k = max_k
        self._low_k: list[tuple[int, dict[str, Any]]] = []
        self._plans: dict[int, _Plan] = {}
        self._step_index = 0
        self._last_end = 0.0
        # the step clock: its readings bracket each step (see EngineConfig.step_clock)
        self.clock = make_step_clock(config.step_clock)
        self._version = 0
        self._bucket = 0
        # A trace holds wall time too: measured apart when the step clock is not the wall.
        self._wall_starts: dict[int, float] | None = (
            {} if config.trace_dir and config.step_clock != "wall" else None
        )
        self._last_wall_end = 0.0

    # -- requests ----------------------------------------------------------------------------

    def classify(self, extra_args: Mapping[str, Any] | None, num_prompt_tokens: int) -> str:
        """The request's workload class; never raises (bad values warn once and fall back)."""
        value = extra_args.get(self.config.class_key) if extra_args else None
        if value is None:
            if self.config.class_from_prompt_len:
                return self.config.class_for_prompt_len(num_prompt_tokens)
            return self.config.default_class
        name = value if isinstance(value, str) else str(value)
        if name in self.members:
            return name
        problem = validate_class_name(name)
        if problem is None and len(self.members) >= self.config.max_classes:
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
        return name

    def add(self, req_id: str, workload_class: str, request: Any) -> None:
        """Put a request in its class; a request already held under another class moves.

        The same id comes back for a new request that reuses a finished one's
        id, and for a streaming-input session whose next chunk names a class.
        """
        previous = self.class_of.get(req_id)
        if previous is not None and previous != workload_class:
            self._leave(req_id, previous)
        self.class_of[req_id] = workload_class
        members = self.members.get(workload_class)
        if members is None:
            members = self.members[workload_class] = {}
        members[req_id] = request

    def forget(self, req_ids: Iterable[str]) -> None:
        """Requests that finished (or were aborted) since the last step.

        vLLM reports a finished request's id at the next step, after a new
        request may have been added under the same id: only a finished
        request object leaves, so the new one keeps its class.
        """
        class_of = self.class_of
        for req_id in req_ids:
            cls = class_of.get(req_id)
            if cls is None:
                continue
            request = self.members[cls].get(req_id)
            if request is not None and not request.is_finished():
                continue  # a live request now holds this id
            del class_of[req_id]
            self._leave(req_id, cls)

    def _leave(self, req_id: str, workload_class: str) -> None:
        members = self.members.get(workload_class)
        if members is not None:
            members.pop(req_id, None)
            if not members:
                del self.members[workload_class]

    # -- schedule ----------------------------------------------------------------------------

    def on_schedule(
        self,
        output_id: int,
        batch_size: int,
        start_clock: float,
        view: PolicyView | None = None,
    ) -> int:
        """Sample an arm per class with live requests; return the step's K.

        The previous step's arms are kept as the plan of this output: they
        governed the drafts it verifies. ``view`` is the policy the scheduler
        read at the start of the step (default: the client's current one).
        With a Dynamic SD table, no arm runs above the table's K for the batch
        size; with ``fixed_step_k`` the step's K is ``max_k`` and only the
        per-class cuts follow the arms.
        """
        wall_starts = self._wall_starts
        if wall_starts is not None:
            if len(wall_starts) > _MAX_PENDING_PLANS:
                wall_starts.clear()
            wall_starts[output_id] = time.monotonic()
        if view is None:
            view = self.client.view
        bucket = view.load_bucket(batch_size)
        previous = self.chosen
        if len(self._plans) > _MAX_PENDING_PLANS:  # outputs vLLM never processed (shutdown)
            self._plans.clear()
        if previous:
            version, plan_bucket = self._version, self._bucket
        else:
            version, plan_bucket = view.version, bucket
        # One uniform for every class, over arms ordered by K (compile_policy): the classes'
        # K move together. A step costs what its deepest K costs, so independent draws would
        # all but never give a step in which every class drafts short, and the cost of short
        # steps would stay unmeasured; each class's own distribution is unchanged.
        u = self.rng.random()
        chosen: dict[str, Choice] = {}
        step_k = 0
        table = self.k_by_batch_size
        cap = table[batch_size] if table is not None and 0 < batch_size < len(table) else None
        substituted = self.substituted_drafter
        if cap is None or cap >= self.max_k:
            choose = view.choose
            for cls in self.members:
                choice = chosen[cls] = choose(cls, bucket, u)
                if choice.arm.k > step_k and choice.arm.drafter != substituted:
                    step_k = choice.arm.k
        else:
            choose_capped = view.choose_capped
            for cls in self.members:
                choice = chosen[cls] = choose_capped(cls, bucket, u, cap)
                if choice.arm.k > step_k and choice.arm.drafter != substituted:
                    step_k = choice.arm.k
        step_k = self.max_k if self.fixed_step_k else min(step_k, self.max_k)
        self._plans[output_id] = _Plan(start_clock, previous, version, plan_bucket, step_k)
        self.chosen = chosen
        self._version = view.version
        self._bucket = bucket
        self.step_k = step_k
        members = self.members
        if substituted is None:
            self._low_k = [(c.arm.k, members[cls]) for cls, c in chosen.items() if c.arm.k < step_k]
        else:
            self._low_k = [
                (c.arm.k, members[cls]) for cls, c in chosen.items()
                if c.arm.k < step_k and c.arm.drafter != substituted
            ]  # fmt: skip
            self.substituted = [
                (c.arm.k, members[cls].values()) for cls, c in chosen.items()
                if c.arm.drafter == substituted
            ]  # fmt: skip
        return step_k

    # -- drafts ------------------------------------------------------------------------------

    def cut_drafts(self) -> None:
        """Cut the drafts of requests whose class's K is below the step's (after they arrive)."""
        for k, members in self._low_k:
            for request in members.values():
                drafts = request.spec_token_ids
                if len(drafts) > k:
                    request.spec_token_ids = drafts[:k]

    def cut_placeholders(self, req_ids: Iterable[str], requests: Mapping[str, Any]) -> None:
        """Async scheduling: size each scheduled request's draft placeholders to its K.

        vLLM sized them to the step's K; the worker drafts that many and the
        next step verifies only as many as the placeholders say.
        """
        if not self._low_k:
            return
        k_of = {cls: c.arm.k for cls, c in self.chosen.items() if c.arm.k < self.step_k}
        class_of = self.class_of
        shared: dict[int, list[int]] = {}
        for req_id in req_ids:
            cls = class_of.get(req_id)
            if cls is None:
                continue
            k = k_of.get(cls)
            if k is None:
                continue
            request = requests[req_id]
            if len(request.spec_token_ids) > k:
                placeholders = shared.get(k)
                if placeholders is None:
                    placeholders = shared[k] = [-1] * k
                request.spec_token_ids = placeholders

    # -- output ------------------------------------------------------------------------------

    def on_output(
        self,
        output_id: int,
        num_scheduled_tokens: Mapping[str, int],
        total_num_scheduled_tokens: int,
        spec_tokens: Mapping[str, Sequence[int]],
        req_id_to_index: Mapping[str, int],
        sampled_token_ids: Sequence[Sequence[int]] | None,
    ) -> None:
        """Capture the step (one C-level map over its requests) and queue it."""
        plan = self._plans.pop(output_id, None)
        if plan is None:
            return
        wall_time = 0.0
        wall_starts = self._wall_starts
        if wall_starts is not None:
            wall_now = time.monotonic()
            wall_time = wall_now - max(wall_starts.pop(output_id, wall_now), self._last_wall_end)
            self._last_wall_end = wall_now
        now = self.clock()
        step_time = now - max(plan.start_clock, self._last_end)
        self._last_end = now
        self._step_index += 1
        self.client.push(
            RawStep(
                step_index=self._step_index,
                step_time_s=step_time if step_time > 0.0 else 1e-9,
                step_end_unix_s=time.time(),
                num_scheduled_tokens=total_num_scheduled_tokens,
                plan=plan,
                classes=list(map(self.class_of.get, num_scheduled_tokens)),
                num_scheduled=num_scheduled_tokens,
                spec_tokens=spec_tokens,
                req_id_to_index=req_id_to_index,
                sampled_token_ids=sampled_token_ids or (),
                wall_time_s=wall_time,
            )
        )
