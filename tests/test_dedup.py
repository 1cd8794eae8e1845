"""Exactly-once delivery by record id (MillWheel §6.1.1), Bloom filter fast path included."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from millwheel import Computation, ComputationOptions, DedupOptions, Record
from millwheel._bloom import BloomFilter, fingerprint
from millwheel._envelope import DedupIndex, DedupStats
from millwheel.testing import Harness


class Summer(Computation):
    def process_record(self, record):
        self.state.set(self.state.get(0) + record.value)


def summer(**opts):
    return Harness.for_computation(Summer, inputs=["in"], options=ComputationOptions(**opts))


def test_duplicates_are_dropped_and_counted():
    h = summer()
    recs = [Record("k", 1, 100, "a"), Record("k", 2, 100, "b")]
    h.inject("in", recs + recs[::-1] + recs)
    h.run()
    h.inject("in", recs)  # in a later step too
    h.run()
    assert h.state("Summer", "k") == 3
    assert h.metrics("Summer")["duplicates"] == 6


def test_exactly_once_off_skips_the_dedup_pass():
    h = summer(exactly_once=False)
    h.inject("in", [Record("k", 1, 100, "a")] * 3)
    h.run()
    assert h.state("Summer", "k") == 3
    assert h.dedup_ids("Summer", "k") == set()


def test_tiny_bloom_filter_falls_back_to_the_exact_ids_and_drops_no_unique_record():
    # a fixed 1-item filter at 50% fpr is saturated at once: nearly every lookup is a "maybe"
    h = summer(dedup=DedupOptions(bloom_capacity=1, bloom_fpr=0.5))
    for batch in range(20):
        h.inject("in", [Record("k", 1, 100, f"id-{batch}-{i}") for i in range(50)])
        h.run()
    m = h.metrics("Summer")
    assert h.state("Summer", "k") == 1_000  # zero unique records dropped
    assert m["duplicates"] == 0
    assert m["bloom_false_positive"] > 500  # the fallback really ran


def test_well_sized_filter_rarely_needs_the_exact_ids():
    h = summer()
    for batch in range(20):
        h.inject("in", [Record("k", 1, 100, f"id-{batch}-{i}") for i in range(50)])
        h.run()
    m = h.metrics("Summer")
    assert h.state("Summer", "k") == 1_000
    assert m["bloom_maybe"] < 50  # ~1% fpr on 1000 lookups


def test_ids_are_collected_behind_the_watermark_minus_slack():
    dedup = DedupOptions(slack_ms=1_000, gc_interval_ms=0)
    h = summer(dedup=dedup)
    h.inject("in", [Record("k", 1, 100, "old"), Record("k", 1, 5_000, "new")])
    h.run()
    assert h.dedup_ids("Summer", "k") == {"old", "new"}
    h.advance_watermark("in", 1_100)  # horizon = 100: "old" (ts 100) is kept
    h.inject("in", [Record("k", 1, 5_000, "new")])
    h.run()
    assert h.dedup_ids("Summer", "k") == {"old", "new"}
    h.advance_watermark("in", 1_101)  # horizon = 101 > 100: "old" goes
    h.inject("in", [Record("k", 1, 5_000, "new")])
    h.run()
    assert h.dedup_ids("Summer", "k") == {"new"}
    assert h.metrics("Summer")["dedup_ids_collected"] == 1
    # a re-delivery of the collected id is now behind the watermark: late, dropped, counted
    h.inject("in", [Record("k", 1, 100, "old")])
    h.run()
    assert h.state("Summer", "k") == 2
    assert h.metrics("Summer")["late_dropped"] == 1


def test_dedup_index_never_forgets_an_id_before_the_horizon():
    idx = DedupIndex()
    stats = DedupStats()
    for step in range(30):
        for i in range(40):
            idx.add(f"{step}-{i}", step)
        idx.finish(horizon=step - 10, fpr=0.01, fixed_capacity=None, gc_interval_ms=0, stats=stats)
        idx = DedupIndex.from_wire(idx.to_wire())  # as if stored and reloaded
        for old in range(max(0, step - 10), step + 1):
            assert idx.contains(f"{old}-7", stats)
    assert idx.count == 40 * 11


@given(
    st.sets(st.text(min_size=1, max_size=20), max_size=200),
    st.lists(st.text(max_size=20), max_size=50),
)
def test_bloom_filter_has_no_false_negatives_and_survives_a_round_trip(ids, probes):
    f = BloomFilter.create(capacity=max(1, len(ids)), fpr=0.01)
    f.update(map(fingerprint, ids))
    g = BloomFilter.load(f.to_bytes(), capacity=f.capacity)
    assert all(fingerprint(i) in g for i in ids)
    assert [fingerprint(p) in f for p in probes] == [fingerprint(p) in g for p in probes]
