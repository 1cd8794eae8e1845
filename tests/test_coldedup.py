"""The columnar dedup's storage (``millwheel/_coldedup.py``): the fingerprint function that
stored filters depend on, stores written before it (version 1) still deciding exactly, and
the held ids kept in segments that are encoded once and merged by size tier."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from millwheel._coldedup import _IPC, SEGMENTS_PER_TIER, ColumnarDedup
from millwheel._colhash import bloom_size, hash_bytes
from millwheel._colstore import ColumnarStore


def test_hash_bytes_is_a_function_of_each_value_alone():
    values = ["", "a", "abcdefgh", "abcdefghi", "r0-1", "x" * 100, "é", "a\x00"]
    whole = hash_bytes(pa.array(values))
    one_by_one = [int(hash_bytes(pa.array([v]))[0]) for v in values]
    assert whole.tolist() == one_by_one
    assert len(set(one_by_one)) == len(values)  # "a" and "a\0", "" and "x"*100: all distinct
    assert (
        hash_bytes(pa.array(values).slice(3)).tolist() == one_by_one[3:]
    )  # a slice reads its own offsets
    assert hash_bytes(pa.array(values, pa.large_string())).tolist() == one_by_one
    assert hash_bytes(pa.array([v.encode() for v in values], pa.binary())).tolist() == one_by_one
    assert hash_bytes(pa.chunked_array([values[:4], values[4:]])).tolist() == one_by_one
    # stored filters depend on it: the function may not change without a new FINGERPRINTS version
    assert hash_bytes(pa.array(["r0-1", "abcdefghi"])).tolist() == [
        11586987076058577484,
        5057595687875030747,
    ]


def _v1_wire(ids: list[str], keys: list[bytes], kix: list[int], ts: list[int]) -> list:
    """A dedup index as version 1 stored it: one IPC batch (ids, key indexes, timestamps),
    the keys, and a filter over xxh3 fingerprints with the modulo positions of that version."""
    fps = np.fromiter(
        (
            xxhash.xxh3_64_intdigest(i.encode()) ^ xxhash.xxh3_64_intdigest(keys[k])
            for i, k in zip(ids, kix, strict=True)
        ),
        np.uint64,
        len(ids),
    )
    capacity = max(64, 2 * len(ids))
    m, k = bloom_size(capacity, 0.01)
    bits = np.zeros(m, np.bool_)
    h1, h2 = fps & np.uint64(0xFFFFFFFF), (fps >> np.uint64(32)) | np.uint64(1)
    bits[
        (
            (h1[:, None] + np.arange(k, dtype=np.uint64)[None, :] * h2[:, None]) % np.uint64(m)
        ).ravel()
    ] = True
    batch = pa.RecordBatch.from_arrays(
        [pa.array(ids, pa.string()), pa.array(kix, pa.int32()), pa.array(ts, pa.int64())],
        ["id", "kix", "ts"],
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_IPC) as w:
        w.write_batch(batch)
    return [
        sink.getvalue().to_pybytes(),
        keys,
        np.packbits(bits).tobytes(),
        m,
        k,
        capacity,
        0.01,
        False,
    ]


def test_a_version_1_store_still_decides_exactly():
    keys = [b"k0", b"k1"]
    ids = [f"id{i}" for i in range(500)]
    kix = sorted(i % 2 for i in range(500))
    wire = _v1_wire(ids, keys, kix, list(range(500)))
    store = ColumnarStore(dedup=ColumnarDedup.from_wire(wire))
    st = ColumnarStore.decode(store.encode())  # and through the store's current form
    held = [(ids[i], keys[kix[i]]) for i in range(0, 500, 7)]
    fresh = [(f"new{i}", b"k0") for i in range(100)] + [
        (ids[i], keys[1 - kix[i]]) for i in range(0, 500, 9)
    ]  # another key's id is new
    for d in (ColumnarDedup.from_wire(wire), st.dedup):
        keep = d.admit(
            [i for i, _ in held + fresh],
            [k for _, k in held + fresh],
            np.zeros(len(held) + len(fresh), np.int64),
        )
        assert not keep[: len(held)].any() and keep[len(held) :].all()


@pytest.mark.parametrize("batches", [3, 17, 40])
def test_held_ids_are_encoded_once_and_merged_by_tier(batches):
    """Each batch's new ids are one new segment; older segments are stored again as they
    were until :data:`SEGMENTS_PER_TIER` of one size merge: an id is re-encoded about
    log4(batches) times, not in every batch, and the decisions stay exact."""
    rng = random.Random(batches)
    d = ColumnarDedup()
    before: list[bytes] = []
    encoded = held_each_batch = 0
    for b in range(batches):
        n = rng.randrange(50, 200)
        ids = [f"b{b}-{i}" for i in range(n)]
        kbs = [f"k{rng.randrange(30)}".encode() for _ in ids]
        assert d.admit(ids, kbs, np.full(n, b, np.int64)).all()
        wire = d.to_wire()
        encoded += sum(
            pa.ipc.open_stream(s[0]).read_all().num_rows for s in wire[0] if s not in before
        )
        held_each_batch += len(d)
        before = wire[0]
        d = ColumnarDedup.from_wire(wire)
        assert not d.admit(
            ids[::3], kbs[::3], np.zeros(len(ids[::3]), np.int64)
        ).any()  # held across the round trip
    assert len(before) <= (SEGMENTS_PER_TIER - 1) * 4
    assert sum(pa.ipc.open_stream(s[0]).read_all().num_rows for s in before) == len(d)
    assert encoded <= len(d) * (2 + np.log(batches) / np.log(4))
    if batches > 10:
        assert (
            encoded < held_each_batch / 3
        )  # re-encoding everything in every batch: held_each_batch


@pytest.mark.parametrize("seed", range(8))
def test_decisions_match_a_set_of_pairs_through_round_trips_rebuilds_and_collections(seed):
    """Against a plain set of ``(key, id)`` pairs: re-deliveries across batches, the same id
    under another key, repeats inside a batch, with the index read back from its stored form
    (fingerprints then unknown until a rebuilt filter needs them), kept in memory, copied,
    grown past its filter's capacity and collected behind a horizon, in a random order."""
    rng = random.Random(seed)
    d = ColumnarDedup(fpr=0.2)  # a poor filter: many "maybe"s to decide exactly
    held: dict[tuple[bytes, str], int] = {}
    for b in range(25):
        n = rng.randrange(1, 120)
        pool = [
            (f"k{rng.randrange(12)}".encode(), f"i{rng.randrange(b * 40 + 60)}") for _ in range(n)
        ]
        ts = np.array([b * 10 + rng.randrange(10) for _ in pool], np.int64)
        expected, seen = [], set()
        for pair in pool:
            expected.append(pair not in held and pair not in seen)
            seen.add(pair)
        keep = d.admit([i for _, i in pool], [k for k, _ in pool], ts)
        assert keep.tolist() == expected, f"batch {b}"
        for pair, t, k in zip(pool, ts.tolist(), keep.tolist(), strict=True):
            if k:
                held[pair] = t
        op = rng.choice(["wire", "wire", "copy", "keep", "collect"])
        if op == "wire":
            d = ColumnarDedup.from_wire(d.to_wire(), 0.2)
        elif op == "copy":
            d = d.copy()
        elif op == "collect":
            horizon = b * 10 - rng.randrange(0, 60)
            d.collect(horizon, 0)
            held = {p: t for p, t in held.items() if t >= horizon}
        assert len(d) == len(held)
        # which keys hold ids: asked of some keys, known or not (``ColumnarStore.keeping_nothing``)
        asked = [f"k{i}".encode() for i in rng.sample(range(14), rng.randrange(0, 14))]
        assert d.keys_with_ids(asked) == {k for k, _ in held} & set(asked), f"batch {b}"


def test_which_keys_hold_ids_after_a_key_between_others_lost_its_own():
    """``keys_with_ids`` after a collection took every id of a key whose neighbours in the
    key table keep theirs, and of keys never seen."""
    d = ColumnarDedup()
    d.admit(["x", "y", "z"], [b"a", b"b", b"c"], np.array([200, 1, 300], np.int64))
    d.collect(150, 0)
    assert d.keys_with_ids([b"a", b"b", b"c", b"d"]) == {b"a", b"c"}
    assert d.keys_with_ids([b"b"]) == set() and d.keys_with_ids([]) == set()
