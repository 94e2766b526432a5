"""A class reset shared with the fleet: the book's record of resets, and evidence from before
a reset left out of what is merged."""

from __future__ import annotations

import numpy as np
from test_policy_shared import NGRAM, learn, specctl

from specctl.policy.shared import without_classes
from specctl.sidecar.book import MAX_FLEET_RESETS, RESET_MEMORY_S, PolicyBook


def rounds(book: PolicyBook, cls: str) -> float:
    return book.policy.evidence(cls, 0).rounds


def test_a_reset_from_the_fleet_forgets_the_class_once() -> None:
    now = [1000.0]
    peer = specctl()
    for cls in ("chat", "code"):
        learn(peer, cls, 0.9, 40)
    book = PolicyBook(specctl(), clock=lambda: now[0])
    book.offer(NGRAM)
    book.merge_shared(peer.contribution())
    learn(book.policy, "chat", 0.9, 40)  # and chat's evidence of its own
    assert rounds(book, "chat") > 300 and rounds(book, "code") > 100
    version = book.version

    assert book.apply_fleet_reset("chat", 999.0)
    assert rounds(book, "chat") == 0.0 and rounds(book, "code") > 100
    assert book.version > version
    assert book.fleet_resets() == {"chat": 999.0}
    # the same reset, or an older one, again: nothing is forgotten twice
    learn(book.policy, "chat", 0.9, 20)
    learned = rounds(book, "chat")
    assert learned > 0.0
    assert not book.apply_fleet_reset("chat", 999.0)
    assert not book.apply_fleet_reset("chat", 500.0)
    assert rounds(book, "chat") == learned
    # a reset older than the book remembers resets is not applied (another member's
    # clock is behind, and this book forgot it already)
    assert not book.apply_fleet_reset("code", 1000.0 - RESET_MEMORY_S - 1.0)
    assert rounds(book, "code") > 100 and "code" not in book.fleet_resets()
    # a class this book has never seen: recorded, so that evidence from before is not merged
    assert not book.apply_fleet_reset("math", 998.0)
    assert book.fleet_resets() == {"chat": 999.0, "math": 998.0}


def test_a_local_reset_is_later_than_any_the_book_knows_whatever_its_clock() -> None:
    now = [1000.0]
    book = PolicyBook(specctl(), clock=lambda: now[0])
    book.offer(NGRAM)
    peer = specctl()
    learn(peer, "chat", 0.9, 20)
    book.merge_shared(peer.contribution())
    book.reset_class("chat")
    assert book.fleet_resets() == {"chat": 1000.0}
    # another member, its clock an hour ahead, reset chat; then this one resets it again
    assert book.apply_fleet_reset("chat", 4600.0)
    book.reset_class("chat")
    assert book.fleet_resets()["chat"] > 4600.0


def test_the_book_shares_the_latest_resets_of_the_last_day() -> None:
    now = [RESET_MEMORY_S + 10_000.0]
    book = PolicyBook(specctl(), clock=lambda: now[0])
    for i in range(MAX_FLEET_RESETS + 50):
        book.apply_fleet_reset(f"class-{i}", now[0] - 1000.0 + i)
    shared = book.fleet_resets()
    assert len(shared) == MAX_FLEET_RESETS
    assert min(shared.values()) == now[0] - 1000.0 + 50  # the oldest 50 went first
    now[0] += RESET_MEMORY_S - 1000.0 + 100.0
    assert set(book.fleet_resets()) == {f"class-{i}" for i in range(100, 306)}


def test_a_members_evidence_of_reset_classes_is_left_out_the_rest_kept() -> None:
    peer = specctl()
    for cls in ("chat", "code", "math"):
        learn(peer, cls, 0.9, 10)
    part = peer.contribution().acceptance
    assert part is not None and part.classes == ("chat", "code", "math")
    assert without_classes(part, set()) is part
    left = without_classes(part, {"code", "other"})
    assert left is not None and left.classes == ("chat", "math")
    np.testing.assert_array_equal(left.counts, part.counts[[0, 2]])
    np.testing.assert_array_equal(left.arm_stats, part.arm_stats[[0, 2]])
    np.testing.assert_array_equal(left.rounds, part.rounds[[0, 2]])
    assert without_classes(part, {"chat", "code", "math"}) is None
