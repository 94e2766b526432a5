"""Quantiles of a scraped histogram, interpolated within a bucket as Prometheus does."""

from __future__ import annotations

import math

import pytest

from specctl.testing.scripted_engine import histogram_quantile

INF = float("inf")
# 50 observations up to 1 ms, 50 more up to 10 ms, none above
BUCKETS = [(0.001, 50.0), (0.01, 100.0), (INF, 100.0)]


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.25, 0.0005), (0.5, 0.001), (0.75, 0.0055), (0.99, 0.00982), (1.0, 0.01)],
)
def test_a_quantile_is_interpolated_within_its_bucket(q: float, expected: float) -> None:
    assert histogram_quantile(BUCKETS, q) == pytest.approx(expected)


def test_a_quantile_in_the_open_bucket_is_its_lower_bound() -> None:
    assert histogram_quantile([(0.001, 10.0), (INF, 20.0)], 0.99) == 0.001


def test_a_histogram_that_observed_nothing_has_no_quantile() -> None:
    assert math.isnan(histogram_quantile([], 0.5))
    assert math.isnan(histogram_quantile([(0.001, 0.0), (INF, 0.0)], 0.5))
