"""specctl's policy state: everything it learned as plain arrays, and read back checked whole.

The state is the policy's evidence (:mod:`specctl.policy.thompson_evidence`),
the contexts it has switched off and, per load bucket, the joint choice of the
classes that share its batches. Its keys and values are the layout sidecar
snapshots hold: a change to them comes with a new ``state_version``. Reading
one (:func:`read_state`) checks every key before anything is loaded, so a
state that does not fit is refused whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specctl.policy.state import (
    PolicyState,
    StateReader,
    StateValue,
    assign_arrays,
    copy_arrays,
    state_header,
)
from specctl.policy.switch_off import Context, SwitchOff
from specctl.policy.thompson_evidence import MAX_JOINT_CLASSES, ThompsonEvidence

# per load bucket: (arm names and class slots, the bucket's steps then, best joint choice
# per draw as arm indices, draws x classes)
JointProfiles = dict[int, tuple[tuple[Any, ...], int, np.ndarray]]


@dataclass(frozen=True)
class SavedState:
    """A saved state, checked against the policy that reads it and not loaded yet."""

    arrays: dict[str, np.ndarray]
    classes: list[str]
    drafters: list[str]
    # switched-off contexts, each with its steps off
    switched_off: dict[Context, float]
    classes_evicted: int
    rows_untracked: int
    clock: int
    profiles: JointProfiles


def evidence_arrays(evidence: ThompsonEvidence) -> dict[str, np.ndarray]:
    """The learned arrays by state key: the live arrays, not copies."""
    return {
        **evidence.acceptance.state_arrays(),
        **evidence.cost.state_arrays(),
        **evidence.load.state_arrays(),
        "class_last_update": evidence.last_update,
        "class_mix": evidence.mix,
        "class_mix_tokens": evidence.mix_tokens,
        "class_mix_present": evidence.mix_present,
        "class_mix_steps": evidence.mix_steps,
        "bucket_steps": evidence.bucket_steps,
    }


def policy_state(
    policy_name: str,
    version: int,
    evidence: ThompsonEvidence,
    switch_off: SwitchOff,
    profiles: JointProfiles,
    num_samples: int,
) -> PolicyState:
    """Everything learned, as plain arrays (no pickling); the config is not included."""
    return {
        **state_header(policy_name, version),
        **copy_arrays(evidence_arrays(evidence)),
        "classes": np.array([c or "" for c in evidence.slot_class], dtype=np.str_),
        "drafters": np.array(list(evidence.drafter_slot), dtype=np.str_),
        **_profiles_state(profiles, num_samples),
        **switch_off.state_dict(),
        "classes_evicted": float(evidence.classes_evicted),
        "rows_untracked": evidence.rows_untracked,
        "class_update_clock": evidence.clock,
    }


def _profiles_state(profiles: JointProfiles, num_samples: int) -> dict[str, np.ndarray]:
    """The joint choices as arrays: per bucket that has one, its arms, classes (slots,
    -1 padded), steps and choice per draw (draws x classes, -1 padded)."""
    width, n = MAX_JOINT_CLASSES, num_samples
    buckets = sorted(profiles)
    choice = np.full((len(buckets), n, width), -1, dtype=np.int16)
    for i, b in enumerate(buckets):
        chosen = profiles[b][2]
        choice[i, :, : chosen.shape[1]] = chosen
    return {
        "joint_buckets": np.array(buckets, dtype=np.int64),
        "joint_arms": np.array(["|".join(profiles[b][0][0]) for b in buckets], dtype=np.str_),
        "joint_members": np.array(
            [_pad(profiles[b][0][1], width) for b in buckets], dtype=np.int64
        ).reshape(len(buckets), width),
        "joint_steps": np.array([profiles[b][1] for b in buckets], dtype=np.int64),
        "joint_choice": choice,
    }


def _profiles_from_state(
    reader: StateReader, num_samples: int, num_buckets: int, max_classes: int
) -> JointProfiles:
    """Joint choices from :func:`_profiles_state`; none from an unversioned state without
    them or one saved with another number of draws (worked out at the next update)."""
    if reader.unversioned and not reader.has("joint_choice"):
        return {}
    width = MAX_JOINT_CLASSES
    buckets = reader.array("joint_buckets", (None,), "i").tolist()
    m = len(buckets)
    choice = reader.array("joint_choice", (m, None, width), "i")
    arms = reader.strings("joint_arms", m)
    members = reader.array("joint_members", (m, width), "i")
    steps = reader.array("joint_steps", (m,), "i").tolist()
    if choice.shape[1] != num_samples:
        return {}
    out: JointProfiles = {}
    for i, b in enumerate(buckets):
        slots = tuple(int(m) for m in members[i] if m >= 0)
        names = tuple(arms[i].split("|"))
        chosen = choice[i, :, : len(slots)]
        if not 0 <= b < num_buckets or b in out:
            raise ValueError(f"specctl state: 'joint_buckets' has {b} twice or out of range")
        if (
            any(s >= max_classes for s in slots)
            or chosen.min(initial=0) < 0
            or chosen.max(initial=0) >= len(names)
        ):
            raise ValueError(f"specctl state: the joint choice of bucket {b} is malformed")
        out[b] = ((names, slots), steps[i], chosen.astype(np.int64))
    return out


def read_state(
    state: Mapping[str, StateValue],
    policy_name: str,
    version: int,
    evidence: ThompsonEvidence,
    switch_off: SwitchOff,
    num_samples: int,
) -> SavedState:
    """:func:`policy_state` output saved under the same config (or an unversioned one,
    saved before states had versions, whose missing keys keep their prior), checked
    whole; ValueError naming what does not fit."""
    reader = StateReader(state, policy_name, version, allow_unversioned=True)
    classes = reader.strings("classes")
    if len(classes) != evidence.max_classes:
        raise ValueError(
            f"state has {len(classes)} class slots; this policy has max_classes="
            f"{evidence.max_classes}"
        )
    drafters = reader.strings("drafters")
    if len(drafters) > evidence.max_drafters:
        raise ValueError(
            f"state has {len(drafters)} drafters; max_drafters={evidence.max_drafters}"
        )
    targets = evidence_arrays(evidence)
    # what an unversioned state may lack: the prior
    prior = {
        key: np.zeros_like(targets[key])
        for key in (
            *("acceptance_recent", "acceptance_arm_stats", "acceptance_changes"),
            *("class_mix", "class_mix_tokens", "class_mix_present", "class_mix_steps"),
            "bucket_steps",
            *("cost_fit_factor", "cost_fitted", "cost_cusum", "cost_changes"),
            "cost_outliers",
            "cost_off_steps",
            "cost_batch_wide",
        )
    }
    prior["cost_fit"] = np.broadcast_to(evidence.cost.prior_mean, evidence.cost.fit.shape)
    pairs = evidence.cost.pairs
    if pairs is not None:
        prior.update(pairs.empty_state())
    values = reader.arrays_like(targets, prior)
    if pairs is not None:
        pairs.check_pairs(values["cost_pair"])
    switched_off = switch_off.read_state(reader, evidence.num_buckets)
    evicted = int(reader.number("classes_evicted"))
    untracked = int(reader.number("rows_untracked", 0.0))
    last_update = values["class_last_update"]
    clock = int(reader.number("class_update_clock", float(last_update.max(initial=0))))
    profiles = _profiles_from_state(reader, num_samples, evidence.num_buckets, evidence.max_classes)
    return SavedState(values, classes, drafters, switched_off, evicted, untracked, clock, profiles)


def load_evidence(evidence: ThompsonEvidence, saved: SavedState) -> None:
    """Write a checked state into the evidence; nothing here can fail half-way."""
    assign_arrays(evidence_arrays(evidence), saved.arrays)
    if evidence.cost.pairs is not None:
        evidence.cost.pairs.reindex()
    evidence.mix_changed()
    evidence.slot_class = [c or None for c in saved.classes]
    evidence.class_slot = {c: i for i, c in enumerate(evidence.slot_class) if c is not None}
    evidence.drafter_slot = {d: i for i, d in enumerate(saved.drafters)}
    evidence.classes_evicted = saved.classes_evicted
    evidence.rows_untracked = saved.rows_untracked
    evidence.clock = saved.clock


def _pad(values: Sequence[int], width: int) -> list[int]:
    return [*values, *([-1] * (width - len(values)))]
