"""The automatic rescale policy (``millwheel/runtime/_autoscale.py``): a pure function of the
last batches' per-interval figures, tested without Spark."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millwheel.runtime._autoscale import AutoscalePolicy, Figures, decide

P = AutoscalePolicy()


def batch(step_ms: list[float], keys: list[int] | None = None) -> dict[int, Figures]:
    keys = keys or [100] * len(step_ms)
    return {i: Figures(ms, k) for i, (ms, k) in enumerate(zip(step_ms, keys, strict=True))}


def hot(n: int = 8, at: int = 3, ms: float = 900.0) -> dict[int, Figures]:
    return batch([ms if i == at else 60.0 + i for i in range(n)])


def test_a_hot_interval_for_several_batches_splits_with_the_figures_that_drove_it():
    d = decide("C", 8, [hot()] * 3, P, now_s=1_000.0, last_change_s=None)
    assert d is not None and (d.action, d.from_intervals, d.to_intervals) == ("split", 8, 16)
    assert "interval 3 took 900 ms" in d.reason and "the median" in d.reason
    assert [h["interval"] for h in d.figures["hot"]] == [3, 3, 3]
    assert all(h["value"] == 900.0 and h["median"] < 100 for h in d.figures["hot"])


def test_hysteresis_one_or_two_hot_batches_are_not_enough():
    calm = batch([60.0 + i for i in range(8)])
    assert decide("C", 8, [calm, hot(), hot()], P, now_s=1e3, last_change_s=None) is None
    assert decide("C", 8, [hot(), calm, hot()], P, now_s=1e3, last_change_s=None) is None
    assert (
        decide("C", 8, [hot(), hot()], P, now_s=1e3, last_change_s=None) is None
    )  # fewer batches than the window
    # the hot interval may move between batches: each batch must have one
    moving = [hot(at=1), hot(at=5), hot(at=2)]
    assert decide("C", 8, moving, P, now_s=1e3, last_change_s=None).action == "split"


def test_a_hot_interval_must_be_both_far_above_the_median_and_slow_in_absolute_terms():
    fast = batch(
        [150.0 if i == 0 else 5.0 for i in range(8)]
    )  # 30x the median but under min_hot_ms
    assert decide("C", 8, [fast] * 3, P, now_s=1e3, last_change_s=None) is None
    even = batch(
        [900.0 - i for i in range(8)]
    )  # slow everywhere: splitting helps no interval more than another
    assert decide("C", 8, [even] * 3, P, now_s=1e3, last_change_s=None) is None


def test_state_size_alone_splits():
    big = batch([30.0] * 8, keys=[500_000 if i == 6 else 1_000 for i in range(8)])
    d = decide("C", 8, [big] * 3, P, now_s=1e3, last_change_s=None)
    assert d is not None and d.action == "split" and "interval 6 held 500000 keys" in d.reason


def test_all_cold_merges_and_the_cooldown_and_bounds_hold():
    cold = batch([2.0] * 8, keys=[50] * 8)
    d = decide("C", 8, [cold] * 3, P, now_s=1e3, last_change_s=None)
    assert d is not None and (d.action, d.to_intervals) == ("merge", 4)
    assert "every interval took under 20 ms (at most 2)" in d.reason
    assert decide("C", 8, [cold] * 3, P, now_s=1e3, last_change_s=1e3 - P.cooldown_s + 1) is None
    assert decide("C", 8, [cold] * 3, P, now_s=1e3, last_change_s=1e3 - P.cooldown_s) is not None
    assert (
        decide("C", 2, [batch([2.0] * 2)] * 3, P, now_s=1e3, last_change_s=None) is None
    )  # min_intervals
    top = AutoscalePolicy(max_intervals=8)
    assert decide("C", 8, [hot()] * 3, top, now_s=1e3, last_change_s=None) is None  # max_intervals
    one_warm = batch([2.0] * 7 + [30.0])
    assert decide("C", 8, [cold, cold, one_warm], P, now_s=1e3, last_change_s=None) is None


def test_a_policy_without_hysteresis_is_refused():
    with pytest.raises(ValueError, match="hysteresis"):
        AutoscalePolicy(cold_ms=300.0, min_hot_ms=200.0)
    with pytest.raises(ValueError, match="hot_ratio"):
        AutoscalePolicy(hot_ratio=1.0)


@given(
    st.lists(st.lists(st.floats(0, 5_000), min_size=1, max_size=16), min_size=0, max_size=6),
    st.integers(1, 300),
)
def test_a_decision_is_always_within_bounds_and_never_both_ways(history, intervals):
    hist = [batch(b) for b in history]
    d = decide("C", intervals, hist, P, now_s=1e3, last_change_s=None)
    if d is None:
        return
    assert P.min_intervals <= d.to_intervals <= P.max_intervals
    assert d.to_intervals == (intervals * 2 if d.action == "split" else intervals // 2)
    # a split needs every batch of the window hot, a merge every one cold: never both
    assert len(hist) >= P.window


def test_no_flapping_a_split_then_a_merge_needs_the_load_to_really_fall():
    """Simulate a skewed load: after the split the hot interval's time halves, and the
    policy does not merge back while it stays well above the cold threshold."""
    rng = random.Random(5)
    intervals, history, changes, last = 4, [], [], None
    for t in range(200):
        load = 2_000.0 / intervals  # the hot key range's time shrinks with the split
        figures = {
            i: Figures((load if i == 0 else 40.0) * rng.uniform(0.9, 1.1), 100)
            for i in range(intervals)
        }
        history.append(figures)
        d = decide("C", intervals, history, P, now_s=float(t * 10), last_change_s=last)
        if d is not None:
            changes.append((t, d.action, d.to_intervals))
            intervals, history, last = d.to_intervals, [], float(t * 10)
    assert changes and all(a == "split" for _, a, _ in changes), changes
    assert intervals <= 64
