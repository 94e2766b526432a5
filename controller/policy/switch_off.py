"""The contexts a policy has switched speculation off in, with hysteresis.

A (workload class, load bucket) context switches off when P(off is best)
reaches ``off_confidence`` and switches back on only once it falls below
``on_confidence``, so a close call does not flap. Which contexts are off is
learned state: it moves only when the policy learns (:meth:`SwitchOff.observe`,
from ``update_params``). A decision reads it with :meth:`SwitchOff.is_off`,
which changes nothing, so a decision or its evidence can be asked for any
number of times without moving what the next decision will be.

Probes. A context that is off keeps speculating on a share of its rounds
(:meth:`SwitchOff.probe_share`): the policy's ``probe_budget`` for its first
``decay`` steps off (the class's steps in the bucket), then shrinking as
``budget * decay / steps``, down to a floor. Each step that it stays off is
more evidence that every speculative arm loses there, and a probe where they
all lose by a wide margin is expensive (at a batch of 256 a probe round costs
several plain steps, and 2% of the rounds probing cost 2% of the goodput
where speculation loses). Shrinking as 1/steps spends, over a long stay off,
probes that grow with the log of its length, the rate a bandit needs to keep
telling a losing arm from the best, until the floor (reached after
``budget / floor * decay`` steps). The floor keeps off from ever being
absorbing: the probes keep adding to the class's acceptance evidence, and
where they reach the recent window often enough a change is detected; a
change detected in the class's acceptance or in the bucket's step cost
(:meth:`SwitchOff.restart_probes`) puts the share back at the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specctl.policy.state import StateReader

Context = tuple[str, int]


@dataclass
class SwitchOff:
    off_confidence: float
    on_confidence: float
    contexts: set[Context] = field(default_factory=set)
    # per switched-off context: the class's steps in the bucket since it switched off (or
    # since its probes were last restarted)
    off_steps: dict[Context, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.on_confidence <= self.off_confidence <= 1.0:
            raise ValueError(
                f"switch_on_confidence={self.on_confidence} must not exceed "
                f"switch_off_confidence={self.off_confidence}, both in [0, 1]"
            )

    def is_off(self, context: Context, p_off_best: float) -> bool:
        """Whether ``context`` runs off at this P(off is best), given its current state."""
        threshold = self.on_confidence if context in self.contexts else self.off_confidence
        return p_off_best >= threshold

    def observe(self, context: Context, p_off_best: float) -> None:
        """Learn the context's P(off is best) after an update. Observing the same value
        again changes nothing (the threshold it crossed holds it where it went)."""
        if self.is_off(context, p_off_best):
            self.contexts.add(context)
            self.off_steps.setdefault(context, 0.0)
        else:
            self.contexts.discard(context)
            self.off_steps.pop(context, None)

    def count_steps(self, steps: dict[Context, int]) -> None:
        """After an update: the class's steps in the bucket the report held, per context."""
        for context, n in steps.items():
            if context in self.off_steps:
                self.off_steps[context] += n

    def restart_probes(self, workload_class: str | None = None, bucket: int | None = None) -> None:
        """A change was detected in a class's acceptance (``workload_class``) or in a
        bucket's step cost (``bucket``): its switched-off contexts probe at the full
        budget again."""
        for context in self.off_steps:
            if context[0] == workload_class or context[1] == bucket:
                self.off_steps[context] = 0.0

    def probe_share(self, context: Context, budget: float, floor: float, decay: float) -> float:
        """The least share of a switched-off context's rounds that probe: ``budget`` for
        its first ``decay`` steps off, then ``budget * decay / steps``, never below
        ``floor`` (see the module docstring). A read."""
        steps = self.off_steps.get(context, 0.0)
        return max(min(floor, budget), budget * min(1.0, decay / max(steps, 1e-12)))

    def forget(self, workload_class: str) -> None:
        self.contexts = {c for c in self.contexts if c[0] != workload_class}
        self.off_steps = {c: n for c, n in self.off_steps.items() if c[0] != workload_class}

    def state_dict(self) -> dict[str, np.ndarray]:
        contexts = sorted(self.contexts)
        return {
            "switched_off_classes": np.array([c for c, _ in contexts], dtype=np.str_),
            "switched_off_buckets": np.array([b for _, b in contexts], dtype=np.int64),
            "switched_off_steps": np.array(
                [self.off_steps.get(c, 0.0) for c in contexts], dtype=np.float64
            ),
        }

    def read_state(self, reader: StateReader, num_buckets: int) -> dict[Context, float]:
        """The contexts in a saved state with their steps off, checked; load them with
        :meth:`load`. A state saved before states had versions restarts their probes at
        the full budget."""
        pairs = reader.contexts("switched_off_classes", "switched_off_buckets", num_buckets)
        if reader.unversioned and not reader.has("switched_off_steps"):
            return dict.fromkeys(pairs, 0.0)
        steps = reader.array("switched_off_steps", (len(pairs),))
        if (steps < 0.0).any():
            raise ValueError(f"{reader.policy_name} state: 'switched_off_steps' is negative")
        return dict(zip(pairs, steps.tolist(), strict=True))

    def load(self, saved: dict[Context, float]) -> None:
        """Make the contexts of :meth:`read_state` the switched-off ones."""
        self.contexts = set(saved)
        self.off_steps = dict(saved)
