"""SpikeDetector in the harness: no timers, fires before the bucket is complete (MillWheel §4.6)."""

from __future__ import annotations

from computations.anomalies import SpikeDetector, Thresholds
from computations.model import new_model
from millwheel.testing import Harness


def harness(**params):
    return Harness.for_computation(
        SpikeDetector,
        inputs={"queries": lambda r: r.value["query"], "window_models": lambda r: r.value["key"]},
        outputs=["anomalies"],
        params=params,
    )


def model(level: float) -> dict:
    m = new_model(60_000, 3_000)
    m.update(level=level, windows=50)
    return m


def events(h, query, bucket_ms, n):
    return [h.record({"query": query}, bucket_ms + i * (1_000 // max(n, 1))) for i in range(n)]


def test_fires_as_soon_as_the_running_count_crosses_the_threshold_before_the_bucket_is_complete():
    h = harness()
    h.inject(
        "window_models", [h.record({"key": "cats", "window_start": 0, "model": model(10.0)}, 1_000)]
    )
    h.advance_watermark("window_models", 1_000)
    h.inject("queries", events(h, "cats", 10_000, 60))
    h.run()
    assert h.values("anomalies") == []  # one anomalous bucket: confidence 1, not > 1
    h.inject("queries", events(h, "cats", 11_000, 26))  # threshold for E=10: max(25, 22.6, 10)
    h.run()
    [a] = h.values("anomalies")
    assert (a["kind"], a["window_start"], a["actual"], a["confidence"]) == ("spike", 11_000, 26, 2)
    # the queries injector's low watermark is still far behind the bucket: no timer was needed
    assert h.low_watermark("queries") < 11_000
    assert h.timers("SpikeDetector", "cats") == []


def test_once_per_bucket_and_more_data_does_not_refire():
    h = harness()
    h.inject(
        "window_models", [h.record({"key": "cats", "window_start": 0, "model": model(10.0)}, 1_000)]
    )
    for b in (10_000, 11_000, 12_000):
        h.inject("queries", events(h, "cats", b, 80))
    h.run()
    assert [a["window_start"] for a in h.values("anomalies")] == [11_000, 12_000]


def test_out_of_order_buckets_gain_confidence_when_the_gap_fills():
    h = harness()
    h.inject(
        "window_models", [h.record({"key": "cats", "window_start": 0, "model": model(10.0)}, 1_000)]
    )
    h.inject("queries", events(h, "cats", 12_000, 80))
    h.run()
    assert h.values("anomalies") == []
    h.inject("queries", events(h, "cats", 11_000, 80))
    h.run()
    # 11000 starts the run (confidence 1); 12000, flagged first, now has confidence 2
    assert [(a["window_start"], a["confidence"]) for a in h.values("anomalies")] == [(12_000, 2)]


def test_no_model_no_spike_and_small_counts_are_noise():
    h = harness(thresholds=Thresholds(confidence_threshold=0))
    h.inject("queries", events(h, "new query", 10_000, 100))
    h.run()
    assert h.values("anomalies") == []  # no model yet (warming up)
    h.inject(
        "window_models", [h.record({"key": "rare", "window_start": 0, "model": model(0.5)}, 1_000)]
    )
    h.inject(
        "queries", events(h, "rare", 10_000, 9)
    )  # 18x the prediction, but below spike_min_count
    h.run()
    assert h.values("anomalies") == []


def test_duplicates_do_not_make_a_spike():
    h = harness()
    h.inject(
        "window_models", [h.record({"key": "cats", "window_start": 0, "model": model(10.0)}, 1_000)]
    )
    batch = events(h, "cats", 10_000, 20) + events(h, "cats", 11_000, 20)
    h.inject("queries", batch + batch)  # every event delivered twice (§2, duplicate prevention)
    h.run()
    assert h.values("anomalies") == []
    assert h.metrics("SpikeDetector")["duplicates"] == 40


def test_old_buckets_are_collected():
    h = harness(keep_windows=5)
    h.inject(
        "window_models", [h.record({"key": "cats", "window_start": 0, "model": model(10.0)}, 1_000)]
    )
    for b in range(0, 30_000, 1_000):
        h.inject("queries", events(h, "cats", b, 3))
    h.run()
    assert min(h.state("SpikeDetector", "cats").counts) >= 24_000


def test_buckets_counted_before_the_model_arrives_are_judged_when_it_does():
    """A replay can read the raw events faster than the model stream follows (e.g. Spark)."""
    h = harness(keep_windows=5)
    for b in range(0, 40_000, 1_000):
        h.inject("queries", events(h, "cats", b, 80 if b in (20_000, 21_000, 22_000) else 10))
    h.run()
    assert h.values("anomalies") == []
    h.inject(
        "window_models", [h.record({"key": "cats", "window_start": 0, "model": model(10.0)}, 1_000)]
    )
    h.run()
    assert [(a["window_start"], a["confidence"]) for a in h.values("anomalies")] == [
        (21_000, 2),
        (22_000, 3),
    ]
    assert h.state("SpikeDetector", "cats").unjudged == set()
