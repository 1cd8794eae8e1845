"""Exactly-once delivery by record id (MillWheel §6.1.1), Bloom filter fast path included."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millwheel import Computation, ComputationOptions, DedupOptions, Record
from millwheel._bloom import BloomFilter, fingerprint
from millwheel._envelope import DedupIndex, DedupStats
from millwheel._record import MIN_TIMESTAMP
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


def _relay(relays: tuple[type, type], columnar: bool, dedup: DedupOptions) -> Harness:
    return Harness.for_computation(
        relays[columnar],
        inputs={"in": lambda r: r.id.split("#")[0]},
        outputs=["out"],
        options=ComputationOptions(dedup=dedup),
        name="Relay",
    )


@pytest.mark.parametrize("columnar", [False, True], ids=["per-record", "columnar"])
def test_a_key_that_keeps_only_ids_is_forgotten_once_they_can_go(columnar, id_relays):
    """Invariant (§6.1.1, ``DedupOptions``): after a round at low watermark ``lw``, no key
    without state keeps an id it could have collected (remembered before ``lw - slack -
    gc_interval``), touched in the round or not; a key that kept only those ids is
    forgotten, and the wake-up that
    collects them holds no watermark. Exactly once is unchanged: every id is delivered
    once, re-deliveries inside the horizon are duplicates, behind it late. Random rounds
    of records (many keys seen once, a few seen often), re-deliveries and watermark moves,
    fresh seed."""
    seed = random.SystemRandom().randrange(1, 10**6)
    print(f"seed {seed}")
    rng = random.Random(seed)
    slack, gc = rng.choice([(1_000, 0), (1_000, 250), (5_000, 1_000)])
    h = _relay(id_relays, columnar, DedupOptions(slack_ms=slack, gc_interval_ms=gc))
    lw, t, n, sent = MIN_TIMESTAMP, 0, 0, {}
    #: an id is remembered under its timestamp, or the watermark it came late for (``dedup_stamp``)
    stamp: dict[str, int] = {}
    for _ in range(40):
        recs = []
        for _ in range(rng.randrange(0, 30)):
            key = f"hot{rng.randrange(3)}" if rng.random() < 0.3 else f"once{n}"
            rid = f"{key}#{n}"
            n += 1
            sent[rid] = max(lw, t + rng.randrange(-200, 200), 0)
            recs.append(Record(None, rid, sent[rid], rid))
        if sent and rng.random() < 0.3:  # re-deliveries, inside or behind the horizon
            recs += [
                Record(None, r, sent[r], r) for r in rng.sample(sorted(sent), min(3, len(sent)))
            ]
        for r in recs:
            stamp[r.id] = max(stamp.get(r.id, MIN_TIMESTAMP), r.timestamp, lw)
        h.inject("in", recs)
        if rng.random() < 0.6:
            t += rng.randrange(0, 3 * slack)
            lw = max(lw, t - rng.randrange(0, 500))
            h.advance_watermark("in", lw)
        h.run()
        assert h.low_watermark("Relay") == lw, f"seed {seed}: a wake-up held the watermark"
        for key in h.keys("Relay"):
            for rid in h.dedup_ids("Relay", key):
                assert stamp[rid] >= lw - slack - 2 * gc, (
                    f"seed {seed}: {key!r} keeps {rid} (stamp at most {stamp[rid]}) at lw {lw}"
                )
            assert h.dedup_ids("Relay", key), f"seed {seed}: {key!r} kept with nothing"
    # the last records come with the final watermark (+inf), two of them twice: judged
    # against the watermark they arrived under (the second copies are duplicates), their keys
    # go in that very round, as every other key's ids (``_contract.dedup_horizon``)
    dups = h.metrics("Relay")["duplicates"]
    last = [f"last{i}#{n + i}" for i in range(5)]
    sent.update((rid, max(lw, t, 0)) for rid in last)
    h.inject("in", [Record(None, rid, sent[rid], rid) for rid in [*last, *last[:2]]])
    h.finish("in")
    h.run()
    assert list(h.keys("Relay")) == [], f"seed {seed}: keys held at +inf"
    assert h.metrics("Relay")["duplicates"] == dups + 2, f"seed {seed}"
    out = [r.id for r in h.output("out")]
    assert len({v for v in (r.value for r in h.output("out"))}) == len(out), f"seed {seed}"
    m = h.metrics("Relay")
    assert len(out) + m["late_dropped"] >= len(sent), f"seed {seed}: a record was lost"
    assert {r.value for r in h.output("out")} <= set(sent), f"seed {seed}"
    assert m["dedup_ids_collected"] > 0, f"seed {seed}: nothing was collected"
