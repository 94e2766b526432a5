"""Goodput per (workload class, load bucket, arm), for the independent-arm baselines.

UCB and epsilon-greedy treat every arm as unrelated. Their reward is the
goodput a request saw in a step: committed tokens (1 + accepted) over the
step's time. At one load that ranks arms the way batch goodput does. One
observation is the mean over the rows that ran the arm in one step, so a
256-request step is one pull, not 256 (rows of a step share its time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from specctl.arms import OFF, Arm
from specctl.policy.base import Policy
from specctl.policy.state import PolicyState, StateReader, StateValue, state_header
from specctl.steps import StepBatch


class ArmRewards:
    """Discounted pull counts and reward sums per context and arm."""

    def __init__(self, num_buckets: int, discount: float = 1.0) -> None:
        self.num_buckets = num_buckets
        self.discount = discount
        self.arm_index: dict[Arm, int] = {}
        # (class, bucket) -> array (2, arms): pulls, reward sums
        self.stats: dict[tuple[str, int], np.ndarray] = {}

    def update(self, batch: StepBatch) -> None:
        if batch.num_rows == 0:
            return
        nc, na = len(batch.classes), len(batch.arms)
        reward = (1.0 + batch.accepted) / batch.step_time_s[batch.request_step]
        key = (batch.request_step * nc + batch.class_index) * na + batch.arm_index
        groups, group = np.unique(key, return_inverse=True)
        mean = np.bincount(group, weights=reward) / np.bincount(group)
        steps, rest = np.divmod(groups, nc * na)
        classes, arms = np.divmod(rest, na)
        buckets = np.minimum(batch.load_bucket[steps], self.num_buckets - 1)
        global_arm = np.array([self._index_of(a) for a in batch.arms], dtype=np.int64)[arms]
        width = len(self.arm_index)
        last: tuple[int, str, int] | None = None
        # groups come sorted by step: decay a context once per step that carried it
        for st, c, b, a, r in zip(
            steps.tolist(),
            classes.tolist(),
            buckets.tolist(),
            global_arm.tolist(),
            mean.tolist(),
            strict=True,
        ):
            context = (batch.classes[c], b)
            table = self._table(context, width)
            if (st, *context) != last:
                if self.discount < 1.0:
                    table *= self.discount
                last = (st, *context)
            table[0, a] += 1.0
            table[1, a] += r

    def _index_of(self, arm: Arm) -> int:
        return self.arm_index.setdefault(arm, len(self.arm_index))

    def _table(self, context: tuple[str, int], width: int) -> np.ndarray:
        table = self.stats.get(context)
        if table is None or table.shape[1] < width:
            grown = np.zeros((2, width))
            if table is not None:
                grown[:, : table.shape[1]] = table
            table = self.stats[context] = grown
        return table

    def pulls_and_means(
        self, context: tuple[str, int], arms: tuple[Arm, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pulls and mean reward of each of ``arms`` in ``context`` (mean 0 if never pulled)."""
        table = self.stats.get(context)
        pulls = np.zeros(len(arms))
        sums = np.zeros(len(arms))
        if table is not None:
            for i, arm in enumerate(arms):
                j = self.arm_index.get(arm)
                if j is not None and j < table.shape[1]:
                    pulls[i], sums[i] = table[0, j], table[1, j]
        means = np.divide(sums, pulls, out=np.zeros_like(sums), where=pulls > 0)
        return pulls, means

    def reset_class(self, workload_class: str) -> None:
        for b in range(self.num_buckets):
            self.stats.pop((workload_class, b), None)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The arms in index order and, per context, its table (contexts x 2 x arms)."""
        contexts = sorted(self.stats)
        tables = np.zeros((len(contexts), 2, len(self.arm_index)))
        for i, context in enumerate(contexts):
            table = self.stats[context]
            tables[i, :, : table.shape[1]] = table
        return {
            "reward_arms": np.array([a.name for a in self.arm_index], dtype=np.str_),
            "reward_classes": np.array([c for c, _ in contexts], dtype=np.str_),
            "reward_buckets": np.array([b for _, b in contexts], dtype=np.int64),
            "reward_tables": tables,
        }

    def read_state(
        self, reader: StateReader
    ) -> tuple[dict[Arm, int], dict[tuple[str, int], np.ndarray]]:
        """Arm indices and tables from a saved state, checked; nothing is loaded yet."""
        arms = reader.arms("reward_arms")
        if len(set(arms)) != len(arms):
            raise ValueError(f"{reader.policy_name} state: 'reward_arms' repeats an arm")
        contexts = reader.contexts("reward_classes", "reward_buckets", self.num_buckets)
        tables = reader.array("reward_tables", (len(contexts), 2, len(arms)))
        if (tables[:, 0] < 0).any():
            raise ValueError(f"{reader.policy_name} state: 'reward_tables' has negative pulls")
        return {a: i for i, a in enumerate(arms)}, dict(zip(contexts, tables, strict=True))

    def load_state(self, state: tuple[dict[Arm, int], dict[tuple[str, int], np.ndarray]]) -> None:
        """Load what :meth:`read_state` returned."""
        self.arm_index, self.stats = state


class IndependentArmsPolicy(Policy):
    """What UCB and epsilon-greedy share: a goodput mean per offered arm and context."""

    def __init__(self, load_bucket_bounds: Sequence[int], discount: float) -> None:
        self.num_buckets = len(load_bucket_bounds) + 1
        self.rewards = ArmRewards(self.num_buckets, discount)
        self._arms: tuple[Arm, ...] = (OFF,)

    def set_arms(self, arms: Sequence[Arm]) -> None:
        self._arms = (OFF, *dict.fromkeys(a for a in arms if not a.is_off))

    def update_params(self, batch: StepBatch) -> None:
        self.rewards.update(batch)

    def reset_class(self, workload_class: str) -> None:
        self.rewards.reset_class(workload_class)

    def state_dict(self) -> PolicyState:
        return {**state_header(self.policy_name, self.state_version), **self.rewards.state_dict()}

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        reader = StateReader(state, self.policy_name, self.state_version)
        self.rewards.load_state(self.rewards.read_state(reader))
