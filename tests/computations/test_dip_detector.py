"""DipDetector in the harness: a dip is declared only once the low watermark has passed the bucket (§2, §4.6, Fig. 9)."""

from __future__ import annotations

import pytest

from computations.anomalies import DipDetector, Thresholds
from millwheel.testing import Harness


def harness(**params):
    return Harness.for_computation(
        DipDetector, inputs={"w": lambda r: r.value["key"]}, outputs=["anomalies"], params=params
    )


def windows(h, key, counts, expected=40.0, first=0):
    return [
        h.record(
            {"key": key, "window_start": (first + i) * 1_000, "count": c, "expected": expected},
            (first + i + 1) * 1_000,
        )
        for i, c in enumerate(counts)
    ]


def test_never_fires_before_the_low_watermark_passes_the_bucket():
    """Windows arrive early (their data could still be in flight): nothing fires until the LW passes them."""
    h = harness()
    h.inject("w", windows(h, "cats", [40, 0, 0, 0, 0, 40]))
    h.run()
    assert h.values("anomalies") == []
    assert [t.timestamp for t in h.timers("DipDetector", "cats")] == [
        1_000,
        2_000,
        3_000,
        4_000,
        5_000,
        6_000,
    ]
    fired_at = {}
    for lw in range(500, 7_001, 250):
        h.advance_watermark("w", lw)
        h.run()
        for a in h.values("anomalies"):
            fired_at.setdefault(a["window_start"], lw)
            assert a["low_watermark"] >= a["window_end"], a
    # buckets 1000..4000 are empty; confidence 2 from bucket 2000 on; each fires the moment LW reaches its end
    assert fired_at == {2_000: 3_000, 3_000: 4_000, 4_000: 5_000}


def test_confidence_as_in_fig9_consecutive_buckets_above_the_threshold():
    h = harness(thresholds=Thresholds(confidence_threshold=2))
    h.inject("w", windows(h, "cats", [40, 1, 1, 40, 1, 1, 1, 1, 40]))
    h.finish("w")
    h.run()
    out = h.values("anomalies")
    assert [(a["window_start"], a["confidence"]) for a in out] == [(6_000, 3), (7_000, 4)]
    assert all(a["kind"] == "dip" and a["query"] == "cats" for a in out)


def test_windows_out_of_order_are_judged_in_bucket_order():
    h = harness()
    ws = windows(h, "cats", [40, 1, 1, 1, 40])
    h.inject("w", list(reversed(ws)))
    h.finish("w")
    h.run()
    assert [a["window_start"] for a in h.values("anomalies")] == [2_000, 3_000]


def test_a_gap_breaks_the_run_and_low_predictions_are_ignored():
    h = harness()
    h.inject("w", windows(h, "cats", [1]) + windows(h, "cats", [1], first=5))  # not consecutive
    h.inject("w", windows(h, "rare", [0, 0, 0], expected=3.0))  # below dip_min_expected
    h.inject("w", windows(h, "new", [0, 0, 0], expected=None))  # model still warming up
    h.finish("w")
    h.run()
    assert h.values("anomalies") == []


def test_idle_keys_keep_nothing():
    h = harness()
    h.inject("w", windows(h, "cats", [40, 41, 39]))
    h.finish("w")
    h.run()
    assert h.keys("DipDetector") == [] or h.state("DipDetector", "cats") is None


@pytest.mark.parametrize(
    "count,expected,dip",
    [
        (0, 12.0, True),
        (3, 12.0, True),
        (4, 12.0, False),
        (0, 11.9, False),
        (15, 40.0, True),
        (16, 40.0, False),
    ],
)
def test_dip_threshold(count, expected, dip):
    assert Thresholds().is_dip(count, expected=expected) is dip
