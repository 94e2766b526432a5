"""How often a sidecar's rounds with the store come: often while a fleet's evidence is
young, once every ``fleet.publish_interval_s`` once it is not."""

from __future__ import annotations

import itertools

import numpy as np

from specctl.sidecar.fleet_store import FIRST_ROUND_SHARE, ROUND_GROWTH, round_wait


def schedule(interval: float, until: float) -> list[float]:
    """Round times, from a sidecar's first report on, as FleetStore.run paces them (without
    its jitter): the round that first holds the report a tenth of the interval after it."""
    t, out = FIRST_ROUND_SHARE * interval, []
    while t <= until:
        out.append(t)
        t += round_wait(t, interval)
    return out


def test_a_wait_is_never_shorter_than_the_floor_nor_longer_than_the_interval() -> None:
    for interval in (0.05, 0.5, 1.0, 60.0):
        waits = [round_wait(t, interval) for t in np.linspace(0.0, 200.0 * interval, 2001)]
        assert min(waits) == FIRST_ROUND_SHARE * interval
        assert max(waits) == interval
        assert waits == sorted(waits)


def test_past_the_floor_each_merge_holds_four_fifths_of_what_the_next_one_will() -> None:
    rounds = schedule(1.0, 30.0)
    floor_until = FIRST_ROUND_SHARE / ROUND_GROWTH
    growing = [(a, b) for a, b in itertools.pairwise(rounds) if a >= floor_until]
    assert growing
    for a, b in growing:
        # a fleet's evidence grows with its time since the start: a replica that merged
        # at a holds a / b of what the fleet will have at the next round
        assert a / b >= 1.0 / (1.0 + ROUND_GROWTH) - 1e-9
    # and once the wait reaches the interval, rounds are an interval apart
    late = [b - a for a, b in itertools.pairwise(rounds) if a >= 1.0 / ROUND_GROWTH]
    assert late and np.allclose(late, 1.0)


def test_a_fleet_started_together_merges_about_fourteen_times_in_its_first_four_seconds() -> None:
    # rounds doubling from a tenth of the interval made 6 in the first 4 s
    assert 12 <= len(schedule(1.0, 4.0)) <= 16
    # the interval scales the whole schedule
    assert len(schedule(0.5, 2.0)) == len(schedule(1.0, 4.0))
