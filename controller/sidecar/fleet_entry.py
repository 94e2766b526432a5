"""One sidecar's entry in the shared store: a JSON header line, then a JSON body.

The header says whose entry it is (sidecar id, the instance of the process
that wrote it, pool, model), when it was published, and the body's length
and SHA-256; the body holds the evidence (:mod:`specctl.policy.shared`),
every array as its shape and its float64 values, little-endian, in base64,
and the classes reset in the fleet that the writer has applied, each with the
epoch of its last reset (:meth:`~specctl.sidecar.book.PolicyBook.reset_class`):
a reader drops a class's evidence from an entry whose writer has not applied
the class's latest reset.
No pickle: JSON and numbers only, so any reader in any language can check
and read it (docs/fleet.md documents the format). A reader checks, in this
order, the size, the header, the body's length and checksum, then every
value (:class:`~specctl.policy.shared.SharedAcceptance` and
:class:`~specctl.policy.shared.SharedCost` validate themselves); what fails
raises :class:`EntryError` with a reason (``oversized``, ``foreign``: not
this format or schema version, ``corrupt``: anything else) and nothing of it
is used.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specctl.policy.shared import (
    SharedAcceptance,
    SharedCost,
    SharedEvidence,
    SharedEvidenceError,
)
from specctl.steps import validate_class_name

FORMAT = "specctl-fleet-evidence"
# 2: five cost features per drafter (requests verifying a second draft)
# 3: the body's resets
# 4: the cost model's decode and prefill tokens as two features
# 5: batch-wide cost features filled for the engine's batch drafter only
# 6: the cost model's arm and class columns, by name
SCHEMA_VERSION = 6
MAX_HEADER_BYTES = 4096
# class resets an entry carries at most (the most recent, see PolicyBook.fleet_resets)
MAX_RESETS = 256
_TEXT_FIELDS = ("sidecar_id", "instance", "pool", "model")
_MAX_TEXT = 256


class EntryError(ValueError):
    """An entry that is not used; ``reason`` is a short metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class EntryHeader:
    """Whose an entry is and when it was published."""

    sidecar_id: str
    # a random id of the process that wrote it: two sidecars with one id write different ones
    instance: str
    pool: str
    model: str
    published_unix_s: float


@dataclass(frozen=True)
class Entry:
    header: EntryHeader
    evidence: SharedEvidence
    # class -> epoch of the latest reset of the class that the writer has applied
    resets: Mapping[str, float] = field(default_factory=dict)


def encode_entry(entry: Entry) -> bytes:
    """The entry as the store keeps it: header line, newline, body."""
    ev = entry.evidence
    body: dict[str, Any] = {"acceptance": None, "cost": None}
    if ev.acceptance is not None:
        a = ev.acceptance
        body["acceptance"] = {
            "classes": list(a.classes),
            "drafters": list(a.drafters),
            "counts": _array(a.counts),
            "arm_stats": _array(a.arm_stats),
            "rounds": _array(a.rounds),
        }
    if ev.cost is not None:
        c = ev.cost
        body["cost"] = {
            "load_bucket_bounds": list(c.load_bucket_bounds),
            "drafters": list(c.drafters),
            "arm_columns": list(c.arm_columns),
            "class_columns": [list(pair) for pair in c.class_columns],
            **{name: _array(getattr(c, name)) for name in _COST_ARRAYS},
        }
    body["resets"] = {name: float(entry.resets[name]) for name in sorted(entry.resets)}
    data = json.dumps(body, separators=(",", ":")).encode()
    h = entry.header
    header = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        **{name: getattr(h, name) for name in _TEXT_FIELDS},
        "published_unix_s": h.published_unix_s,
        "body_bytes": len(data),
        "body_sha256": hashlib.sha256(data).hexdigest(),
    }
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + data


def read_header(data: bytes, *, max_bytes: int) -> tuple[EntryHeader, bytes]:
    """The entry's header, checked, and its body (not yet checked)."""
    if len(data) > max_bytes:
        raise EntryError("oversized", f"{len(data)} bytes, over fleet.max_entry_bytes={max_bytes}")
    line, newline, body = data.partition(b"\n")
    if not newline or len(line) > MAX_HEADER_BYTES:
        raise EntryError("foreign", "no header line: not a specctl fleet entry")
    try:
        header = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise EntryError("foreign", "the header line is not JSON") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise EntryError("foreign", f"not a {FORMAT} entry")
    if header.get("schema_version") != SCHEMA_VERSION:
        raise EntryError(
            "foreign",
            f"schema_version={header.get('schema_version')!r}; this sidecar reads {SCHEMA_VERSION}",
        )
    for name in _TEXT_FIELDS:
        value = header.get(name)
        if not isinstance(value, str) or not 0 < len(value) <= _MAX_TEXT:
            raise EntryError("corrupt", f"header {name}={value!r} is not a name")
    published = header.get("published_unix_s")
    if not isinstance(published, int | float) or not math.isfinite(published):
        raise EntryError("corrupt", f"header published_unix_s={published!r} is not a time")
    if header.get("body_bytes") != len(body):
        raise EntryError(
            "corrupt", f"body is {len(body)} bytes, the header says {header.get('body_bytes')!r}"
        )
    if header.get("body_sha256") != hashlib.sha256(body).hexdigest():
        raise EntryError("corrupt", "body checksum does not match the header's body_sha256")
    fields = {name: header[name] for name in _TEXT_FIELDS}
    return EntryHeader(**fields, published_unix_s=float(published)), body


def read_body(body: bytes) -> tuple[SharedEvidence, dict[str, float]]:
    """The evidence and the class resets of a body whose checksum matched, every value
    checked."""
    try:
        data = json.loads(body)
        if not isinstance(data, dict) or set(data) != {"acceptance", "cost", "resets"}:
            raise EntryError("corrupt", "body must hold exactly 'acceptance', 'cost' and 'resets'")
        resets = _resets(data["resets"])
        acceptance = cost = None
        if data["acceptance"] is not None:
            a = _table(data["acceptance"], "acceptance")
            acceptance = SharedAcceptance(
                classes=_names(a, "classes"),
                drafters=_names(a, "drafters"),
                counts=_values(a, "counts"),
                arm_stats=_values(a, "arm_stats"),
                rounds=_values(a, "rounds"),
            )
        if data["cost"] is not None:
            c = _table(data["cost"], "cost")
            bounds = c.get("load_bucket_bounds")
            if not isinstance(bounds, list) or not all(
                isinstance(b, int) and not isinstance(b, bool) for b in bounds
            ):
                raise EntryError("corrupt", "cost.load_bucket_bounds must be a list of integers")
            pairs = c.get("class_columns")
            if not isinstance(pairs, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(n, str) for n in p)
                for p in pairs
            ):
                raise EntryError("corrupt", "cost.class_columns must be a list of [class, drafter]")
            arrays: dict[str, Any] = {name: _values(c, name) for name in _COST_ARRAYS}
            cost = SharedCost(
                load_bucket_bounds=tuple(bounds),
                drafters=_names(c, "drafters"),
                arm_columns=_names(c, "arm_columns"),
                class_columns=tuple((p[0], p[1]) for p in pairs),
                **arrays,
            )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise EntryError("corrupt", f"body is not JSON: {exc}") from None
    except SharedEvidenceError as exc:
        raise EntryError("corrupt", str(exc)) from None
    return SharedEvidence(acceptance, cost), resets


def decode_entry(data: bytes, *, max_bytes: int) -> Entry:
    """Check and read a whole entry; EntryError names what is wrong."""
    header, body = read_header(data, max_bytes=max_bytes)
    evidence, resets = read_body(body)
    return Entry(header, evidence, resets)


_COST_ARRAYS = (
    "xtx",
    "xty",
    "yy",
    "steps",
    "load_steps",
    "load_batch_sum",
    "load_extra_tokens_sum",
)


def _array(values: np.ndarray) -> dict[str, Any]:
    data = np.ascontiguousarray(values, dtype="<f8").tobytes()
    return {"shape": list(values.shape), "float64": base64.b64encode(data).decode()}


def _resets(value: object) -> dict[str, float]:
    if not isinstance(value, dict) or len(value) > MAX_RESETS:
        raise EntryError("corrupt", f"resets must be a table of at most {MAX_RESETS} classes")
    out = {}
    for name, epoch in value.items():
        problem = validate_class_name(name)
        if problem is not None:
            raise EntryError("corrupt", f"resets: {problem}")
        if (
            not isinstance(epoch, int | float)
            or isinstance(epoch, bool)
            or not math.isfinite(epoch)
            or epoch < 0.0
        ):
            raise EntryError("corrupt", f"resets: {name!r} has epoch {epoch!r}, not a time")
        out[name] = float(epoch)
    return out


def _table(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EntryError("corrupt", f"{where} must be a table")
    return value


def _names(table: dict[str, Any], key: str) -> tuple[str, ...]:
    value = table.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EntryError("corrupt", f"{key} must be a list of names")
    return tuple(value)


def _values(table: dict[str, Any], key: str) -> np.ndarray:
    value = table.get(key)
    if not isinstance(value, dict) or set(value) != {"shape", "float64"}:
        raise EntryError("corrupt", f"{key} must be a table of 'shape' and 'float64'")
    shape, text = value["shape"], value["float64"]
    if (
        not isinstance(shape, list)
        or len(shape) > 4
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
        or not isinstance(text, str)
    ):
        raise EntryError("corrupt", f"{key}: shape must be up to 4 sizes, float64 a string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise EntryError("corrupt", f"{key}: float64 is not base64") from None
    if len(raw) != 8 * math.prod(shape):
        raise EntryError("corrupt", f"{key}: {len(raw)} bytes of values for shape {shape}")
    return np.frombuffer(raw, dtype="<f8").astype(np.float64).reshape(shape)
