"""ModelCalculator in the harness: a long-lived seasonal model per query (MillWheel §2, Fig. 2)."""

from __future__ import annotations

import math

from computations.model import ModelCalculator, expected_count, new_model, update_model
from millwheel.testing import Harness

DAY = 20_000


def harness(**params):
    p = {"day_ms": DAY, "slot_ms": 2_000, "warmup_windows": 5, **params}
    return Harness.for_computation(
        ModelCalculator, inputs={"w": lambda r: r.value["key"]}, outputs=["window_models"], params=p
    )


def seasonal(i: int, base: float = 40.0) -> int:
    return round(base * (1 + 0.5 * math.sin(2 * math.pi * (i * 1_000 % DAY) / DAY)))


def windows(h, key, counts, first=0):
    return [
        h.record(
            {"key": key, "window_start": (first + i) * 1_000, "count": c}, (first + i + 1) * 1_000
        )
        for i, c in enumerate(counts)
    ]


def test_learns_the_seasonal_profile_so_expected_changes_are_predicted():
    h = harness()
    h.inject("w", windows(h, "tv listings", [seasonal(i) for i in range(100)]))
    h.finish("w")
    h.run()
    out = h.values("window_models")
    last_day = out[-20:]
    errors = [abs(m["expected"] - m["count"]) / m["count"] for m in last_day]
    assert max(errors) < 0.2, errors
    # a flat model (the level alone) would be much worse on the same windows
    level = h.state("ModelCalculator", "tv listings")["level"]
    flat = [abs(level - m["count"]) / m["count"] for m in last_day]
    assert max(flat) > 0.35


def test_expected_is_the_prediction_before_learning_and_none_while_warming_up():
    h = harness(require_season=False)
    h.inject("w", windows(h, "cats", [10] * 8))
    h.finish("w")
    h.run()
    out = h.values("window_models")
    assert [m["expected"] for m in out[:5]] == [None] * 5
    assert all(m["model"] is None for m in out[:4])
    assert all(abs(m["expected"] - 10) < 1e-9 for m in out[5:])
    assert [m["window_start"] for m in out] == [i * 1_000 for i in range(8)]


def test_outliers_barely_move_the_model():
    h = harness()
    counts = (
        [seasonal(i) for i in range(60)]
        + [seasonal(i) * 6 for i in range(60, 68)]
        + [seasonal(i) for i in range(68, 80)]
    )
    h.inject("w", windows(h, "q", counts))
    h.finish("w")
    h.run()
    out = h.values("window_models")
    after = out[68:]
    assert all(abs(m["expected"] - m["count"]) / m["count"] < 0.25 for m in after), [
        (m["expected"], m["count"]) for m in after
    ]


def test_state_survives_for_the_long_term_and_models_are_per_key():
    h = harness()
    h.inject("w", windows(h, "a", [10] * 10) + windows(h, "b", [100] * 10))
    h.finish("w")
    h.run()
    a, b = h.state("ModelCalculator", "a"), h.state("ModelCalculator", "b")
    assert a["windows"] == b["windows"] == 10
    assert round(a["level"]) == 10 and round(b["level"]) == 100
    assert h.timers("ModelCalculator", "a") == []


def test_missing_windows_decay_the_level():
    m = new_model(DAY, 2_000)
    for i in range(10):
        update_model(m, i * 1_000, 50, alpha=0.2, gamma=0.3, outlier_ratio=2, outlier_weight=0.05)
    before = expected_count(m, 10_000)
    update_model(m, 30_000, 50, alpha=0.2, gamma=0.3, outlier_ratio=2, outlier_weight=0.05)
    assert expected_count(m, 31_000) < before / 2


def test_no_prediction_before_a_whole_day_of_history():
    h = harness()
    h.inject("w", windows(h, "cats", [seasonal(i) for i in range(30)]))
    h.finish("w")
    h.run()
    out = h.values("window_models")
    assert all(m["expected"] is None and m["model"] is None for m in out[:19])
    assert all(m["expected"] is not None for m in out[20:])


def test_a_partial_first_window_does_not_poison_the_first_day():
    """A stream starts mid-second: its first window holds a fraction of a second's traffic.
    Before the fix that low count set the level, every later window of the first day was
    clipped to twice it as an outlier, and the first seasonal model predicted half the
    traffic: false spikes at its peaks (a paced Zeitgeist run)."""
    m = new_model(DAY, 2_000)
    counts = [6] + [seasonal(i, base=90.0) for i in range(1, 2 * DAY // 1_000)]
    for i, c in enumerate(counts):
        update_model(m, i * 1_000, c, alpha=0.1, gamma=0.3, outlier_ratio=2.0, outlier_weight=0.05)
    assert m["seasonal"]
    # the second day's predictions are the traffic's own, within a fifth, at every slot
    for i in range(DAY // 1_000, 2 * DAY // 1_000):
        want = seasonal(i, base=90.0)
        assert abs(expected_count(m, (i + DAY // 1_000) * 1_000) - want) / want < 0.2, (i, want)
