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

from specctl.arms import MAX_K, Arm, ArmError, parse_arm
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
    in the order of ``drafters``; then an arm's own column per name in ``arm_columns``
    (``ngram/k=3``: the requests that ran it) and a class's own price per
    ``(class, drafter)`` in ``class_columns`` (the class's requests drafting with it).
    ``xtx``, ``xty``, ``yy`` and ``steps`` are the discounted, Huber-weighted sums the
    cost model keeps, and ``load_*`` the bucket's discounted steps, batch sizes and
    prefill tokens (:mod:`specctl.policy.load`).

    The columns are named, not numbered, because each replica lays out its own: a
    reader places those it has room for and leaves the others out. Leaving a column
    out of least-squares sums is exact: what remains are the sums of the regression
    without it, whose other terms then take its part.
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
    arm_columns: tuple[str, ...] = ()
    class_columns: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        bounds = self.load_bucket_bounds
        if any(b < 1 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise SharedEvidenceError(
                f"load_bucket_bounds={list(bounds)} must be strictly increasing positive sizes"
            )
        _check_names("drafters", self.drafters, _drafter_problem)
        self._check_columns()
        b = len(bounds) + 1
        f = num_features(len(self.drafters)) + len(self.arm_columns) + len(self.class_columns)
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

    def feature_keys(self) -> list[FeatureKey]:
        """Each feature's name, in the order of ``xtx``'s rows."""
        return cost_feature_keys(self.drafters, self.arm_columns, self.class_columns)

    def _check_columns(self) -> None:
        arms = self.arm_columns
        if not isinstance(arms, tuple) or not all(isinstance(a, str) for a in arms):
            raise SharedEvidenceError("arm_columns must be a tuple of arm names")
        if len(set(arms)) != len(arms):
            raise SharedEvidenceError("arm_columns repeats an arm")
        for name in arms:
            try:
                arm = parse_arm(name)
            except ArmError as exc:
                raise SharedEvidenceError(f"arm_columns: {exc}") from None
            if arm.is_off or arm.drafter not in self.drafters:
                raise SharedEvidenceError(
                    f"arm_columns: {name!r} is not an arm of the drafters {list(self.drafters)}"
                )
        pairs = self.class_columns
        if not isinstance(pairs, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(n, str) for n in p)
            for p in pairs
        ):
            raise SharedEvidenceError("class_columns must be a tuple of (class, drafter) names")
        if len(set(pairs)) != len(pairs):
            raise SharedEvidenceError("class_columns repeats a (class, drafter)")
        for workload_class, drafter in pairs:
            problem = _class_problem(workload_class)
            if problem is not None:
                raise SharedEvidenceError(f"class_columns: {problem}")
            if drafter not in self.drafters:
                raise SharedEvidenceError(
                    f"class_columns: {drafter!r} is not one of the drafters {list(self.drafters)}"
                )


# a cost feature by name: ("line", i) for the first BASE_FEATURES, ("drafter", name, j)
# for a drafter's j-th, ("arm", "ngram/k=3") for an arm's own column, ("class", class,
# drafter) for a class's own price
FeatureKey = tuple[str | int, ...]


def cost_feature_keys(
    drafters: Sequence[str],
    arm_columns: Sequence[str] = (),
    class_columns: Sequence[tuple[str, str]] = (),
) -> list[FeatureKey]:
    """The names of a cost layout's features, in order (see :class:`SharedCost`)."""
    keys: list[FeatureKey] = [("line", i) for i in range(BASE_FEATURES)]
    keys += [("drafter", d, j) for d in drafters for j in range(FEATURES_PER_DRAFTER)]
    keys += [("arm", a) for a in arm_columns]
    keys += [("class", c, d) for c, d in class_columns]
    return keys


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
    """The sum of several replicas' cost evidence, features aligned by name.

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
    arm_columns = tuple(dict.fromkeys(a for p in parts for a in p.arm_columns))
    class_columns = tuple(dict.fromkeys(c for p in parts for c in p.class_columns))
    position = {
        key: i for i, key in enumerate(cost_feature_keys(drafters, arm_columns, class_columns))
    }
    b, f = len(bounds) + 1, len(position)
    xtx, xty = np.zeros((b, f, f)), np.zeros((b, f))
    sums = {name: np.zeros(b) for name in _COST_VECTORS}
    for p in parts:
        idx = np.array([position[key] for key in p.feature_keys()], dtype=np.int64)
        xtx[:, idx[:, None], idx[None, :]] += p.xtx
        xty[:, idx] += p.xty
        for name in _COST_VECTORS:
            sums[name] += getattr(p, name)
    return SharedCost(
        bounds, drafters, xtx, xty, **sums, arm_columns=arm_columns, class_columns=class_columns
    )


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
