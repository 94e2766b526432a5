"""What a load bucket looks like: its typical batch size and prefill tokens per step.

A decision is made per load bucket, but costs and batch-size tables speak in
batch sizes. Each bucket's representative batch size is the discounted mean
of the batch sizes its steps actually had, starting from the middle of the
bucket's range (twice the last bound for the open-ended last bucket).
Replicas that share what they learn add the fleet's sums, weighted as the
bucket's cost statistics are (:meth:`BucketLoad.set_shared`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specctl.steps import StepBatch


def prior_batch_sizes(bounds: Sequence[int]) -> np.ndarray:
    """Middle of each bucket's range; the last bucket (above every bound) gets 2x its bound."""
    lows = [1, *(b + 1 for b in bounds)]
    highs = [*bounds, 2 * bounds[-1]]
    return np.array([(lo + hi) / 2.0 for lo, hi in zip(lows, highs, strict=True)])


class BucketLoad:
    """Discounted mean batch size and non-decode tokens per step, per load bucket."""

    # weight of the prior batch size, in steps
    PRIOR_STEPS = 1.0

    def __init__(self, bounds: Sequence[int], discount: float) -> None:
        self.bounds = tuple(bounds)
        self.discount = discount
        self.num_buckets = len(self.bounds) + 1
        self.prior = prior_batch_sizes(self.bounds)
        self.steps = np.zeros(self.num_buckets)
        self.batch_sum = np.zeros(self.num_buckets)
        self.extra_tokens_sum = np.zeros(self.num_buckets)
        # the fleet's sums (set_shared), never added into the arrays above, and their weight
        self.shared_steps = np.zeros(self.num_buckets)
        self.shared_batch_sum = np.zeros(self.num_buckets)
        self.shared_extra_tokens_sum = np.zeros(self.num_buckets)
        self.shared_weight = np.zeros(self.num_buckets)

    def update(self, batch: StepBatch, decode_tokens: np.ndarray) -> np.ndarray:
        """Learn from ``batch``; ``decode_tokens[i]`` is 1 + drafted summed over step i's rows.

        Returns each step's bucket (clipped to the buckets this tracker knows).
        """
        nb = self.num_buckets
        d = self.discount
        bucket = np.minimum(batch.load_bucket, nb - 1)
        extra = batch.num_scheduled_tokens - decode_tokens
        if bucket.shape[0] == 1:  # the common one-step report, without bincounts
            b = int(bucket[0])
            self.steps[b] = self.steps[b] * d + 1.0
            self.batch_sum[b] = self.batch_sum[b] * d + float(batch.batch_size[0])
            self.extra_tokens_sum[b] = self.extra_tokens_sum[b] * d + max(float(extra[0]), 0.0)
            return bucket
        n = np.bincount(bucket, minlength=nb).astype(np.float64)
        decay = d**n
        self.steps = self.steps * decay + n
        self.batch_sum = self.batch_sum * decay + np.bincount(
            bucket, weights=batch.batch_size.astype(np.float64), minlength=nb
        )
        self.extra_tokens_sum = self.extra_tokens_sum * decay + np.bincount(
            bucket, weights=np.maximum(extra, 0.0).astype(np.float64), minlength=nb
        )
        return bucket

    def set_shared(
        self, steps: np.ndarray, batch_sum: np.ndarray, extra_tokens_sum: np.ndarray
    ) -> None:
        """Replace the fleet's sums (summed over the other replicas, per bucket)."""
        self.shared_steps[...] = steps
        self.shared_batch_sum[...] = batch_sum
        self.shared_extra_tokens_sum[...] = extra_tokens_sum

    def batch_size(self, bucket: int) -> float:
        w = self.PRIOR_STEPS
        shared = self.shared_weight[bucket]
        batch_sum = self.batch_sum[bucket] + shared * self.shared_batch_sum[bucket]
        steps = self.steps[bucket] + shared * self.shared_steps[bucket]
        return float((batch_sum + w * self.prior[bucket]) / (steps + w))

    def extra_tokens(self, bucket: int) -> float:
        """Mean tokens per step that are not decode tokens (prefill chunks)."""
        shared = self.shared_weight[bucket]
        extra = self.extra_tokens_sum[bucket] + shared * self.shared_extra_tokens_sum[bucket]
        steps = self.steps[bucket] + shared * self.shared_steps[bucket]
        return float(extra / (steps + self.PRIOR_STEPS))

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything learned, by its key in a policy's state: the live arrays, not copies."""
        return {
            "load_steps": self.steps,
            "load_batch_sum": self.batch_sum,
            "load_extra_tokens_sum": self.extra_tokens_sum,
        }
