"""The joint arm choice of the classes that share a batch, per posterior draw.

Classes in one batch share its step: one class's long drafts lengthen the step
for every request in it, and a model drafter proposes the step's largest K for
the whole batch. :class:`JointChoice` evaluates joint choices (one arm per
class) on the posterior draws and finds, per draw, the one that maximises the
batch's committed tokens per second, by coordinate ascent.
"""

from __future__ import annotations

import numpy as np

MIN_STEP_TIME_S = 1e-6
# coordinate-ascent sweeps over the classes
_SWEEPS = 3


class JointChoice:
    """Goodput of joint arm choices of the classes sharing a batch, per posterior draw.

    Step time of a choice ``a`` (one arm per class, per draw)::

        off + sum_c n_c * per_request[a_c] + sum_d max_{c runs d} wide[a_c]

    with ``n_c`` the class's requests per step: verification and a drafter's
    per-request cost add up over requests (``per_request`` is per class: what a
    request verifies depends on what its class's rounds propose); a drafter's
    batch-wide passes are
    paid once, at the largest K any class runs with it. Goodput is
    ``sum_c n_c * tokens_c[a_c]`` over that step time. When every class runs
    one arm this is the step time of the whole batch running it.

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
        count: np.ndarray,
        tokens: list[np.ndarray],
        step_time: np.ndarray,
    ) -> None:
        n = off.shape[0]
        self.step_time = step_time
        self.off = off.astype(np.float32)
        self.rows = np.arange(n)
        # per class, (draws, arms): tokens and per-request time scaled by its requests
        self.tokens = [(t * c).astype(np.float32) for t, c in zip(tokens, count, strict=True)]
        self.per_request = [
            (p * c).astype(np.float32) for p, c in zip(per_request, count, strict=True)
        ]
        # (chains, draws, arms): an arm's batch-wide time in its drafter's chain, else 0
        chains = max(num_chains, 1)
        self.wide = np.zeros((chains, n, chain.shape[0]), dtype=np.float32)
        for j in range(chains):
            own = chain == j
            self.wide[j][:, own] = wide[:, own]
        self.choice = np.zeros((n, len(tokens)), dtype=np.int64)
        self.sel_tokens = np.zeros((len(tokens), n), dtype=np.float32)
        self.sel_time = np.zeros((len(tokens), n), dtype=np.float32)
        self.sel_wide = np.zeros((len(tokens), chains, n), dtype=np.float32)

    def start(self, choice: np.ndarray) -> None:
        """Make ``choice`` (draws x classes) the current one."""
        self.choice = choice.copy()
        for c in range(choice.shape[1]):
            self._select(c)

    def _select(self, c: int) -> None:
        arm = self.choice[:, c]
        self.sel_tokens[c] = self.tokens[c][self.rows, arm]
        self.sel_time[c] = self.per_request[c][self.rows, arm]
        self.sel_wide[c] = self.wide[:, self.rows, arm]

    def response(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Goodput and step time for each arm of class c, the others as chosen."""
        others = np.ones(self.sel_tokens.shape[0], dtype=bool)
        others[c] = False
        rest_tokens = self.sel_tokens[others].sum(axis=0)
        rest_wide = self.sel_wide[others].max(axis=0)  # (chains, draws)
        step = self.off + self.sel_time[others].sum(axis=0) + rest_wide.sum(axis=0)
        # each arm of c: its own per-request time, and the batch-wide passes it adds
        # beyond those the others already run
        step = step[:, None] + self.per_request[c]
        step += np.maximum(self.wide - rest_wide[:, :, None], 0.0).sum(axis=0)
        goodput = (rest_tokens[:, None] + self.tokens[c]) / np.maximum(step, MIN_STEP_TIME_S)
        return goodput, step

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
