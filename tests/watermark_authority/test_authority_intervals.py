"""The interval map: a missing interval holds the watermark; splits and merges move ownership (§7.1, §7.2)."""

from __future__ import annotations

import pytest

from watermark_authority import MAX_TIMESTAMP, MIN_TIMESTAMP, ConflictError, UnknownNameError


def test_an_interval_that_never_reported_holds_the_watermark_at_min(client, ns):
    c = f"{ns}c"
    t = client.acquire_many(c, ["a", "b"])
    client.report(c, "a", t["a"], 5_000)
    assert client.watermark(c) == MIN_TIMESTAMP
    client.report(c, "b", t["b"], 7_000)
    assert client.watermark(c) == 5_000


def test_a_silent_interval_holds_the_watermark_at_its_last_value(client, ns):
    c = f"{ns}c"
    t = client.acquire_many(c, ["a", "b", "c"])
    client.report_batch(c, [("a", t["a"], 1_000), ("b", t["b"], 1_000), ("c", t["c"], 1_000)])
    for ts in range(2_000, 10_000, 1_000):  # b's worker died after its first report
        client.report_batch(c, [("a", t["a"], ts), ("c", t["c"], ts)])
    assert client.watermark(c) == 1_000
    new = client.acquire(c, "b")  # a new owner takes over: still held until it reports
    assert client.watermark(c) == 1_000
    client.report(c, "b", new, 9_500)
    assert client.watermark(c) == 9_000


def test_an_interval_that_finished_stops_holding(client, ns):
    c = f"{ns}c"
    t = client.acquire_many(c, ["a", "b"])
    client.report_batch(c, [("a", t["a"], MAX_TIMESTAMP), ("b", t["b"], 3_000)])
    assert client.watermark(c) == 3_000
    client.report(c, "b", t["b"], MAX_TIMESTAMP)
    assert client.watermark(c) == MAX_TIMESTAMP


def test_split_children_inherit_the_last_value_and_hold_until_they_report(client, ns):
    c = f"{ns}c"
    t = client.acquire_many(c, ["a-m", "n-z"])
    client.report_batch(c, [("a-m", t["a-m"], 1_000), ("n-z", t["n-z"], 4_000)])
    assert client.watermark(c) == 1_000
    kids = client.split(c, "a-m", ["a-f", "g-m"])
    assert sorted(kids) == ["a-f", "g-m"]
    assert client.watermark(c) == 1_000
    client.report(c, "a-f", kids["a-f"], 3_000)
    assert client.watermark(c) == 1_000  # g-m still holds the inherited 1_000
    client.report(c, "g-m", kids["g-m"], 2_000)
    assert client.watermark(c) == 2_000


def test_merge_takes_the_oldest_of_the_merged(client, ns):
    c = f"{ns}c"
    t = client.acquire_many(c, ["a", "b", "c"])
    client.report_batch(c, [("a", t["a"], 1_000), ("b", t["b"], 2_000), ("c", t["c"], 3_000)])
    client.report(c, "a", t["a"], 2_500)
    assert client.watermark(c) == 2_000
    ab = client.merge(c, ["a", "b"], "ab")
    assert client.watermark(c) == 2_000  # min(2_500, 2_000) carried into ab
    client.report(c, "ab", ab, 3_500)
    assert client.watermark(c) == 3_000


def test_split_and_merge_refuse_names_that_would_collide(client, ns):
    c = f"{ns}c"
    client.acquire_many(c, ["a", "b"])
    with pytest.raises(ConflictError, match="already intervals"):
        client.split(c, "a", ["a1", "b"])
    with pytest.raises(ConflictError, match="another interval"):
        client.merge(c, ["a"], "b")
    with pytest.raises(UnknownNameError, match="no interval 'nope'"):
        client.split(c, "nope", ["x", "y"])
    with pytest.raises(UnknownNameError):
        client.merge(c, ["a", "nope"], "x")


def test_a_new_interval_joins_at_min_and_cannot_pull_the_published_value_back(client, ns):
    c = f"{ns}c"
    t = client.acquire(c, "a")
    client.report(c, "a", t, 5_000)
    assert client.watermark(c) == 5_000
    t2 = client.acquire(c, "b")  # scale out: a new interval, nothing known about it yet
    assert client.watermark(c) == 5_000  # held, never back
    client.report_batch(c, [("a", t, 8_000), ("b", t2, 6_000)])
    assert client.watermark(c) == 6_000


def test_notes_about_a_computation_reach_its_status_bounded_and_are_checked(client, ns):
    """Why a computation's intervals were split or merged (the runtime's rescales, §7.1), for the dashboard."""
    from watermark_authority import InvalidRequestError

    c = f"{ns}c"
    client.acquire_many(c, ["a", "b"])
    for i in range(7):
        client.note(c, f"autoscale: split {i}")
    client.note(c, "x" * 2_000)
    status = client.authority.status() if hasattr(client, "authority") else client.status()
    notes = status["computations"][c]["notes"]
    assert [n["text"][:16] for n in notes] == ["autoscale: split"] * 4 + ["x" * 16]
    assert len(notes[-1]["text"]) == 500 and all(isinstance(n["at_ms"], int) for n in notes)
    with pytest.raises(InvalidRequestError):
        client.note(c, "  ")
