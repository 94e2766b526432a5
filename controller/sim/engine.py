"""The simulated engine: a world of running requests and the engine's own step path.

:class:`World` is the ground truth: ``batch`` concurrent requests (a closed
loop: a finished request is replaced by one whose class follows the current
mix), and per step, for each request, the number of draft tokens accepted,
drawn as the first rejection among K Bernoulli trials with the table's
conditional rates, so noise is real. With ``independent_draws`` its draws do not
depend on the arms run: two runs of one seed under different policies see the
same arrivals (the n-th request's class and length), the same uniforms for each
step's acceptance and the same step-time noise (common random numbers).

:class:`SimulatedEngine` is what a vLLM engine with the specctl scheduler does
per step: for each (class, load bucket) present it samples an arm from its
compiled :class:`~specctl.engine.policy_view.PolicyView` (one sample per
class per step, applied to every request of the class), records the step as a
:class:`~specctl.steps.StepRecord`, and every ``report_every`` steps sends
``encode_step_report`` to a link. :class:`InProcessLink` admits it through the
sidecar's :class:`~specctl.sidecar.admission.Admission` (which decodes and
validates it), feeds the :class:`~specctl.sidecar.book.PolicyBook` and compiles
the ``Policy`` message of ``policy_for`` back into the engine, as the sidecar
and the engine's client do across gRPC (:mod:`specctl.sim.grpc_link`).

Time. A step of ``B`` requests lasts ``base_step_time(B) / B * sum_i cost_i``
(times a small log-normal noise), where ``cost_i`` is the cost of request i's
round in plain decode steps (:mod:`specctl.sim.table`); each request is
charged its own ``cost_i`` share of the step. A class's goodput is the tokens
its requests committed over the time charged to them, so classes sharing a
step do not pay for each other's drafts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from specctl.arms import OFF, Arm
from specctl.engine.client import FIRST_REPORT_SHARE
from specctl.engine.policy_view import PolicyView, compile_policy, fallback_view
from specctl.protocol.hello import hello_message
from specctl.protocol.policy_messages import policy_message
from specctl.protocol.reports import encode_step_report
from specctl.sidecar.admission import Admission
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.config import ServerConfig
from specctl.sidecar.metrics import SidecarMetrics
from specctl.sidecar.published import EnginePolicy
from specctl.sidecar.sessions import Sessions
from specctl.sim.scenario import AcceptanceChange, EventQueue, LoadChange, MixChange, Scenario
from specctl.sim.table import TargetModel
from specctl.steps import StepRecord

# the largest server.max_reports_per_s: simulated steps are not paced in real time
MAX_REPORTS_PER_S = 1e6
STEP_TIME_NOISE = 0.02  # log-normal sigma of a step's wall time
BLOCK_STEPS = 50  # resolution of the per-class accounting over time
START_UNIX_S = 1_790_000_000.0

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class SimWorld(Protocol):
    """What the simulated engine and the oracle need of a world.

    Two implement it: :class:`World`, drawn from a sweep table, and
    :class:`~specctl.sim.trace_world.TraceWorld`, replayed from a trace.
    """

    @property
    def scenario(self) -> Scenario: ...

    @property
    def model(self) -> TargetModel: ...

    step: int
    batch_size: int
    mix: FloatArray
    expected_tokens: FloatArray  # [class, arm], now
    cost: FloatArray  # [class, arm], in plain decode steps, now
    slot_class: IntArray  # the class of each running request

    def best_arm(self, class_id: int) -> int: ...

    def apply_events(self) -> list[object]: ...

    def run_round(self, request_arm: IntArray) -> tuple[IntArray, IntArray, FloatArray, float]: ...


def make_world(scenario: Scenario, rng: np.random.Generator) -> SimWorld:
    """The world a scenario runs in: a trace's replay, or draws from its table."""
    from specctl.sim.trace_scenario import TraceScenario
    from specctl.sim.trace_world import TraceWorld

    if isinstance(scenario, TraceScenario):
        return TraceWorld(scenario, rng)
    return World(scenario, rng)


class World:
    """The simulated requests, the true acceptance and cost, and the scenario's events."""

    def __init__(
        self, scenario: Scenario, rng: np.random.Generator, *, independent_draws: bool = False
    ) -> None:
        self.scenario = scenario
        self.model = scenario.model
        self.rng = rng
        # Without independent_draws every draw comes from rng in the order the run makes
        # them, and which requests finish, and whether a step drafts at all, move them.
        # With it arrivals' classes, their lengths, acceptance and noise each have a
        # stream of their own, and each step draws the same from each whatever its arms.
        self.independent_draws = independent_draws
        streams = rng.spawn(4) if independent_draws else [rng] * 4
        self._class_rng, self._length_rng, self._accept_rng, self._noise_rng = streams
        self.step = 0
        self.batch_size = scenario.batch
        self.acceptance_scale = np.ones(len(self.model.classes))
        self.mix = scenario.mix_vector()
        self._events = EventQueue(scenario.events)
        self._class_id = {c: i for i, c in enumerate(self.model.classes)}
        self.slot_class = self._new_classes(self.batch_size)
        self.slot_remaining = self._new_lengths(self.batch_size)
        self._refresh_truth()

    # ----------------------------------------------------------- truth

    def _refresh_truth(self) -> None:
        self.conditional = np.clip(
            self.model.conditional * self.acceptance_scale[:, None, None], 0.0, 1.0
        )
        self.expected_tokens = self.model.expected_tokens(self.acceptance_scale)
        self.cost = self.model.cost(self.batch_size)
        self.base_step_time_s = self.model.base_step_time_s(self.batch_size)
        # goodput[c, a] in tokens per second of one request's share of a step
        self.goodput = self.expected_tokens / (self.cost * self.base_step_time_s / self.batch_size)

    def best_arm(self, class_id: int) -> int:
        """The arm with the highest expected goodput for a class, now."""
        return int(np.argmax(self.goodput[class_id]))

    # ----------------------------------------------------------- requests

    def _new_classes(self, n: int) -> IntArray:
        return self._class_rng.choice(len(self.mix), size=n, p=self.mix).astype(np.int64)

    def _new_lengths(self, n: int) -> IntArray:
        mean = self.scenario.mean_output_tokens
        return self._length_rng.geometric(1.0 / mean, size=n).astype(np.int64)

    def apply_events(self) -> list[object]:
        """Apply the events due at the current step; return them."""
        fired: list[object] = list(self._events.pop_due(self.step))
        changed = False
        for e in fired:
            if isinstance(e, AcceptanceChange):
                self.acceptance_scale[self._class_id[e.workload_class]] = e.scale
                changed = True
            elif isinstance(e, MixChange):
                self.mix = self.scenario.mix_vector(e.weights)
            elif isinstance(e, LoadChange) and e.batch != self.batch_size:
                n = len(self.slot_class)
                if e.batch > n:
                    self.slot_class = np.concatenate(
                        [self.slot_class, self._new_classes(e.batch - n)]
                    )
                    self.slot_remaining = np.concatenate(
                        [self.slot_remaining, self._new_lengths(e.batch - n)]
                    )
                else:
                    self.slot_class = self.slot_class[: e.batch]
                    self.slot_remaining = self.slot_remaining[: e.batch]
                self.batch_size = e.batch
                changed = True
        if changed:
            self._refresh_truth()
        return fired

    def run_round(self, request_arm: IntArray) -> tuple[IntArray, IntArray, FloatArray, float]:
        """One step with these arms per request: (drafted, accepted, charged seconds, step time)."""
        cls = self.slot_class
        k = self.model.arm_k[request_arm]
        width = self.model.max_k
        drafts = bool(width and k.any())
        uniforms = (
            self._accept_rng.random((len(cls), width))
            if drafts or (width and self.independent_draws)
            else None
        )
        if drafts and uniforms is not None:
            ok = uniforms < self.conditional[cls, request_arm]
            accepted = np.cumprod(ok, axis=1).sum(axis=1).astype(np.int64)
        else:
            accepted = np.zeros(len(cls), dtype=np.int64)
        cost = self.cost[cls, request_arm]
        noise = float(np.exp(self._noise_rng.normal(0.0, STEP_TIME_NOISE)))
        share = self.base_step_time_s / self.batch_size * noise
        charged = cost * share
        step_time = float(charged.sum())
        # requests advance; finished ones are replaced by new arrivals
        self.slot_remaining -= accepted + 1
        done = np.flatnonzero(self.slot_remaining <= 0)
        if len(done):
            self.slot_class = self.slot_class.copy()
            self.slot_class[done] = self._new_classes(len(done))
            self.slot_remaining[done] = self._new_lengths(len(done))
        self.step += 1
        return k, accepted, charged, step_time


@dataclass
class RunRecord:
    """What one run committed and spent, per class over time and per (class, arm)."""

    classes: tuple[str, ...]
    arms: tuple[str, ...]
    steps: int
    block_steps: int = BLOCK_STEPS
    tokens: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))  # [block, class]
    time_s: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))  # [block, class]
    rounds: IntArray = field(default_factory=lambda: np.zeros((0, 0), np.int64))  # [class, arm]
    # request-rounds, and those run with ``off`` (arm 0), per [block, class]
    block_rounds: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    block_off_rounds: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    batch_size: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))  # [block]
    policy_versions: int = 0

    def __post_init__(self) -> None:
        blocks = -(-self.steps // self.block_steps)
        c, a = len(self.classes), len(self.arms)
        self.tokens = np.zeros((blocks, c))
        self.time_s = np.zeros((blocks, c))
        self.rounds = np.zeros((c, a), dtype=np.int64)
        self.block_rounds = np.zeros((blocks, c))
        self.block_off_rounds = np.zeros((blocks, c))
        self.batch_size = np.zeros(blocks, dtype=np.int64)

    def add(
        self, step: int, cls: IntArray, arm: IntArray, committed: IntArray, charged: FloatArray
    ) -> None:
        b = step // self.block_steps
        c = len(self.classes)
        self.tokens[b] += np.bincount(cls, weights=committed, minlength=c)
        self.time_s[b] += np.bincount(cls, weights=charged, minlength=c)
        np.add.at(self.rounds, (cls, arm), 1)
        self.block_rounds[b] += np.bincount(cls, minlength=c)
        self.block_off_rounds[b] += np.bincount(cls, weights=arm == 0, minlength=c)
        self.batch_size[b] = max(self.batch_size[b], len(cls))


class Link(Protocol):
    """Where an engine's step records go and its policy comes from."""

    @property
    def view(self) -> PolicyView: ...

    def push(self, record: StepRecord) -> None: ...

    def flush(self) -> None: ...


class SimulatedEngine:
    """The engine side of one simulated vLLM instance: sample arms, run the step, record it."""

    def __init__(self, world: SimWorld, link: Link, *, seed: int) -> None:
        self.world = world
        self.link = link
        self.model = world.model
        self.rng = np.random.default_rng([seed, 1])
        self.clock_s = START_UNIX_S
        self._arm_id = {a: i for i, a in enumerate(self.model.arms)}
        self._arm_names = [a.name for a in self.model.arms]
        self._class_names = list(self.model.classes)
        self.record = RunRecord(
            classes=self.model.classes, arms=tuple(self._arm_names), steps=world.scenario.steps
        )

    def step(self) -> None:
        world = self.world
        world.apply_events()
        view = self.link.view
        cls = world.slot_class
        batch = len(cls)
        bucket = view.load_bucket(batch)
        counts = np.bincount(cls, minlength=len(self._class_names))
        present = np.flatnonzero(counts)
        arm_of_class = np.zeros(len(counts), dtype=np.int64)
        prop_of_class = np.ones(len(counts))
        u = float(self.rng.random())  # one uniform for every class, as the engine draws
        for c in present.tolist():
            choice = view.choose(self._class_names[c], bucket, u)
            arm_of_class[c] = self._arm_id[choice.arm]
            prop_of_class[c] = choice.propensity
        request_arm = arm_of_class[cls]
        step_index = world.step
        drafted, accepted, charged, step_time = world.run_round(request_arm)
        self.record.add(step_index, cls, request_arm, accepted + 1, charged)
        self.clock_s += step_time
        names = self._class_names
        arm_names = self._arm_names
        self.link.push(
            StepRecord(
                step_index=step_index,
                step_time_s=step_time,
                batch_size=batch,
                num_scheduled_tokens=int(batch + drafted.sum()),
                policy_version=view.version,
                load_bucket=bucket,
                step_end_unix_s=self.clock_s,
                classes=[names[c] for c in cls.tolist()],
                arms=[arm_names[a] for a in request_arm.tolist()],
                propensity=prop_of_class[cls].tolist(),
                drafted=drafted.tolist(),
                accepted=accepted.tolist(),
            )
        )

    def run(self, steps: int, progress: Callable[[int], None] | None = None) -> RunRecord:
        for i in range(steps):
            self.step()
            if progress is not None and (i + 1) % 500 == 0:
                progress(i + 1)
        self.link.flush()
        return self.record


class InProcessLink:
    """The sidecar's path without the network: admit, learn, compile the policy.

    The engine's hello opens a session through the server's
    :class:`~specctl.sidecar.admission.Admission`; every ``report_every``
    steps (the first reports sooner, as an engine sends them: after an eighth of
    that, then twice as many steps each time up to it) the records become one
    ``StepReport``, admitted as the server admits
    it (the rate limit aside: simulated steps come faster than real ones),
    learned by the book, and the book's policy for this engine compiled, as a
    ``Policy`` message, into the engine's view. A report the admission refuses
    is a bug in the simulator: it raises.
    """

    def __init__(
        self,
        book: PolicyBook,
        offered: Mapping[str, int],
        *,
        fallback: Arm = OFF,
        engine_id: str = "sim-0",
        report_every: int = 8,
    ) -> None:
        self.book = book
        self.offered = dict(offered)
        self.fallback = fallback
        self.report_every = report_every
        # steps in the next report: an engine's first reports go out sooner
        # (specctl.engine.client: FIRST_REPORT_SHARE of its interval, then doubling)
        self.first_report_steps = max(1, round(report_every * FIRST_REPORT_SHARE))
        self._report_steps = self.first_report_steps
        self.sequence = 0
        self.policy_versions = 0
        self._pending: list[StepRecord] = []
        metrics = SidecarMetrics()
        self.admission = Admission(
            ServerConfig(max_reports_per_s=MAX_REPORTS_PER_S),
            Sessions(metrics),
            metrics,
            num_load_buckets=book.num_load_buckets,
        )
        hello = hello_message(engine_id, self.offered, fallback, vllm_version="simulated")
        self.session = self.admission.open_session(hello, peer="in-process")
        self.view: PolicyView = fallback_view(fallback)
        book.offer(self.offered)
        self._apply(book.policy_for(self.offered, fallback))

    def _apply(self, policy: EnginePolicy) -> None:
        if policy.version != self.view.version:
            message = policy_message(policy, self.book.clock())
            self.view = compile_policy(message, self.offered)
            self.policy_versions += 1

    def push(self, record: StepRecord) -> None:
        self._pending.append(record)
        if len(self._pending) >= self._report_steps:
            self.flush()
            self._report_steps = min(self.report_every, 2 * self._report_steps)

    def refresh(self) -> None:
        """The book's policy moved without a report (a fleet merge): the engine gets it,
        as a sidecar's push would bring it."""
        if self.book.version != self.view.version:
            self._apply(self.book.policy_for(self.offered, self.fallback))

    def flush(self) -> None:
        if not self._pending:
            return
        self.sequence += 1
        report = encode_step_report(self.sequence, self._pending)
        self._pending = []
        batch = self.admission.admit_report(self.session, report, time.perf_counter(), backlog=0)
        if batch is None:
            rejected = self.session.outbox.rejections.pop()
            raise RuntimeError(f"the simulator's report was refused: {rejected.message}")
        self.book.ingest(batch)
        if self.book.version != self.view.version:
            self._apply(self.book.policy_for(self.offered, self.fallback))
