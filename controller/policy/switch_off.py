"""The contexts a policy has switched speculation off in, with hysteresis.

A (workload class, load bucket) context switches off when P(off is best)
reaches ``off_confidence`` and switches back on only once it falls below
``on_confidence``, so a close call does not flap. Which contexts are off is
learned state: it moves only when the policy learns (:meth:`SwitchOff.observe`,
from ``update_params``). A decision reads it with :meth:`SwitchOff.is_off`,
which changes nothing, so a decision or its evidence can be asked for any
number of times without moving what the next decision will be.
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
        else:
            self.contexts.discard(context)

    def forget(self, workload_class: str) -> None:
        self.contexts = {c for c in self.contexts if c[0] != workload_class}

    def state_dict(self) -> dict[str, np.ndarray]:
        contexts = sorted(self.contexts)
        return {
            "switched_off_classes": np.array([c for c, _ in contexts], dtype=np.str_),
            "switched_off_buckets": np.array([b for _, b in contexts], dtype=np.int64),
        }

    def read_state(self, reader: StateReader, num_buckets: int) -> set[Context]:
        """The contexts in a saved state, checked; load them by assigning :attr:`contexts`."""
        pairs = reader.contexts("switched_off_classes", "switched_off_buckets", num_buckets)
        return set(pairs)
