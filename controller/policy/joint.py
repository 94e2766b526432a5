"""The joint arm choice of the classes that share a batch, per posterior draw.

Classes in one batch share its step: one class's long drafts lengthen the step
for every request in it, and a model drafter proposes the step's largest K for
the whole batch. :class:`JointChoice` evaluates joint choices (one arm per
class) on the posterior draws and finds, per draw, the one that gives the
classes' work the most committed tokens per second of engine time, by
coordinate ascent.

What is maximised is the engine's goodput over the work the classes bring,
not over the batch as it is now. A request holds its slot in the batch until
it has committed its tokens, so a class whose rounds commit more leaves its
slots sooner, to the classes behind it: the batch's mix follows the choice
(requests per step of a class go as its share of the committed tokens over
its tokens per round). Holding today's mix fixed instead charged a class's
speculation to the others' goodput as if its requests were to stay as many:
a class that accepts less than the others but still gains alone was kept
``off`` where it lost on its own goodput and on the engine's (in the
simulator's ``drift``, math500 after its acceptance halves: ``off`` held
the batch's goodput at the mix of the moment 1% above ``eagle3/k=1``, where
over the work the engine's goodput is 7% higher with ``eagle3/k=1``). What a
step's batch-wide drafting costs is still paid by every request in it.
"""

from __future__ import annotations

import numpy as np

MIN_STEP_TIME_S = 1e-6
# coordinate-ascent sweeps over the classes
_SWEEPS = 3


class JointChoice:
    """Goodput of joint arm choices of the classes sharing a batch, per posterior draw.

    Engine time per committed token of a choice ``a`` (one arm per class, per
    draw)::

        sum_c d_c * (off / B + per_request_c[a_c] + wide(a) / B) / tokens_c[a_c]
        wide(a) = sum_d max_{c runs d} wide[a_c]

    with ``d_c`` the class's share of the committed tokens and ``B`` the batch
    size: each slot of the batch costs its share of ``off`` and its own
    per-request time (per class: what a request verifies depends on what its
    class's rounds propose), and a drafter's batch-wide passes, paid once at the
    largest K any class runs with it, are shared by every slot; a class's
    slots last as long as its tokens take, ``d_c / tokens_c`` per committed
    token. Goodput is the inverse. When one class is the whole batch it is the
    batch's tokens per second at its arm, ``B * tokens / step``, as a class
    deciding alone has it. Where drafting costs nothing batch-wide the choice
    comes apart: each class's best arm is the one best for its own goodput.

    A choice is kept with what each class's arm contributes, updated as one
    class moves, so one class's best response is a handful of array operations
    over (draws, arms), whatever the number of classes.
    """

    def __init__(
        self,
        off: np.ndarray,
        per_request: list[np.ndarray],
        wide: np.ndarray,
        chain: np.ndarray,
        num_chains: int,
        batch_size: float,
        demand: np.ndarray,
        tokens: list[np.ndarray],
        step_time: np.ndarray,
    ) -> None:
        n = off.shape[0]
        self.step_time = step_time
        self.batch_size = float(batch_size)
        self.rows = np.arange(n)
        share = np.asarray(demand, dtype=np.float64)
        share = share / share.sum()
        slot = (off / self.batch_size)[:, None]
        # per class, (draws, arms): its engine time per committed token without the
        # batch-wide passes, and its slots per committed token
        self.time = []
        self.slots = []
        for t, p, d in zip(tokens, per_request, share, strict=True):
            self.time.append((d * (slot + p) / t).astype(np.float32))
            self.slots.append((d / t).astype(np.float32))
        # (chains, draws, arms): an arm's batch-wide time per slot in its drafter's chain
        chains = max(num_chains, 1)
        self.wide = np.zeros((chains, n, chain.shape[0]), dtype=np.float32)
        for j in range(chains):
            own = chain == j
            self.wide[j][:, own] = wide[:, own] / self.batch_size
        self.choice = np.zeros((n, len(tokens)), dtype=np.int64)
        self.sel_time = np.zeros((len(tokens), n), dtype=np.float32)
        self.sel_slots = np.zeros((len(tokens), n), dtype=np.float32)
        self.sel_wide = np.zeros((len(tokens), chains, n), dtype=np.float32)

    def start(self, choice: np.ndarray) -> None:
        """Make ``choice`` (draws x classes) the current one."""
        self.choice = choice.copy()
        for c in range(choice.shape[1]):
            self._select(c)

    def _select(self, c: int) -> None:
        arm = self.choice[:, c]
        self.sel_time[c] = self.time[c][self.rows, arm]
        self.sel_slots[c] = self.slots[c][self.rows, arm]
        self.sel_wide[c] = self.wide[:, self.rows, arm]

    def response(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Goodput and step time for each arm of class c, the others as chosen."""
        others = np.ones(self.sel_time.shape[0], dtype=bool)
        others[c] = False
        rest_wide = self.sel_wide[others].max(axis=0)  # (chains, draws)
        # each arm of c: its own time per token, and the batch-wide passes per slot it
        # adds beyond those the others already run, paid by every class's slots
        wide = np.maximum(self.wide, rest_wide[:, :, None]).sum(axis=0)
        slots = self.sel_slots[others].sum(axis=0)[:, None] + self.slots[c]
        per_token = self.sel_time[others].sum(axis=0)[:, None] + self.time[c] + slots * wide
        per_token = np.maximum(per_token, MIN_STEP_TIME_S)
        # the step at the mix this choice settles to: B slots, each as above
        step = self.batch_size * per_token / slots
        return 1.0 / per_token, step

    def ascend(self, choice: np.ndarray) -> np.ndarray:
        """Coordinate ascent from ``choice`` (draws x classes); returns the end point."""
        self.start(choice)
        for _ in range(_SWEEPS):
            moved = False
            for c in range(self.choice.shape[1]):
                goodput, _ = self.response(c)
                best = np.argmax(goodput, axis=1)
                # keep the current arm on ties, so the ascent ends
                current = goodput[self.rows, self.choice[:, c]]
                change = goodput[self.rows, best] > current * (1.0 + 1e-6)
                if change.any():
                    self.choice[change, c] = best[change]
                    self._select(c)
                    moved = True
            if not moved:
                break
        return self.choice.copy()

    def total(self, choice: np.ndarray) -> np.ndarray:
        self.start(choice)
        goodput, _ = self.response(0)
        return goodput[self.rows, choice[:, 0]]

    def best(self, tokens: list[np.ndarray]) -> np.ndarray:
        """The best joint choice per draw (draws x classes): coordinate ascent from each
        class's best were it the whole batch, and from every class ``off`` (where no one
        class gains by stopping alone while another still drafts long), the better kept."""
        alone = np.stack([np.argmax(t / self.step_time, axis=1) for t in tokens], axis=1)
        best = self.ascend(alone)
        from_off = self.ascend(np.zeros_like(alone))
        better = self.total(from_off) > self.total(best)
        best[better] = from_off[better]
        return best
