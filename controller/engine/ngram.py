"""n-gram drafts computed in the scheduler, for the classes whose arm is an n-gram arm.

An engine hosts one drafter (its ``speculative_config.method``). n-gram drafts
cost no model pass: they are a lookup of the request's own context. With the
V1 model runner and synchronous scheduling every draft passes through the
scheduler (``request.spec_token_ids``) before the next step verifies it, so
the scheduler can replace a request's model drafts with n-gram drafts, and
the engine offers both drafters to the policy (see docs/drafters.md).

The matcher is vLLM's own (``_find_longest_matched_ngram_and_propose_tokens``
of its n-gram proposer, numba-compiled), so the drafts are the ones vLLM's
``ngram`` method proposes with the same ``prompt_lookup_min/max``. It runs over
a token buffer kept here, one row per request, that each step only extends by
the tokens the request gained, so the step path copies a few tokens per
request and makes one compiled call for the whole batch; the compilation
happens at start-up (:meth:`NgramDrafter.warm_up`), never on the step path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from specctl.logs import get_logger

log = get_logger(__name__)

# The method name of vLLM's n-gram drafter, and of specctl's n-gram arms.
NGRAM = "ngram"
# Rows the token buffer starts with; it doubles when more requests draft at once.
_INITIAL_ROWS = 64


@dataclass(frozen=True)
class NgramSettings:
    """The n-gram drafter's limits: vLLM's ``prompt_lookup_min/max`` and its own K."""

    max_k: int
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ValueError(f"ngram max_k={self.max_k} must be at least 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                f"ngram prompt_lookup_min={self.prompt_lookup_min} and "
                f"prompt_lookup_max={self.prompt_lookup_max} must satisfy 1 <= min <= max"
            )


def _compile_batch_matcher() -> Callable[..., None]:
    """vLLM's matcher applied to a batch of buffer rows, compiled once."""
    from numba import njit
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens as match,
    )

    @njit(cache=False)  # type: ignore[misc]
    def propose_rows(
        tokens: np.ndarray,
        rows: np.ndarray,
        lengths: np.ndarray,
        ks: np.ndarray,
        min_n: int,
        max_n: int,
        max_model_len: int,
        out: np.ndarray,
        out_len: np.ndarray,
    ) -> None:
        for i in range(rows.shape[0]):
            drafts = match(tokens[rows[i], : lengths[i]], min_n, max_n, max_model_len, ks[i])
            n = drafts.shape[0]
            out_len[i] = n
            out[i, :n] = drafts

    return propose_rows  # type: ignore[no-any-return]


class NgramDrafter:
    """Replaces the drafts of chosen requests with n-gram drafts, once per step.

    Only requests in their decode phase are drafted (``num_computed_tokens ==
    num_tokens - 1`` once a step's output is in), as vLLM drafts no prefill
    chunk. A request's row is resynchronised from its tokens whenever the
    request object or its tokens are not those the row holds (a reused id, a
    streaming-input session's next chunk).
    """

    def __init__(self, settings: NgramSettings, max_model_len: int) -> None:
        self.settings = settings
        self.max_model_len = max_model_len
        self._propose_rows = _compile_batch_matcher()
        # np.zeros maps pages lazily: rows cost memory only as far as they are written.
        self._tokens = np.zeros((_INITIAL_ROWS, max_model_len), dtype=np.int32)
        # per row: its request, how many of its tokens it holds, and the last of them
        self._owner: list[Any] = [None] * _INITIAL_ROWS
        self._held: list[int] = [0] * _INITIAL_ROWS
        self._last: list[int] = [0] * _INITIAL_ROWS
        self._row_of: dict[str, int] = {}
        self._free: list[int] = list(range(_INITIAL_ROWS - 1, -1, -1))
        self._out = np.zeros((_INITIAL_ROWS, settings.max_k), dtype=np.int32)
        self._out_len = np.zeros(_INITIAL_ROWS, dtype=np.int64)
        self.drafted_requests_total = 0

    def warm_up(self) -> None:
        """Compile the matcher (seconds) so that no step ever waits for it."""
        tokens = np.zeros((1, 16), dtype=np.int32)
        tokens[0, :8] = [1, 2, 3, 4, 1, 2, 3, 4]
        out = np.zeros((1, self.settings.max_k), dtype=np.int32)
        out_len = np.zeros(1, dtype=np.int64)
        self._propose_rows(
            tokens, np.zeros(1, dtype=np.int64), np.array([8], dtype=np.int64),
            np.array([self.settings.max_k], dtype=np.int64), 1, 3, 16, out, out_len,
        )  # fmt: skip

    def draft(
        self,
        groups: Iterable[tuple[int, Iterable[Any]]],
        validate: Callable[[Any, list[int]], list[int]] | None = None,
    ) -> int:
        """Set ``spec_token_ids`` of each decoding request in ``groups`` (K, requests).

        ``validate`` (the structured-output manager's ``validate_tokens``) keeps
        the grammar-valid prefix of a constrained request's drafts, as vLLM does
        for its own drafters. Returns how many requests were drafted.
        """
        requests: list[Any] = []
        rows: list[int] = []
        lengths: list[int] = []
        ks: list[int] = []
        row_of, owner, held, last = self._row_of, self._owner, self._held, self._last
        buffer = self._tokens  # replaced when the buffer grows
        for k, members in groups:
            for request in members:
                tokens = request._all_token_ids
                num_tokens = len(tokens)
                if request.num_computed_tokens != num_tokens - 1:
                    if request.spec_token_ids:  # never verify the model's drafts instead
                        request.spec_token_ids = []
                    continue
                row = row_of.get(request.request_id)
                if row is None or owner[row] is not request:
                    row = self._claim(request)
                    buffer, owner, held, last = self._tokens, self._owner, self._held, self._last
                synced = held[row]
                if synced > num_tokens or (synced and tokens[synced - 1] != last[row]):
                    synced = 0  # not the tokens the row holds: a session's new chunk
                if num_tokens > synced:
                    if num_tokens - synced == 1:
                        buffer[row, synced] = tokens[synced]
                    else:
                        buffer[row, synced:num_tokens] = tokens[synced:num_tokens]
                    held[row] = num_tokens
                    last[row] = tokens[num_tokens - 1]
                rows.append(row)
                lengths.append(num_tokens)
                ks.append(k)
                requests.append(request)
        count = len(requests)
        if not count:
            return 0
        if count > self._out.shape[0]:
            self._out = np.zeros((2 * count, self.settings.max_k), dtype=np.int32)
            self._out_len = np.zeros(2 * count, dtype=np.int64)
        out, out_len = self._out, self._out_len
        settings = self.settings
        self._propose_rows(
            buffer, np.array(rows, dtype=np.int64), np.array(lengths, dtype=np.int64),
            np.array(ks, dtype=np.int64), settings.prompt_lookup_min,
            settings.prompt_lookup_max, self.max_model_len, out, out_len,
        )  # fmt: skip
        proposed = out[:count].tolist()
        for request, drafts, n in zip(requests, proposed, out_len[:count].tolist(), strict=True):
            del drafts[n:]
            if validate is not None and n and request.use_structured_output:
                drafts = validate(request, drafts)
            request.spec_token_ids = drafts
        self.drafted_requests_total += count
        return count

    def release(self, req_ids: Iterable[str]) -> None:
        """Free the rows of requests that left the engine."""
        row_of = self._row_of
        for req_id in req_ids:
            row = row_of.pop(req_id, None)
            if row is not None:
                self._owner[row] = None
                self._held[row] = 0
                self._free.append(row)

    def _claim(self, request: Any) -> int:
        """A row for a request the buffer does not hold yet (or a new one under its id)."""
        row = self._row_of.get(request.request_id)
        if row is None:
            if not self._free:
                self._grow()
            row = self._row_of[request.request_id] = self._free.pop()
        self._owner[row] = request
        self._held[row] = 0
        return row

    def _grow(self) -> None:
        old_rows = self._tokens.shape[0]
        tokens = np.zeros((2 * old_rows, self.max_model_len), dtype=np.int32)
        tokens[:old_rows] = self._tokens
        self._tokens = tokens
        self._owner.extend([None] * old_rows)
        self._held.extend([0] * old_rows)
        self._last.extend([0] * old_rows)
        self._free.extend(range(2 * old_rows - 1, old_rows - 1, -1))
        log.info("specctl_ngram_rows_grown", rows=2 * old_rows)
