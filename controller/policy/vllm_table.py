"""vLLM's Dynamic SD: a static batch-size -> K table, no acceptance feedback.

vLLM's ``num_speculative_tokens_per_batch_size`` is a list of inclusive
ranges ``[start, end, K]``: the first starts at 1, gaps carry the previous K
forward, batch sizes past the last range keep its K, and K is capped by the
configured number of speculative tokens. Here the table applies to the
typical batch size of each load bucket (the discounted mean of the batch
sizes its steps had), K is capped by the drafter's offered max K, and K=0 is
``off``. The table may also be given as ``{start: K}``, each range running
to the next start. Without a table, the example ``{1: 4, 16: 2, 64: 0}``
applies; without a drafter, the first drafter the engines offer.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from specctl.arms import OFF, Arm, max_k_by_drafter
from specctl.policy.base import Decision, Policy
from specctl.policy.load import BucketLoad
from specctl.policy.params import (
    DEFAULT_LOAD_BUCKET_BOUNDS,
    bucket_bounds,
    integer,
    parse_config,
)
from specctl.policy.state import (
    PolicyState,
    StateReader,
    StateValue,
    assign_arrays,
    copy_arrays,
    state_header,
)
from specctl.steps import StepBatch

Table = tuple[tuple[int, int, int], ...]


def parse_table(value: object) -> Table:
    """``[[start, end, K], ...]`` (vLLM's form) or ``{start: K}``, validated like vLLM does."""
    ranges: list[tuple[int, int, int]] = []
    if isinstance(value, Mapping):
        try:
            starts = sorted((int(s), k) for s, k in value.items())
        except (TypeError, ValueError):
            raise ValueError(f"table={dict(value)!r}: keys must be batch sizes") from None
        for i, (start, k) in enumerate(starts):
            end = starts[i + 1][0] - 1 if i + 1 < len(starts) else 1 << 20
            ranges.append((start, end, integer(f"table[{start}]", k, 0, 64)))
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for i, entry in enumerate(value):
            if not isinstance(entry, Sequence) or isinstance(entry, str) or len(entry) != 3:
                raise ValueError(f"table[{i}]={entry!r} must be [start, end, K]")
            start = integer(f"table[{i}] start", entry[0], 1, 1 << 20)
            end = integer(f"table[{i}] end", entry[1], 1, 1 << 20)
            if start > end:
                raise ValueError(f"table[{i}]={list(entry)}: start must be <= end")
            ranges.append((start, end, integer(f"table[{i}] K", entry[2], 0, 64)))
        ranges.sort()
    else:
        raise ValueError(f"table={value!r} must be [[start, end, K], ...] or {{start: K}}")
    if not ranges:
        raise ValueError("table must not be empty")
    if ranges[0][0] != 1:
        raise ValueError(
            f"table starts at batch size {ranges[0][0]}; the first range must start at 1"
        )
    for (_, end, _), (start, _, _) in itertools.pairwise(ranges):
        if start <= end:
            raise ValueError(f"table ranges overlap at batch size {start}")
    return tuple(ranges)


def table_k(table: Table, batch_size: int) -> int:
    """K for a batch size: its range's K, or the previous range's across gaps and past the end."""
    k = table[0][2]
    for start, end, range_k in table:
        if batch_size < start:
            break
        k = range_k
        if batch_size <= end:
            break
    return k


@dataclass(frozen=True)
class BatchTableConfig:
    table: Any = field(default_factory=lambda: {1: 4, 16: 2, 64: 0})
    # empty: the first drafter the engines offer
    drafter: str = ""
    load_bucket_bounds: Sequence[int] = field(default=DEFAULT_LOAD_BUCKET_BOUNDS)

    def __post_init__(self) -> None:
        if not isinstance(self.drafter, str):
            raise ValueError(f"drafter={self.drafter!r} must be a drafter name, e.g. 'ngram'")
        object.__setattr__(self, "table", parse_table(self.table))
        object.__setattr__(self, "load_bucket_bounds", bucket_bounds(self.load_bucket_bounds))


class VllmBatchTablePolicy(Policy):
    policy_name = "vllm-batch-table"

    def __init__(self, config: BatchTableConfig | None = None) -> None:
        self.config = config or BatchTableConfig()
        self.load = BucketLoad(self.config.load_bucket_bounds, discount=0.99)
        self.drafter = self.config.drafter
        self._max_k = 0

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        return cls(parse_config(BatchTableConfig, params, cls.policy_name))

    def set_arms(self, arms: Sequence[Arm]) -> None:
        max_k = max_k_by_drafter(arms)
        if not self.config.drafter:
            self.drafter = next(iter(max_k), "")
        self._max_k = max_k.get(self.drafter, 0)

    def update_params(self, batch: StepBatch) -> None:
        self.load.update(batch, np.zeros(batch.num_steps))

    def select_action(self, workload_class: str, load_bucket: int) -> Decision:
        batch_size = max(1, round(self.load.batch_size(load_bucket)))
        k = min(table_k(self.config.table, batch_size), self._max_k)
        why = f"batch table: batch size {batch_size} -> K={k}"
        if k == 0:
            return Decision.point(OFF, why)
        return Decision.point(Arm(self.drafter, k), why)

    def state_dict(self) -> PolicyState:
        """The buckets' batch sizes: all it learns."""
        header = state_header(self.policy_name, self.state_version)
        return {**header, **copy_arrays(self.load.state_arrays())}

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        reader = StateReader(state, self.policy_name, self.state_version)
        targets = self.load.state_arrays()
        assign_arrays(targets, reader.arrays_like(targets, {}))
