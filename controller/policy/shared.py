"""Evidence a replica shares with its fleet: decayed sufficient statistics, keyed by name.

specctl's policy keeps its evidence in arrays indexed by slots it hands out in
the order it meets classes and drafters, so one replica's class slot 3 is not
another's. What replicas exchange names every row instead: acceptance per
(workload class, drafter) (:class:`SharedAcceptance`) and the step-cost
regression and load of each load bucket, its features laid out per drafter
name (:class:`SharedCost`). Both are sums: counts and least-squares sums,
each already decayed by its replica's own steps, so the fleet's evidence is
the sum of its members' (:func:`sum_acceptance`, :func:`sum_cost`), and a
member that stops contributing simply leaves the sum.

Every value is checked when a contribution is built (``__post_init__``): the
shapes, finite and non-negative counts, symmetric positive semi-definite
regression sums. A contribution read from a shared store is input like any
other, and a matrix that is not a sum of squares would break the cost model's
Cholesky factorisation, so none reaches a policy unchecked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from specctl.arms import MAX_K, Arm, ArmError
from specctl.policy.acceptance import ARM_STATS
from specctl.policy.cost import BASE_FEATURES, FEATURES_PER_DRAFTER, num_features
from specctl.steps import validate_class_name

# no count or sum in a contribution may exceed this: far above anything decayed evidence
# reaches, and far below where float64 sums lose their integers
MAX_VALUE = 1e15


class SharedEvidenceError(ValueError):
    """A contribution that is not valid; the message names the field."""


@dataclass(frozen=True)
class SharedAcceptance:
    """Acceptance evidence per (workload class, drafter), positions ``1..max_k``.

    ``counts[c, d, 0, j]`` are the long successes at position ``j + 1`` and
    ``[c, d, 1, j]`` the failures there; ``arm_stats[c, d, :, k]`` are the rounds
    run at K = k, their accepted drafts, its squares and the drafts proposed; ``rounds[c]`` every
    request-round of the class (speculative or not). Positions beyond ``max_k``
    hold nothing.
    """

    classes: tuple[str, ...]
    drafters: tuple[str, ...]
    counts: np.ndarray
    arm_stats: np.ndarray
    rounds: np.ndarray

    def __post_init__(self) -> None:
        _check_names("classes", self.classes, _class_problem)
        _check_names("drafters", self.drafters, _drafter_problem)
        c, d = len(self.classes), len(self.drafters)
        if self.counts.ndim != 4:
            raise SharedEvidenceError(f"counts has shape {self.counts.shape}: expected 4 axes")
        k = self.counts.shape[3]
        if not 0 <= k <= MAX_K:
            raise SharedEvidenceError(f"counts has {k} positions: at most {MAX_K}")
        _check_array("counts", self.counts, (c, d, 2, k), nonnegative=True)
        _check_array("arm_stats", self.arm_stats, (c, d, ARM_STATS, k + 1))
        for i, name in ((0, "rounds"), (2, "squares"), (3, "drafts proposed")):
            if (self.arm_stats[:, :, i] < 0.0).any():
                raise SharedEvidenceError(f"arm_stats: negative {name}")
        _check_array("rounds", self.rounds, (c,), nonnegative=True)

    @property
    def max_k(self) -> int:
        return int(self.counts.shape[3])


@dataclass(frozen=True)
class SharedCost:
    """Step-cost regression sums and load per load bucket (:mod:`specctl.policy.cost`).

    Features are ``1``, decode tokens verified, prefill tokens, then five per drafter,
    in the order of ``drafters``; ``xtx``, ``xty``, ``yy`` and ``steps`` are the discounted,
    Huber-weighted sums the cost model keeps, and ``load_*`` the bucket's
    discounted steps, batch sizes and prefill tokens (:mod:`specctl.policy.load`).
    """

    load_bucket_bounds: tuple[int, ...]
    drafters: tuple[str, ...]
    xtx: np.ndarray
    xty: np.ndarray
    yy: np.ndarray
    steps: np.ndarray
    load_steps: np.ndarray
    load_batch_sum: np.ndarray
    load_extra_tokens_sum: np.ndarray

    def __post_init__(self) -> None:
        bounds = self.load_bucket_bounds
        if any(b < 1 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise SharedEvidenceError(
                f"load_bucket_bounds={list(bounds)} must be strictly increasing positive sizes"
            )
        _check_names("drafters", self.drafters, _drafter_problem)
        b, f = len(bounds) + 1, num_features(len(self.drafters))
        _check_array("xtx", self.xtx, (b, f, f))
        _check_array("xty", self.xty, (b, f))
        for name in ("yy", "steps", "load_steps", "load_batch_sum", "load_extra_tokens_sum"):
            _check_array(name, getattr(self, name), (b,), nonnegative=True)
        scale = np.maximum(np.abs(self.xtx).max(axis=(1, 2)), 1.0)
        if (np.abs(self.xtx - self.xtx.transpose(0, 2, 1)).max(axis=(1, 2)) > 1e-9 * scale).any():
            raise SharedEvidenceError("xtx is not symmetric")
        lowest = np.linalg.eigvalsh(self.xtx)[:, 0] if f else np.zeros(b)
        if (lowest < -1e-9 * scale).any():
            raise SharedEvidenceError("xtx is not positive semi-definite: not a sum of squares")

    @property
    def num_buckets(self) -> int:
        return len(self.load_bucket_bounds) + 1


@dataclass(frozen=True)
class SharedEvidence:
    """One replica's contribution, or the sum of several: either part may be absent."""

    acceptance: SharedAcceptance | None = None
    cost: SharedCost | None = None


@dataclass(frozen=True)
class MergeReport:
    """What a merge had to leave out of the fleet's evidence."""

    # classes and drafters that found no free slot in the policy's arrays
    classes_without_slot: int = 0
    drafters_without_slot: int = 0
    # the fleet's cost was kept under other load buckets
    cost_bounds_differ: bool = False


@runtime_checkable
class SharesEvidence(Protocol):
    """A policy whose evidence can be shared: it gives its own, and merges the fleet's."""

    def contribution(self) -> SharedEvidence:
        """This replica's own evidence (never what it merged from others); a read."""
        ...

    def merge_shared(self, shared: SharedEvidence | None) -> MergeReport:
        """Replace the fleet's evidence merged so far with ``shared`` (None: none)."""
        ...


def sum_acceptance(parts: Sequence[SharedAcceptance]) -> SharedAcceptance | None:
    """The sum of several replicas' acceptance evidence, aligned by class and drafter."""
    if not parts:
        return None
    classes = list(dict.fromkeys(c for p in parts for c in p.classes))
    drafters = list(dict.fromkeys(d for p in parts for d in p.drafters))
    k = max(p.max_k for p in parts)
    counts = np.zeros((len(classes), len(drafters), 2, k))
    arm_stats = np.zeros((len(classes), len(drafters), ARM_STATS, k + 1))
    rounds = np.zeros(len(classes))
    class_at = {c: i for i, c in enumerate(classes)}
    drafter_at = {d: i for i, d in enumerate(drafters)}
    for p in parts:
        ci = np.array([class_at[c] for c in p.classes], dtype=np.int64)
        di = np.array([drafter_at[d] for d in p.drafters], dtype=np.int64)
        counts[np.ix_(ci, di)] = counts[np.ix_(ci, di)] + _pad(p.counts, k)
        arm_stats[np.ix_(ci, di)] = arm_stats[np.ix_(ci, di)] + _pad(p.arm_stats, k + 1)
        rounds[ci] += p.rounds
    return SharedAcceptance(tuple(classes), tuple(drafters), counts, arm_stats, rounds)


def without_classes(part: SharedAcceptance, classes: Collection[str]) -> SharedAcceptance | None:
    """``part`` without the evidence of ``classes`` (None when nothing is left): a member's
    evidence of a class from before the class's latest reset is dropped, its other classes'
    kept."""
    keep = [i for i, c in enumerate(part.classes) if c not in classes]
    if len(keep) == len(part.classes):
        return part
    if not keep:
        return None
    return SharedAcceptance(
        tuple(part.classes[i] for i in keep),
        part.drafters,
        part.counts[keep],
        part.arm_stats[keep],
        part.rounds[keep],
    )


def sum_cost(parts: Sequence[SharedCost]) -> SharedCost | None:
    """The sum of several replicas' cost evidence, features aligned by drafter name.

    All parts must have the same load buckets (ValueError otherwise): a bucket's
    statistics mean nothing under other bounds.
    """
    if not parts:
        return None
    bounds = parts[0].load_bucket_bounds
    for p in parts[1:]:
        if p.load_bucket_bounds != bounds:
            raise ValueError(
                f"load buckets differ: {list(p.load_bucket_bounds)} and {list(bounds)}"
            )
    drafters = tuple(dict.fromkeys(d for p in parts for d in p.drafters))
    b, f = len(bounds) + 1, num_features(len(drafters))
    xtx, xty = np.zeros((b, f, f)), np.zeros((b, f))
    sums = {name: np.zeros(b) for name in _COST_VECTORS}
    for p in parts:
        idx = feature_index(p.drafters, drafters)
        xtx[:, idx[:, None], idx[None, :]] += p.xtx
        xty[:, idx] += p.xty
        for name in _COST_VECTORS:
            sums[name] += getattr(p, name)
    return SharedCost(bounds, drafters, xtx, xty, **sums)


def feature_index(source: Sequence[str], target: Sequence[str]) -> np.ndarray:
    """Where each cost feature of a layout with drafters ``source`` sits in the layout
    with drafters ``target`` (every source drafter must be in target)."""
    position = {d: i for i, d in enumerate(target)}
    idx = list(range(BASE_FEATURES))
    for d in source:
        base = BASE_FEATURES + FEATURES_PER_DRAFTER * position[d]
        idx.extend(range(base, base + FEATURES_PER_DRAFTER))
    return np.array(idx, dtype=np.int64)


_COST_VECTORS = ("yy", "steps", "load_steps", "load_batch_sum", "load_extra_tokens_sum")


def _pad(values: np.ndarray, width: int) -> np.ndarray:
    """``values`` with its last axis zero-padded to ``width``."""
    missing = width - values.shape[-1]
    if missing == 0:
        return values
    return np.concatenate([values, np.zeros((*values.shape[:-1], missing))], axis=-1)


def _class_problem(name: str) -> str | None:
    return validate_class_name(name)


def _drafter_problem(name: str) -> str | None:
    try:
        Arm(name, 1)
    except ArmError as exc:
        return str(exc)
    return None


def _check_names(
    field: str, names: tuple[str, ...], problem_of: Callable[[str], str | None]
) -> None:
    if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
        raise SharedEvidenceError(f"{field} must be a tuple of names")
    if len(set(names)) != len(names):
        raise SharedEvidenceError(f"{field} repeats a name")
    for name in names:
        problem = problem_of(name)
        if problem is not None:
            raise SharedEvidenceError(f"{field}: {problem}")


def _check_array(
    field: str, value: np.ndarray, shape: tuple[int, ...], *, nonnegative: bool = False
) -> None:
    if not isinstance(value, np.ndarray) or value.dtype != np.float64:
        raise SharedEvidenceError(f"{field} must be a float64 array")
    if value.shape != shape:
        raise SharedEvidenceError(f"{field} has shape {value.shape}, expected {shape}")
    if not np.isfinite(value).all() or (np.abs(value) > MAX_VALUE).any():
        raise SharedEvidenceError(f"{field} has values that are not finite or beyond {MAX_VALUE:g}")
    if nonnegative and (value < 0.0).any():
        raise SharedEvidenceError(f"{field} has negative values")
