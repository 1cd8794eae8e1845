"""The per-key envelope: compact, versioned, lossless (docs/architecture.md, MillWheel §6.2, §7.1)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from millwheel import MAX_TIMESTAMP, EnvelopeError, MsgpackCodec, PickleCodec, StateCodecError
from millwheel._dedup import (
    EXACT_IDS_PER_RECORD,
    SMALL_IDS,
    DedupIndex,
    DedupStats,
    _chunks_by_dict,
    _chunks_sorted,
)
from millwheel._envelope import ENVELOPE_VERSION, Envelope, PendingProduction

timestamps = st.integers(min_value=-(2**63), max_value=2**63 - 1)
keys = st.one_of(
    st.text(max_size=10),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.binary(max_size=10),
)

envelopes = st.builds(
    lambda state, timers, pending, seq, ids: _build(state, timers, pending, seq, ids),
    st.one_of(st.none(), st.binary(max_size=50)),
    st.dictionaries(
        st.text(max_size=8), st.tuples(timestamps, st.sampled_from([0, 1])), max_size=10
    ),
    st.lists(
        st.builds(
            PendingProduction,
            st.text(min_size=1, max_size=8),
            st.one_of(st.none(), keys),
            st.binary(max_size=20),
            timestamps,
            st.text(min_size=1, max_size=12),
        ),
        max_size=5,
    ),
    st.integers(min_value=0, max_value=2**40),
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=12), st.integers(min_value=-(2**40), max_value=2**40)
        ),
        max_size=40,
    ),
)


def _build(state, timers, pending, seq, ids):
    env = Envelope(state=state, timers=dict(timers), pending=list(pending), seq=seq)
    half = len(ids) // 2
    stats = DedupStats()
    for rid, ts in ids[:half]:
        env.dedup.add(rid, ts)
    env.dedup.finish(-(2**62), 0.01, None, 0, stats)  # first chunk: built and filtered
    for rid, ts in ids[half:]:
        env.dedup.add(rid, ts)
    env.dedup.finish(-(2**62), 0.01, None, 0, stats)  # second chunk: appended
    return env, {rid for rid, _ in ids}


@given(envelopes)
def test_round_trip(built):
    env, expected_ids = built
    data = env.encode()
    back = Envelope.decode(data)
    assert back.state == env.state
    assert back.timers == env.timers
    assert back.pending == env.pending
    assert back.seq == env.seq
    assert back.encode() == data
    stats = DedupStats()
    assert all(back.dedup.contains(rid, stats) for rid in expected_ids)
    assert set(back.dedup.ids()) == expected_ids


@given(envelopes)
@example(_build(None, {"": (MAX_TIMESTAMP, 0)}, [], 0, []))
def test_hold_is_the_oldest_low_watermark_timer_or_pending_production(built):
    env, _ = built
    # a timer at MAX_TIMESTAMP (fire when the input is finished) holds just below it
    candidates = [min(ts, MAX_TIMESTAMP - 1) for ts, d in env.timers.values() if d == 0] + [
        p.timestamp for p in env.pending
    ]
    assert env.hold() == (min(candidates) if candidates else None)


def test_empty_envelope_is_tiny_and_versioned():
    data = Envelope().encode()
    assert len(data) < 16
    assert msgpack.unpackb(data)[0] == 3  # without a life: the version before lives
    with_life = Envelope(life=2**63 + 5).encode()
    assert msgpack.unpackb(with_life)[0] == ENVELOPE_VERSION == 4 and len(with_life) < 26
    assert Envelope.decode(with_life).life == 2**63 + 5


def test_version_1_envelopes_still_decode_and_hold_counts_state_holds():
    v1 = msgpack.packb([1, b"s", ["t", 5, 0], [], 3, None], use_bin_type=True)
    env = Envelope.decode(v1)
    assert (env.state, env.timers, env.seq, env.held) == (b"s", {"t": (5, 0)}, 3, None)
    env.held = 2
    assert Envelope.decode(env.encode()).hold() == 2


def test_unknown_version_and_corruption_are_clear_errors():
    with pytest.raises(EnvelopeError, match="unknown envelope version 99"):
        Envelope.decode(msgpack.packb([99, None, [], [], 0, None]))
    with pytest.raises(EnvelopeError, match="corrupt envelope"):
        Envelope.decode(b"\xc1garbage")


def test_new_ids_are_found_without_parsing_the_stored_ids():
    idx = DedupIndex()
    idx.add("a", 1)
    for i in range(SMALL_IDS):  # a key with more ids than SMALL_IDS keeps a Bloom filter
        idx.add(f"b{i}", 1)
    idx.finish(0, 0.01, None, 0, DedupStats())
    back = DedupIndex.from_wire(idx.to_wire())
    stats = DedupStats()
    assert not back.contains("never-seen", stats)
    assert back._exact is None  # the Bloom filter said no: the id list was never decoded
    assert back.contains("a", stats) and stats.bloom_maybe == 1


@given(
    st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(min_value=-(2**63), max_value=2**64 - 1),
            st.floats(allow_nan=False),
            st.text(),
            st.binary(),
        ),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(
                st.one_of(st.text(), st.integers(min_value=0, max_value=2**32)), inner, max_size=4
            ),
        ),
        max_leaves=20,
    )
)
def test_codecs_round_trip_plain_data(value):
    for codec in (PickleCodec(), MsgpackCodec()):
        assert codec.decode(codec.encode(value)) == value


def test_codec_errors_say_what_to_do():
    with pytest.raises(StateCodecError, match="use PickleCodec"):
        MsgpackCodec().encode(object())
    assert PickleCodec().decode(PickleCodec().encode(lambda x: x + 1))(1) == 2


def _version_2_envelope(ids):
    """An envelope as version 2 wrote it: ``[id, ts]`` pair chunks, a filter over xxh3-128."""
    from millwheel._bloom import BloomFilter, legacy_fingerprint

    bloom = BloomFilter.create(64, 0.01)
    bloom.update([legacy_fingerprint(rid) for rid, _ in ids])
    blob = msgpack.packb(ids[:2]) + msgpack.packb(ids[2:])
    dedup = [blob, len(ids), min(ts for _, ts in ids), bloom.to_bytes(), 64]
    return msgpack.packb([2, b"s", ["t", 5, 0], [], 3, dedup, None], use_bin_type=True)


def test_a_key_with_few_ids_keeps_no_filter_and_still_finds_them():
    idx = DedupIndex()
    assert idx.admit(["a", "b", "a"], [1, 2, 3], DedupStats()) == [True, True, False]
    idx.finish(0, 0.01, None, 0, DedupStats())
    assert idx.bloom_bytes is None and idx.count == 2
    back = DedupIndex.from_wire(idx.to_wire())
    assert back.admit(["b", "c"], [4, 5], DedupStats()) == [False, True]
    back.finish(0, 0.01, None, 0, DedupStats())
    for i in range(SMALL_IDS):
        back.add(f"n{i}", 6)
    back.finish(0, 0.01, None, 0, DedupStats())
    assert (
        back.bloom_bytes is not None and back.count == 3 + SMALL_IDS
    )  # grown past SMALL_IDS: a filter


def test_version_2_dedup_ids_are_kept_across_the_upgrade_to_version_3():
    old = [(f"old-{i}", 100 + i) for i in range(5)]
    data = _version_2_envelope(old)
    env = Envelope.decode(data)
    assert env.encode() == data  # untouched: still written as version 2
    stats = DedupStats()
    kept = env.dedup.admit(["old-1", "new-1", "old-4", "new-2"], [101, 200, 104, 201], stats)
    assert kept == [False, True, False, True]
    env.dedup.finish(-(2**62), 0.01, None, 0, stats)
    upgraded = env.encode()
    assert msgpack.unpackb(upgraded)[0] == 3
    back = Envelope.decode(upgraded)
    assert set(back.dedup.ids()) == {rid for rid, _ in old} | {"new-1", "new-2"}
    assert back.dedup.admit(
        [rid for rid, _ in old] + ["new-1", "new-2", "new-3"], [0] * 8, DedupStats()
    ) == [False] * 7 + [True]


@given(
    st.lists(st.text(min_size=1, max_size=6), max_size=60),
    st.lists(st.text(min_size=1, max_size=6), max_size=60),
)
def test_admit_is_the_batched_form_of_seen_and_add(first, second):
    batched, single = DedupIndex(), DedupIndex()
    for ids in (first, second):
        stats = DedupStats()
        kept = batched.admit(ids, list(range(len(ids))), stats)
        one_by_one = []
        for i, rid in enumerate(ids):
            fp = single.seen(rid, stats)
            one_by_one.append(fp is not None)
            if fp is not None:
                single.add(rid, i, fp)
        assert (kept if kept is not None else [True] * len(ids)) == one_by_one
        for idx in (batched, single):
            idx.finish(-(2**62), 0.01, None, 0, stats)
        batched, single = (
            DedupIndex.from_wire(batched.to_wire()),
            DedupIndex.from_wire(single.to_wire()),
        )
    assert batched.ids() == single.ids()


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=6), st.integers(min_value=-(10**6), max_value=10**6)
        ),
        min_size=1,
        max_size=120,
        unique_by=lambda x: x[0],
    ),
    st.sampled_from([1, 1_000, 60_000]),
)
def test_id_chunks_of_sorted_timestamps_are_found_by_bisection_as_by_a_dict(pairs, width):
    ids, tss = [rid for rid, _ in pairs], sorted(ts for _, ts in pairs)
    by_dict = _chunks_by_dict(ids, tss, width)
    assert _chunks_sorted(ids, tss, width) == by_dict
    blob, stamps, oldest = by_dict
    # every id is stored once, under the newest timestamp of its bucket, never below its own
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(blob)
    stored = {rid: ts for chunk_ids, ts in unpacker for rid in chunk_ids}
    assert stored == dict(zip(ids, stamps, strict=True))
    assert all(s >= t and s // width == t // width for s, t in zip(stamps, tss, strict=True))
    assert oldest == min(stamps)


def _model_admit(model: dict[str, int], ids: list[str], tss: list[int]) -> list[bool]:
    """What a plain dict of kept ids admits of one step (a repeat within the step too),
    remembering the new ones with their timestamps."""
    expected, now = [], set()
    for rid, ts in zip(ids, tss, strict=True):
        new = rid not in model and rid not in now
        expected.append(new)
        if new:
            now.add(rid)
            model[rid] = ts
    return expected


@given(
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from([f"id{n}" for n in range(40)]),
                st.integers(min_value=0, max_value=9),
            ),
            max_size=6,
        ),
        max_size=14,
    ),
    st.integers(min_value=1, max_value=20),
)
def test_a_key_fed_few_ids_a_step_keeps_exactly_the_ids_a_model_keeps(steps, lag):
    """Small steps (a key with few ids keeps no filter and appends a chunk per step, then
    grows a filter), stored and read back between steps, collected behind a horizon: the
    index admits and keeps what a plain dict does."""
    idx, model = DedupIndex(), {}
    for n, step in enumerate(steps):
        ids, tss = [rid for rid, _ in step], [10 * n + t for _, t in step]
        expected = _model_admit(model, ids, tss)
        kept = idx.admit(ids, tss, DedupStats())
        assert (kept if kept is not None else [True] * len(ids)) == expected
        horizon = 10 * (n - lag)
        idx.finish(horizon, 0.01, None, 0, DedupStats())
        model = {rid: ts for rid, ts in model.items() if ts >= horizon}
        idx = DedupIndex.from_wire(idx.to_wire())
        assert idx.ids() == model
        assert (idx.bloom_bytes is None) == (len(model) <= SMALL_IDS)


def test_a_hot_key_keeps_no_filter_while_its_id_list_costs_less_to_read():
    """A step of ``n`` records reads up to ``EXACT_IDS_PER_RECORD * n`` stored ids rather than
    fingerprint and check its records through a filter; the step that would read more builds one."""
    n = 100
    idx = DedupIndex()
    assert (
        idx.admit([f"a{i}" for i in range(n)], list(range(n)), DedupStats(), in_order=True) is None
    )
    idx.finish(-1, 0.01, None, 0, DedupStats())
    assert idx.bloom_bytes is None and idx.count == n  # the first step: no filter to build
    idx = DedupIndex.from_wire(idx.to_wire())
    half = [f"a{i}" for i in range(0, n, 2)] + [f"b{i}" for i in range(n // 2)]
    assert idx.admit(half, [n] * n, DedupStats()) == [False] * (n // 2) + [True] * (n // 2)
    idx.finish(-1, 0.01, None, 0, DedupStats())
    assert idx.bloom_bytes is None and idx.count == 3 * n // 2 <= EXACT_IDS_PER_RECORD * n
    idx = DedupIndex.from_wire(idx.to_wire())
    assert idx.admit([f"c{i}" for i in range(n)], [n + 1] * n, DedupStats()) is None
    idx.finish(-1, 0.01, None, 0, DedupStats())
    assert (
        idx.bloom_bytes is not None and idx.count == 5 * n // 2
    )  # past 2 ids a record: a filter over all
    idx = DedupIndex.from_wire(idx.to_wire())
    stats = DedupStats()
    ids = (
        [f"a{i}" for i in range(n)]
        + [f"b{i}" for i in range(n // 2)]
        + [f"c{i}" for i in range(n)]
        + ["d"]
    )
    assert idx.admit(ids, [0] * len(ids), stats) == [False] * (len(ids) - 1) + [True]
    assert stats.bloom_maybe >= len(ids) - 1  # every stored id went through the filter


def test_a_bloom_maybe_is_settled_by_a_byte_search_without_parsing_the_ids():
    idx = DedupIndex()
    idx.admit([f"kept-{i}" for i in range(40)], [5] * 40, DedupStats())
    idx.finish(
        -1, 0.5, 1, 0, DedupStats()
    )  # a fixed 1-item filter at 50%: saturated, "maybe" to all
    idx = DedupIndex.from_wire(idx.to_wire())
    stats = DedupStats()
    assert idx.admit([f"new-{i}" for i in range(30)], [6] * 30, stats) is None
    assert stats.bloom_maybe == stats.bloom_false_positive == 30
    assert idx._exact is None  # no id's bytes were in the chunks: the list was never parsed
    assert idx.admit(["kept-3", "new-30", "kept-3"], [7] * 3, stats) == [False, True, False]
    assert idx._exact is not None and stats.bloom_false_positive == 31  # a real duplicate: parsed


ids_of_every_kind = st.text(
    min_size=1, max_size=300, alphabet=st.characters(exclude_categories=("Cs",))
)


@given(
    st.lists(ids_of_every_kind, min_size=1, max_size=30, unique=True),
    st.lists(ids_of_every_kind, max_size=30),
)
def test_the_byte_search_finds_every_stored_id_of_any_text_or_length(stored, probes):
    """msgpack writes a str one way (fixstr, str8, str16 headers by length): every stored id's
    bytes are in the chunks, so a byte search never says "absent" of a stored id."""
    idx = DedupIndex()
    half = len(stored) // 2
    for part in (stored[:half], stored[half:]):  # two steps: two appended chunks
        idx.admit(part, [1] * len(part), DedupStats())
        idx.finish(-1, 0.01, None, 0, DedupStats())
    idx = DedupIndex.from_wire(idx.to_wire())
    assert all(idx._stored(rid) for rid in stored)
    assert [idx._stored(p) for p in probes] == [p in set(stored) for p in probes]


@given(
    st.lists(
        st.lists(
            st.tuples(
                st.integers(min_value=0, max_value=150), st.integers(min_value=0, max_value=9)
            ),
            max_size=60,
        ),
        max_size=10,
    ),
    st.integers(min_value=1, max_value=6),
    st.sampled_from([None, 1, 500]),
)
def test_a_key_fed_large_steps_keeps_exactly_the_ids_a_model_keeps(steps, lag, capacity):
    """Steps of up to 60 records over 150 ids (duplicates inside and across steps), stored and
    read back between steps, collected behind a horizon, a saturated filter among the
    settings: the index admits and keeps what a plain dict does, and keeps no filter only
    while its list is small for the step that read it."""
    idx, model = DedupIndex(), {}
    for n, step in enumerate(steps):
        ids, tss = [f"id{i}" for i, _ in step], sorted(10 * n + t for _, t in step)
        expected = _model_admit(model, ids, tss)
        stats = DedupStats()
        kept = idx.admit(ids, tss, stats, in_order=True)
        assert (kept if kept is not None else [True] * len(ids)) == expected
        assert stats.bloom_false_positive <= stats.bloom_maybe
        horizon = 10 * (n - lag)
        idx.finish(horizon, 0.5 if capacity == 1 else 0.01, capacity, 0, DedupStats())
        model = {rid: ts for rid, ts in model.items() if ts >= horizon}
        idx = DedupIndex.from_wire(idx.to_wire())
        assert idx.ids() == model
        if idx.bloom_bytes is None and model:
            assert capacity is None and len(model) <= max(
                SMALL_IDS, EXACT_IDS_PER_RECORD * len(ids)
            )
