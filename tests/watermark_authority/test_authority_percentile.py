"""Percentile watermarks on known distributions (§7.2: "a 99% low watermark").

Definition (docs/authority.md): sort the intervals by their oldest pending work; strip the
oldest (100 - p)% of the pending work; the p% watermark is the minimum of what is left.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watermark_authority import InvalidRequestError, weighted_percentile


def test_uniform_intervals(client, ns):
    c = f"{ns}c"
    names = [f"i{k:03d}" for k in range(1_000)]
    t = client.acquire_many(c, names)
    rng = random.Random(3)
    values = list(range(1_000))
    rng.shuffle(values)  # interval i holds some value in 0..999, each value once
    client.report_batch(c, [(n, t[n], v) for n, v in zip(names, values, strict=True)])
    assert client.watermark(c) == 0
    assert client.percentile_watermark(c, 100) == 0
    assert client.percentile_watermark(c, 99) == 10  # the 10 oldest (1%) are stragglers
    assert client.percentile_watermark(c, 95) == 50
    assert client.percentile_watermark(c, 50) == 500
    assert client.percentile_watermark(c, 0.1) == 999


def test_weighted_by_pending_work(client, ns):
    c = f"{ns}c"
    t = client.acquire_many(c, ["straggler", "busy", "quiet"])
    # 1 pending record at t=100, 98 at t=5_000, 1 at t=9_000: 100 in all
    client.report_batch(
        c,
        [
            ("straggler", t["straggler"], 100, 1),
            ("busy", t["busy"], 5_000, 98),
            ("quiet", t["quiet"], 9_000, 1),
        ],
    )
    assert client.watermark(c) == 100
    assert client.percentile_watermark(c, 99) == 5_000  # the straggler is 1% of the work
    assert client.percentile_watermark(c, 99.5) == 100  # but more than 0.5%
    assert client.percentile_watermark(c, 1) == 9_000
    assert client.percentile_watermark(c, 2) == 5_000


def test_intervals_without_pending_work_do_not_hold_the_percentile(client, ns):
    c = f"{ns}c"
    t = client.acquire_many(c, ["idle", "a", "b"])
    client.report_batch(
        c, [("idle", t["idle"], 10, 0), ("a", t["a"], 2_000, 50), ("b", t["b"], 3_000, 50)]
    )
    assert client.watermark(c) == 10  # the low watermark is exact: idle still counts
    assert client.percentile_watermark(c, 99) == 2_000


def test_injector_percentile_is_over_processes(client, ns):
    inj = f"{ns}logs"
    client.expect_injector_processes(inj, [f"p{k}" for k in range(100)])
    for k in range(100):
        client.report_injector(inj, f"p{k}", 1_000 + k)
    assert client.percentile_watermark(inj, 99) == 1_001
    assert client.percentile_watermark(inj, 90) == 1_010


@pytest.mark.parametrize("pct", [0, -1, 100.5, "99", True, float("nan")])
def test_a_bad_percentile_is_refused(client, ns, pct):
    c = f"{ns}c"
    client.acquire(c, "a")
    if isinstance(pct, str) and hasattr(client, "url"):
        pytest.skip("over HTTP the query string is always text")
    with pytest.raises(InvalidRequestError, match=r"\(0, 100\]"):
        client.percentile_watermark(c, pct)


@given(
    st.lists(st.tuples(st.integers(-1_000, 1_000), st.integers(0, 20)), min_size=1, max_size=40),
    st.integers(500, 100_000).map(lambda m: m / 1000),
)
def test_weighted_percentile_matches_a_brute_force_definition(items, pct):
    values = [v for v, _ in items]
    weights = [w for _, w in items]
    total = sum(weights)
    budget = total * (100 - pct) / 100
    # brute force: the largest candidate v such that the weight strictly older than v fits in the budget
    best = min(values)
    for v in values:
        older = sum(w for v2, w in items if v2 < v)
        if older <= budget + 1e-9:
            best = max(best, v)
    assert weighted_percentile(values, weights, pct) == best
    assert weighted_percentile(values, weights, pct) >= min(values)
