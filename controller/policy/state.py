"""A policy's learned state as plain values, and reading one back with every problem named.

``state_dict()`` returns numpy arrays, strings and numbers only (no pickling:
``np.savez`` / ``np.load(allow_pickle=False)`` and the sidecar's snapshots
round-trip it), headed by the policy's name and the version of its layout.
``load_state_dict()`` reads it through a :class:`StateReader`, which raises
ValueError naming the policy and the key that is missing or malformed, so a
state that does not fit is refused whole before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from specctl.arms import Arm, ArmError, parse_arm

StateValue = np.ndarray | str | float
PolicyState = dict[str, StateValue]


def state_header(policy_name: str, version: int) -> PolicyState:
    """The keys every state starts with: whose it is and the version of its layout."""
    return {"policy_name": policy_name, "state_version": version}


def copy_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Copies of a model's live arrays, for a state that later learning does not change."""
    return {key: value.copy() for key, value in arrays.items()}


def assign_arrays(targets: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray]) -> None:
    """Write checked ``values`` (see :meth:`StateReader.arrays_like`) into a model's arrays."""
    for key, target in targets.items():
        target[...] = values[key]


class StateReader:
    """Checked access to a saved state; ValueError naming the policy and the key otherwise."""

    def __init__(
        self,
        state: Mapping[str, StateValue],
        policy_name: str,
        version: int,
        *,
        allow_unversioned: bool = False,
    ) -> None:
        """Check the header: the state is ``policy_name``'s, at ``version``. With
        ``allow_unversioned``, a state without ``state_version`` (saved before states
        had one) is accepted; :attr:`unversioned` then says so."""
        self.state = state
        self.policy_name = policy_name
        saved_by = state.get("policy_name")
        if saved_by != policy_name:
            raise ValueError(f"state is for policy {saved_by!r}, not {policy_name!r}")
        self.unversioned = "state_version" not in state
        if self.unversioned and allow_unversioned:
            return
        saved = self.number("state_version")
        if saved != version:
            raise ValueError(
                f"{policy_name} state: state_version={saved:g}; this policy reads version {version}"
            )

    def _fail(self, key: str, problem: str) -> ValueError:
        return ValueError(f"{self.policy_name} state: {key!r} {problem}")

    def has(self, key: str) -> bool:
        return key in self.state

    def _value(self, key: str) -> StateValue:
        if key not in self.state:
            raise self._fail(key, "is missing")
        return self.state[key]

    def array(
        self, key: str, shape: tuple[int | None, ...], kind: str = "f", *, finite: bool = True
    ) -> np.ndarray:
        """A numeric array of ``shape`` (None: any length there) and dtype kind ``kind``
        (``"f"`` accepts integers too); a copy, so later changes to ``state`` do not reach it."""
        value = np.array(self._value(key))
        accepted = "fiub" if kind == "f" else "iub"
        if value.dtype.kind not in accepted:
            raise self._fail(key, f"has dtype {value.dtype}, expected numbers")
        if len(shape) != value.ndim or any(
            want is not None and want != got for want, got in zip(shape, value.shape, strict=True)
        ):
            expected = tuple("any" if s is None else s for s in shape)
            raise self._fail(key, f"has shape {value.shape}, expected {expected}")
        if finite and kind == "f" and not np.all(np.isfinite(value)):
            raise self._fail(key, "has values that are not finite")
        return value.astype(np.float64) if kind == "f" else value.astype(np.int64)

    def arrays_like(
        self, targets: Mapping[str, np.ndarray], defaults: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Per key of ``targets``, an array of that target's shape and kind; a key in
        ``defaults`` that an unversioned state lacks (it predates the key) takes its default."""
        out = {}
        for key, target in targets.items():
            if self.unversioned and key in defaults and key not in self.state:
                out[key] = np.array(defaults[key], dtype=target.dtype)
                continue
            kind = "f" if target.dtype.kind == "f" else "i"
            out[key] = self.array(key, target.shape, kind).astype(target.dtype)
        return out

    def strings(self, key: str, length: int | None = None) -> list[str]:
        """A one-dimensional array of strings (of ``length`` if given)."""
        value = np.asarray(self._value(key))
        if value.ndim != 1 or (value.size and value.dtype.kind not in "US"):
            raise self._fail(key, f"must be a list of strings, not {value.dtype} {value.shape}")
        if length is not None and value.shape[0] != length:
            raise self._fail(key, f"has {value.shape[0]} entries, expected {length}")
        return [str(v) for v in value.tolist()]

    def arms(self, key: str) -> list[Arm]:
        """A list of arm names, each parsed."""
        out = []
        for name in self.strings(key):
            try:
                out.append(parse_arm(name))
            except ArmError as exc:
                raise self._fail(key, f"holds {name!r}: {exc}") from None
        return out

    def number(self, key: str, unversioned_default: float | None = None) -> float:
        """A finite number; ``unversioned_default`` for an unversioned state without it."""
        if self.unversioned and unversioned_default is not None and key not in self.state:
            return unversioned_default
        value = np.asarray(self._value(key))
        if value.shape != () or value.dtype.kind not in "fiu" or not np.isfinite(value):
            raise self._fail(key, f"must be a finite number, not {value!r}")
        return float(value)

    def contexts(self, classes: str, buckets: str, num_buckets: int) -> list[tuple[str, int]]:
        """(workload class, load bucket) pairs from two parallel lists, each pair once and
        each bucket in 0..num_buckets - 1."""
        names = self.strings(classes)
        values = self.array(buckets, (len(names),), "i")
        if values.size and (values.min() < 0 or values.max() >= num_buckets):
            raise self._fail(buckets, f"has load buckets outside 0..{num_buckets - 1}")
        pairs = list(zip(names, (int(b) for b in values.tolist()), strict=True))
        if len(set(pairs)) != len(pairs):
            raise self._fail(classes, "repeats a (class, load bucket) context")
        return pairs
