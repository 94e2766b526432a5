"""A fleet entry's format: round trip, and every way an entry is refused, with its reason.

Whatever is in the store is input: an entry too large, of another format or
schema version, truncated, altered or holding values that are not evidence is
refused with the reason the store's metric counts, before any of it is used.
"""

from __future__ import annotations

import base64
import hashlib
import json

import numpy as np
import pytest

from specctl.api import pb
from specctl.policy.acceptance import ARM_STATS
from specctl.policy.cost import num_features
from specctl.policy.shared import SharedAcceptance, SharedCost, SharedEvidence
from specctl.sidecar.fleet_entry import (
    SCHEMA_VERSION,
    Entry,
    EntryError,
    EntryHeader,
    decode_entry,
    encode_entry,
    read_header,
)
from specctl.sidecar.fleet_identity import default_sidecar_id, entry_key, pool_of_hello
from specctl.testing.scripted_engine import hello

MAX = 1 << 20


def evidence(seed: int = 0) -> SharedEvidence:
    rng = np.random.default_rng(seed)
    f = num_features(2) + 3  # two arms' own columns and one class's price
    x = rng.random((4, 50, f))
    return SharedEvidence(
        SharedAcceptance(
            ("chat", "code"),
            ("ngram", "eagle3"),
            rng.random((2, 2, 2, 5)) * 100,
            np.abs(rng.random((2, 2, ARM_STATS, 6))) * 100,
            rng.random(2) * 1000,
        ),
        SharedCost(
            (8, 32, 128),
            ("ngram", "eagle3"),
            np.einsum("bsi,bsj->bij", x, x),
            x.sum(axis=1),
            *(rng.random(4) * 10 for _ in range(5)),
            arm_columns=("ngram/k=2", "eagle3/k=1"),
            class_columns=(("chat", "ngram"),),
        ),
    )


def entry(ev: SharedEvidence | None = None, resets: dict[str, float] | None = None) -> bytes:
    header = EntryHeader("sidecar-1", "0123abcd", "pool-a", "tiny-llama", 1.7e9)
    return encode_entry(Entry(header, ev or evidence(), resets or {"chat": 1.7e9 - 60.0}))


def rewrite(data: bytes, change: object) -> bytes:
    """The entry with its body changed by ``change(body_json)`` and a matching checksum."""
    assert callable(change)
    line, _, body = data.partition(b"\n")
    parsed = json.loads(body)
    change(parsed)
    new_body = json.dumps(parsed).encode()
    header = json.loads(line)
    header["body_bytes"] = len(new_body)
    header["body_sha256"] = hashlib.sha256(new_body).hexdigest()
    return json.dumps(header).encode() + b"\n" + new_body


def test_an_entry_round_trips_exactly() -> None:
    ev = evidence()
    decoded = decode_entry(entry(ev), max_bytes=MAX)
    assert decoded.header == EntryHeader("sidecar-1", "0123abcd", "pool-a", "tiny-llama", 1.7e9)
    assert decoded.evidence.acceptance is not None and ev.acceptance is not None
    assert decoded.evidence.acceptance.classes == ("chat", "code")
    np.testing.assert_array_equal(decoded.evidence.acceptance.counts, ev.acceptance.counts)
    assert decoded.evidence.cost is not None and ev.cost is not None
    np.testing.assert_array_equal(decoded.evidence.cost.xtx, ev.cost.xtx)
    assert decoded.evidence.cost.load_bucket_bounds == (8, 32, 128)
    assert decoded.evidence.cost.arm_columns == ("ngram/k=2", "eagle3/k=1")
    assert decoded.evidence.cost.class_columns == (("chat", "ngram"),)
    assert decoded.resets == {"chat": 1.7e9 - 60.0}
    empty = decode_entry(entry(SharedEvidence(None, None)), max_bytes=MAX)
    assert empty.evidence == SharedEvidence(None, None)


def test_the_format_is_json_and_base64_float64() -> None:
    """What docs/fleet.md documents: a header line, a JSON body, little-endian float64."""
    line, _, body = entry().partition(b"\n")
    header = json.loads(line)
    assert header["format"] == "specctl-fleet-evidence"
    assert header["schema_version"] == SCHEMA_VERSION == 6
    assert header["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert json.loads(body)["resets"] == {"chat": 1.7e9 - 60.0}
    rounds = json.loads(body)["acceptance"]["rounds"]
    values = np.frombuffer(base64.b64decode(rounds["float64"]), dtype="<f8")
    assert rounds["shape"] == [2] and values.shape == (2,)


@pytest.mark.parametrize(
    ("data", "reason", "message"),
    [
        (b"x" * (MAX + 1), "oversized", "over fleet.max_entry_bytes"),
        (b"no header line at all", "foreign", "no header line"),
        (b"\x00\xff\n{}", "foreign", "not JSON"),
        (b'{"format": "something-else"}\n{}', "foreign", "not a specctl-fleet-evidence"),
        (
            entry().replace(
                b'"schema_version":%d' % SCHEMA_VERSION,
                b'"schema_version":%d' % (SCHEMA_VERSION + 1),
                1,
            ),
            "foreign",
            f"schema_version={SCHEMA_VERSION + 1}",
        ),
        (
            # a sidecar of schema 5, whose cost held the line's features only
            entry().replace(b'"schema_version":6', b'"schema_version":5', 1),
            "foreign",
            "schema_version=5",
        ),
        (entry()[:-20], "corrupt", "body is"),
        (entry()[:-5] + b"AAAAA", "corrupt", "checksum"),
        (
            entry().replace(b'"model":"tiny-llama"', b'"model":""', 1),
            "corrupt",
            "header model",
        ),
    ],
)
def test_a_bad_entry_is_refused_with_its_reason(data: bytes, reason: str, message: str) -> None:
    with pytest.raises(EntryError, match=message) as caught:
        decode_entry(data, max_bytes=MAX)
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.update(extra=1), "exactly 'acceptance', 'cost' and 'resets'"),
        (lambda b: b.pop("resets"), "exactly 'acceptance', 'cost' and 'resets'"),
        (lambda b: b.update(resets=[]), "resets must be a table"),
        (lambda b: b["resets"].update({"no spaces": 1.0}), "resets: workload class"),
        (lambda b: b["resets"].update(chat=-1.0), "not a time"),
        (lambda b: b["resets"].update(chat="yesterday"), "not a time"),
        (lambda b: b.update(resets={f"c{i}": 1.0 for i in range(257)}), "at most 256"),
        (lambda b: b["acceptance"]["counts"].update(shape=[2, 2, 2, 6]), "bytes of values"),
        (lambda b: b["acceptance"]["counts"].update(float64="!!"), "not base64"),
        (lambda b: b["acceptance"].update(classes=["chat", 7]), "list of names"),
        (lambda b: b["acceptance"].update(classes=["chat", "no spaces"]), "workload class"),
        (lambda b: b["cost"].update(load_bucket_bounds=[8, "32", 128]), "list of integers"),
        (lambda b: b["cost"].update(load_bucket_bounds=[32, 8, 128]), "strictly increasing"),
        (lambda b: b["cost"].pop("arm_columns"), "arm_columns must be a list of names"),
        (lambda b: b["cost"].update(class_columns=[["chat"]]), r"list of \[class, drafter\]"),
        (
            lambda b: b["cost"].update(arm_columns=["ngram/k=2", "medusa/k=1"]),
            "'medusa/k=1' is not an arm of the drafters",
        ),
        (lambda b: b["cost"].update(arm_columns=["ngram/k=2", "off"]), "not an arm"),
        (
            lambda b: b["cost"].update(class_columns=[["chat", "eagle"]]),
            "'eagle' is not one of the drafters",
        ),
        (lambda b: b["cost"].update(class_columns=[["no spaces", "ngram"]]), "workload class"),
        (lambda b: b["cost"].update(class_columns=[]), r"xtx has shape \(4, 16, 16\)"),
        (
            lambda b: b["acceptance"]["rounds"].update(
                float64=base64.b64encode(np.array([np.inf, 1.0]).tobytes()).decode()
            ),
            "not finite",
        ),
    ],
)
def test_a_body_that_is_not_evidence_is_corrupt(change: object, message: str) -> None:
    with pytest.raises(EntryError, match=message) as caught:
        decode_entry(rewrite(entry(), change), max_bytes=MAX)
    assert caught.value.reason == "corrupt"


def test_the_header_is_read_before_the_body() -> None:
    data = rewrite(entry(), lambda b: b["acceptance"].update(classes=["not valid!"]))
    header, _ = read_header(data, max_bytes=MAX)  # whose it is, known before the body
    assert (header.sidecar_id, header.pool, header.model) == ("sidecar-1", "pool-a", "tiny-llama")


def test_identity_keys_pools_and_ids() -> None:
    assert entry_key("specctl:fleet:", "pool-a", "s1") == "specctl:fleet:pool-a:s1"
    one = hello("engine-1", drafters=(("ngram", 4), ("eagle3", 2))).hello
    same = hello("engine-2", drafters=(("eagle3", 2), ("ngram", 4))).hello
    other = hello("engine-3", drafters=(("ngram", 2),)).hello
    assert pool_of_hello(one) == pool_of_hello(same) != pool_of_hello(other)
    assert pool_of_hello(one).startswith("auto-")
    bigger = pb.Hello()
    bigger.CopyFrom(one)
    bigger.max_batch_size = 512
    assert pool_of_hello(bigger) != pool_of_hello(one)
    a, b = default_sidecar_id("unix:///run/a.sock"), default_sidecar_id("unix:///run/b.sock")
    assert a != b and a == default_sidecar_id("unix:///run/a.sock")
