"""Vectorised exactly-once dedup for columnar computations (MillWheel §6.1.1).

The per-record path (``_envelope.DedupIndex``) keeps one id list and one Bloom filter per
key. A columnar computation keeps one :class:`ColumnarDedup` per key interval (the
harness: per computation) and checks a whole micro-batch in a few numpy calls:

1. **fingerprints** of every ``(key, id)`` pair: a 64-bit hash of the id's bytes
   (:func:`hash_bytes`: whole-array numpy passes over the Arrow string buffer, no Python
   call per id) xor that of the key (computed once per distinct key), so two keys never
   share a decision — dedup stays per key (§6.1.1);
2. **Bloom check** over a bit array (double hashing, ``k`` positions a fingerprint) for
   the whole batch in one fancy-indexing call; a "no" is final;
3. a **"maybe"** is compared with the exact ids kept for its key (the rows are sorted by
   key: two ``np.searchsorted`` calls find them): a Bloom false positive never drops a record;
4. **insert**: ids (an Arrow array) merged after their key's, their bits set in one call;
   the filter is rebuilt from the ids when they outgrow its capacity, or after garbage
   collection.

A stored index names its fingerprint function (:data:`FINGERPRINTS`); one of an earlier
function (xxh3-64 per id) has its filter rebuilt from its ids when read: decisions stay exact.

Ids are kept while their timestamp is ``>= horizon`` (``low watermark - slack_ms``), as in
the per-record path, but collected by their own timestamp rather than by the newest of a
step's chunk: collection happens at the same moments (the oldest id more than
``gc_interval_ms`` behind the horizon), and may drop an id up to ``gc_interval_ms``
earlier; a re-delivery of such an id (behind the watermark by more than ``slack_ms``) is late.

>>> d = ColumnarDedup()
>>> d.admit(["a", "b", "a"], [b"k", b"k", b"k"], [5, 6, 7]).tolist()
[True, True, False]
>>> d.admit(["a", "c", "a"], [b"k", b"k", b"other"], [5, 8, 9]).tolist()
[False, True, True]
>>> len(d)
4
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from millwheel._colinput import factorize
from millwheel._colsegments import SegmentFiles, read_segment
from millwheel._envelope import DedupStats

_MASK32 = np.uint64(0xFFFFFFFF)
#: the mixing constants of :func:`hash_bytes` (splitmix64 / murmur3's finaliser)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_FMIX1, _FMIX2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_S29, _S33 = np.uint64(29), np.uint64(33)
#: seeds: an id and a key with the same bytes hash differently
ID_SEED, KEY_SEED = np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344)
#: the low ``r`` bytes of a little-endian word, ``r`` = 0..8
_TAIL = np.array([(1 << (8 * r)) - 1 for r in range(8)] + [2**64 - 1], np.uint64)
#: the fingerprint function of the stored filters: 2 = :func:`hash_bytes`; 1 (stores
#: written before it) = xxh3-64 of the id xor that of the key, whose filters are rebuilt
#: when they are read (:meth:`ColumnarDedup.from_wire`)
FINGERPRINTS = 2


def hash_bytes(
    arr: pa.Array | pa.ChunkedArray | Sequence[Any], seed: np.uint64 = ID_SEED
) -> np.ndarray:
    """A 64-bit hash of each string or bytes value, in whole-array numpy passes (no Python
    call per value): the values' bytes read 8 at a time from the Arrow buffer, each word
    mixed in (xor, multiply, shift), the length first and murmur3's finaliser last. A
    stable function of the bytes (stored filters depend on it), not a cryptographic one:
    the exact ids decide every "maybe" (module docstring)."""
    if not isinstance(arr, (pa.Array, pa.ChunkedArray)):
        arr = pa.array(
            list(arr), pa.binary() if len(arr) and isinstance(arr[0], bytes) else pa.string()
        )
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if n == 0:
        return np.empty(0, np.uint64)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    width = 8 if large else 4
    bufs = arr.buffers()
    offsets = np.frombuffer(
        bufs[1], np.int64 if large else np.int32, n + 1, arr.offset * width
    ).astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.zeros(
        hi - lo + 8, np.uint8
    )  # 8 bytes of padding: a word read at a value's end stays inside
    if hi > lo:
        data[: hi - lo] = np.frombuffer(bufs[2], np.uint8, hi - lo, lo)
    words = np.ndarray(
        (hi - lo + 1,), "<u8", data, 0, (1,)
    )  # the 8 bytes at every byte offset (unaligned reads)
    starts = offsets[:-1] - lo
    lens = offsets[1:] - offsets[:-1]
    h = (lens.astype(np.uint64) * _GOLDEN) ^ seed
    rows = np.flatnonzero(lens > 0)
    j = 0
    while len(rows):
        rem = lens[rows] - j
        w = (
            words[starts[rows] + j] & _TAIL[np.minimum(rem, 8)]
        )  # bytes past the value's end count as zeros
        x = (h[rows] ^ w) * _GOLDEN
        h[rows] = x ^ (x >> _S29)
        j += 8
        rows = rows[rem > 8]
    h ^= h >> _S33
    h *= _FMIX1
    h ^= h >> _S33
    h *= _FMIX2
    h ^= h >> _S33
    return h


def _as_ids(ids: Sequence[str] | pa.Array) -> pa.Array:
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if isinstance(ids, pa.Array):
        return ids.cast(pa.string()) if ids.type != pa.string() else ids
    return pa.array(list(ids), pa.string())


def fingerprints(
    ids: Sequence[str] | pa.Array,
    kbs: Sequence[bytes] | None,
    codes: np.ndarray | None = None,
    uniques: Sequence[bytes] | None = None,
) -> np.ndarray:
    """uint64 fingerprints of ``(id, encoded key)`` pairs: :func:`hash_bytes` of the id xor
    that of the key (``codes``/``uniques``: the keys already factorized, ``kbs[i] == uniques[codes[i]]``)."""
    fp = hash_bytes(_as_ids(ids))
    if codes is None or uniques is None:
        codes, uniques = factorize(kbs or [])
    return fp ^ hash_bytes(pa.array(list(uniques), pa.binary()), KEY_SEED)[codes]


def bloom_size(capacity: int, fpr: float) -> tuple[int, int]:
    """Bits and hash count of a Bloom filter for ``capacity`` items at false-positive rate ``fpr``."""
    n = max(1, capacity)
    m = max(64, math.ceil(-n * math.log(fpr) / (math.log(2) ** 2)))
    m = (m + 63) // 64 * 64
    k = max(1, round(m / n * math.log(2)))
    return m, k


def _positions(fps: np.ndarray, m: int, k: int) -> np.ndarray:
    """The ``(n, k)`` bit positions of fingerprints (Kirsch-Mitzenmacher double hashing)."""
    h1 = fps & _MASK32
    h2 = (fps >> np.uint64(32)) | np.uint64(1)
    steps = np.arange(k, dtype=np.uint64)
    # each 32-bit hash mapped onto [0, m) by a multiply and a shift (Lemire's "fastrange"), not a modulo
    return (((h1[:, None] + steps[None, :] * h2[:, None]) & _MASK32) * np.uint64(m)) >> np.uint64(
        32
    )


class ColumnarDedup:
    """Record ids seen, with their key and timestamp, behind a Bloom filter; see the module docstring.

    Rows are kept sorted by key (``kix``: an index into ``keys``, the encoded keys), each
    key's in insertion order: a "maybe" compares the id with that key's ids only. The ids
    themselves are not moved when rows are: they are appended in chunks and each row points
    at its id (``ptr``). The stored form (:meth:`to_wire`: segments of Arrow IPC, zstd in
    the store, plain in files) keeps the keys once per segment, the rows sorted by key.
    """

    __slots__ = (
        "ids",
        "ptr",
        "kix",
        "ts",
        "fps",
        "seg",
        "segs",
        "refs",
        "retired",
        "keys",
        "key_index",
        "bits",
        "m",
        "k",
        "capacity",
        "fpr",
        "fixed",
    )

    def __init__(self, fpr: float = 0.01, capacity: int | None = None) -> None:
        #: the ids in the order they were added (chunks appended, never reordered) and each
        #: row's place in them: rows are sorted by key, the ids are not moved to follow
        self.ids = pa.chunked_array([], pa.string())
        self.ptr = np.empty(0, np.int64)
        self.kix = np.empty(0, np.int32)
        self.ts = np.empty(0, np.int64)
        #: each row's fingerprint (:func:`fingerprints`), kept in memory once known (not
        #: stored; ``None`` after a store is read, until a rebuilt filter needs them): a
        #: rebuilt filter and a "maybe" then need no hashing
        self.fps: np.ndarray | None = np.empty(0, np.uint64)
        #: each row's segment (an index into ``segs``) and the segments: (rows, their stored
        #: form ``[ipc bytes, keys]`` or ``None`` until :meth:`to_wire` encodes them);
        #: ``segs`` ``None``: one segment, not encoded
        self.seg = np.empty(0, np.int32)
        self.segs: list[tuple[int, list[Any] | None]] | None = []
        #: the segment files (``_colsegments.py``) the stored form names, and those it no
        #: longer names, with the batch that dropped them: ``[batch or None, uri]``
        self.refs: set[str] = set()
        self.retired: list[list[Any]] = []
        self.keys: list[bytes] = []
        self.key_index: dict[bytes, int] = {}
        self.fpr = fpr
        self.fixed = capacity is not None
        self.capacity = capacity or 0
        self.m, self.k = 0, 0
        self.bits = np.zeros(0, np.bool_)
        if self.fixed:
            self._rebuild(np.empty(0, np.uint64))

    def __len__(self) -> int:
        return len(self.ts)

    def copy(self) -> ColumnarDedup:
        """A copy that changes independently (what ``admit`` and ``collect`` change in place is copied)."""
        c = ColumnarDedup.__new__(ColumnarDedup)
        c.ids, c.kix, c.ts, c.m, c.k, c.capacity, c.fpr, c.fixed = (
            self.ids,
            self.kix,
            self.ts,
            self.m,
            self.k,
            self.capacity,
            self.fpr,
            self.fixed,
        )
        c.ptr, c.fps, c.seg, c.segs = (
            self.ptr,
            self.fps,
            self.seg,
            None if self.segs is None else list(self.segs),
        )
        c.refs, c.retired = set(self.refs), list(self.retired)
        c.keys, c.key_index, c.bits = list(self.keys), dict(self.key_index), self.bits.copy()
        return c

    def _kix_of(self, codes: np.ndarray, uniques: Sequence[bytes]) -> np.ndarray:
        """Key indexes of the keys ``uniques[codes]`` (new keys are added to the key table)."""
        index = self.key_index
        for kb in uniques:
            if kb not in index:
                index[kb] = len(self.keys)
                self.keys.append(kb)
        return np.fromiter(map(index.__getitem__, uniques), np.int32, len(uniques))[codes]

    # -- checking ------------------------------------------------------------------
    def admit(
        self,
        ids: Sequence[str] | pa.Array,
        kbs: Sequence[bytes] | None,
        timestamps: Sequence[int] | np.ndarray,
        stats: DedupStats | None = None,
        fps: np.ndarray | None = None,
        codes: np.ndarray | None = None,
        uniques: Sequence[bytes] | None = None,
    ) -> np.ndarray:
        """Which ``(id, key)`` pairs are new (a bool array); the new ones are remembered
        with their timestamp. A pair repeated in the batch is new only the first time."""
        n = len(ids)
        if n == 0:
            return np.zeros(0, np.bool_)
        stats = stats if stats is not None else DedupStats()
        ids = _as_ids(ids)
        if codes is None or uniques is None:
            codes, uniques = factorize(kbs or [])
        if fps is None:
            fps = fingerprints(ids, None, codes, uniques)
        kix = self._kix_of(codes, uniques)
        keep = np.ones(n, np.bool_)
        # repeats inside the batch: equal fingerprints, then the exact pair
        srt = np.sort(fps)
        same = srt[1:] == srt[:-1]
        if same.any():
            seen: set[tuple[str, int]] = set()
            suspects = np.unique(srt[1:][same])
            rows = np.flatnonzero(np.isin(fps, suspects))
            for i, rid, k in zip(
                rows.tolist(), ids.take(pa.array(rows)).to_pylist(), kix[rows].tolist(), strict=True
            ):
                pair = (rid, k)
                if pair in seen:
                    keep[i] = False
                else:
                    seen.add(pair)
        pos = None
        if len(self.ts):
            pos = _positions(fps, self.m, self.k)
            maybe = self.bits[pos].all(axis=1) & keep
            if maybe.any():
                idx = np.flatnonzero(maybe)
                stats.bloom_maybe += len(idx)
                if self.fps is None:
                    self._check_ids(ids, kix, idx, keep, stats, np.ones(len(idx), np.bool_))
                else:
                    self._check_maybes(ids, kix, fps, idx, keep, stats)
        self._insert(ids, kix, np.asarray(timestamps, np.int64), fps, keep, pos)
        return keep

    def _check_maybes(
        self,
        ids: pa.Array,
        kix: np.ndarray,
        fps: np.ndarray,
        idx: np.ndarray,
        keep: np.ndarray,
        stats: DedupStats,
    ) -> None:
        """Decide the Bloom filter's "maybe"s ``idx``: a pair is a duplicate only if its key
        holds the same id. The held rows of their keys (each key's rows one run of the
        sorted ``kix``) are compared by fingerprint first, in one ``isin``; only a pair whose
        fingerprint its key's rows hold is compared as ids (a 64-bit fingerprint equal for
        two ids is rare, a re-delivery is not)."""
        k_of = kix[idx]
        ks, first = np.unique(k_of, return_index=True)
        lo = np.searchsorted(self.kix, ks, "left")
        hi = np.searchsorted(self.kix, ks, "right")
        lens = hi - lo
        # the held rows of the asked keys: lo[j] .. hi[j] for each key j, in one gather
        rows = np.repeat(lo - np.r_[0, np.cumsum(lens)[:-1]], lens) + np.arange(int(lens.sum()))
        cand = np.isin(fps[idx], self._fps()[rows])
        self._check_ids(ids, kix, idx, keep, stats, cand)

    def _check_ids(
        self,
        ids: pa.Array,
        kix: np.ndarray,
        idx: np.ndarray,
        keep: np.ndarray,
        stats: DedupStats,
        cand: np.ndarray,
    ) -> None:
        """Compare the ids of the "maybe"s ``idx[cand]`` with those their keys hold (the
        others are false positives)."""
        stats.bloom_false_positive += int((~cand).sum())
        if not cand.any():
            return
        idx = idx[cand]
        k_of = kix[idx]
        ks = np.unique(k_of)
        lo = np.searchsorted(self.kix, ks, "left")
        hi = np.searchsorted(self.kix, ks, "right")
        spans = list(zip(lo.tolist(), hi.tolist(), strict=True))
        held = self.ids.take(
            pa.array(np.concatenate([self.ptr[a:b] for a, b in spans]))
        ).to_pylist()
        kept_ids: dict[int, set[str]] = {}
        at = 0
        for k, (a, b) in zip(ks.tolist(), spans, strict=True):
            kept_ids[k] = set(held[at : at + b - a])
            at += b - a
        asked = ids.take(pa.array(idx)).to_pylist()
        for i, rid, k in zip(idx.tolist(), asked, k_of.tolist(), strict=True):
            if rid in kept_ids[k]:
                keep[i] = False
            else:
                stats.bloom_false_positive += 1

    # -- writing -------------------------------------------------------------------
    def _insert(
        self,
        ids: pa.Array,
        kix: np.ndarray,
        ts: np.ndarray,
        fps: np.ndarray,
        keep: np.ndarray,
        pos: np.ndarray | None = None,
    ) -> None:
        """Add the rows ``keep``; ``pos``: the bit positions of ``fps`` in the filter as it is."""
        if keep.all():
            new_ids, new_kix, new_ts, new_fps = ids, kix, ts, fps
        else:
            sel = np.flatnonzero(keep)
            if not len(sel):
                return
            new_ids = ids.take(pa.array(sel))
            new_kix, new_ts, new_fps = kix[sel], ts[sel], fps[sel]
            pos = None if pos is None else pos[sel]
        base = len(self.ts)
        o = np.argsort(new_kix, kind="stable")
        at = np.searchsorted(self.kix, new_kix[o], "right")
        # the merged order: old rows in place, new rows after their key's
        perm = np.insert(np.arange(base, dtype=np.int64), at, o.astype(np.int64) + base)
        added = len(self.ids)
        self.ids = pa.chunked_array([*self.ids.chunks, new_ids], pa.string())
        if self.ids.num_chunks > 32:
            self.ids = pa.chunked_array([self.ids.combine_chunks()])
        self.ptr = np.concatenate(
            [self.ptr, np.arange(added, added + len(new_kix), dtype=np.int64)]
        )[perm]
        self.kix = np.concatenate([self.kix, new_kix])[perm]
        self.ts = np.concatenate([self.ts, new_ts])[perm]
        if self.fps is not None:
            self.fps = np.concatenate([self.fps, new_fps])[perm]
        if (
            self.segs is not None
        ):  # the new ids: a segment of their own, encoded by the next to_wire
            self.segs.append((len(new_kix), None))
        self.seg = np.concatenate(
            [self.seg, np.full(len(new_kix), len(self.segs or ()) - 1, np.int32)]
        )[perm]
        if not self.fixed and len(self.ts) > self.capacity:
            self._rebuild(self._fps())
        else:
            self.bits[(_positions(new_fps, self.m, self.k) if pos is None else pos).ravel()] = True

    def _ids_of(self, rows: np.ndarray) -> tuple[pa.ChunkedArray, np.ndarray]:
        """The ids of rows ``rows``, as a new ``(ids, ptr)`` pair holding only them."""
        return pa.chunked_array(
            [self.ids.take(pa.array(self.ptr[rows])).combine_chunks()], pa.string()
        ), np.arange(len(rows), dtype=np.int64)

    def _fps(self) -> np.ndarray:
        """:attr:`fps`, hashed from the ids if not known."""
        if self.fps is None:
            self.fps = self._fingerprints()
        return self.fps

    def _fingerprints(self) -> np.ndarray:
        """Fingerprints of every kept id, from the ids themselves (a store read back)."""
        if not len(self.ts):
            return np.empty(0, np.uint64)
        return (
            hash_bytes(self.ids)[self.ptr]
            ^ hash_bytes(pa.array(self.keys, pa.binary()), KEY_SEED)[self.kix]
        )

    def _rebuild(self, fps: np.ndarray) -> None:
        """A filter over ``fps`` (sized to twice the ids unless the capacity is fixed)."""
        if not self.fixed:
            self.capacity = max(64, 2 * len(self.ts))
        self.m, self.k = bloom_size(self.capacity, self.fpr)
        self.bits = np.zeros(self.m, np.bool_)
        if len(fps):
            self.bits[_positions(fps, self.m, self.k).ravel()] = True

    def collect(
        self,
        horizon: int,
        gc_interval_ms: int,
        stats: DedupStats | None = None,
        keys: Sequence[bytes] | None = None,
    ) -> None:
        """Collect ids older than ``horizon`` of each key (of ``keys``, default all) whose
        oldest id is more than ``gc_interval_ms`` behind it: the per-record rule
        (``DedupIndex.finish``), applied to the keys a batch stepped."""
        if not len(self.ts) or horizon <= int(self.ts.min()) + gc_interval_ms:
            return
        stats = stats if stats is not None else DedupStats()
        # each key's rows are one run of the sorted ``kix``
        starts = np.flatnonzero(np.r_[True, self.kix[1:] != self.kix[:-1]])
        run_keys = self.kix[starts]
        mins = np.minimum.reduceat(self.ts, starts)
        due = mins + gc_interval_ms < horizon
        if keys is not None:
            scope = np.zeros(len(self.keys), np.bool_)
            scope[[self.key_index[kb] for kb in keys if kb in self.key_index]] = True
            due &= scope[run_keys]
        if not due.any():
            return
        stats.gc_runs += int(due.sum())
        triggered = np.zeros(len(self.keys), np.bool_)
        triggered[run_keys[due]] = True
        drop = triggered[self.kix] & (self.ts < horizon)
        if not drop.any():
            return
        kept = ~drop
        stats.ids_collected += int(drop.sum())
        fps = self._fps()[kept]  # of the rows as they are, before the ids are rewritten
        self.ids, self.ptr = self._ids_of(np.flatnonzero(kept))
        self.kix, self.ts, self.fps = self.kix[kept], self.ts[kept], fps
        self.seg, self.segs = np.zeros(len(self.ts), np.int32), None  # rewritten as one segment
        self._compact_keys()
        self._rebuild(self.fps)

    def _compact_keys(self) -> None:
        """Drop keys without ids from the key table."""
        kix = self.kix  # sorted: each key's rows are one run
        used = kix[np.r_[True, kix[1:] != kix[:-1]]] if len(kix) else kix
        if len(used) == len(self.keys):
            return
        remap = np.full(len(self.keys), -1, np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        self.kix = remap[self.kix]
        self.keys = [self.keys[i] for i in used.tolist()]
        self.key_index = {kb: i for i, kb in enumerate(self.keys)}

    def keys_with_ids(self, keys: Sequence[bytes]) -> set[bytes]:
        """Which of ``keys`` have ids kept."""
        if not len(self.ts) or not keys:
            return set()
        present = np.zeros(len(self.keys), np.bool_)
        present[self.kix] = True
        return {kb for kb in keys if kb in self.key_index and present[self.key_index[kb]]}

    # -- moving keys (``millwheel rescale``) ----------------------------------------
    def empty_like(self) -> ColumnarDedup:
        """An empty index with this one's Bloom settings."""
        return ColumnarDedup(self.fpr, self.capacity if self.fixed else None)

    def split(self, targets: Sequence[int]) -> dict[int, ColumnarDedup]:
        """The ids of key ``self.keys[i]`` go to the index of ``targets[i]``: one index per
        target that gets ids, each with its own filter (a rescale moves keys between key
        intervals, MillWheel §7.1; each key's ids move with it, so dedup stays per key)."""
        if not len(self.ts):
            return {}
        to = np.asarray(targets, np.int64)[self.kix]
        out: dict[int, ColumnarDedup] = {}
        for t in np.unique(to).tolist():
            sel = to == t
            d = self.empty_like()
            d.ids, d.ptr = self._ids_of(np.flatnonzero(sel))
            d.kix, d.ts, d.fps = self.kix[sel], self.ts[sel], self._fps()[sel]
            d.seg, d.segs = np.zeros(len(d.ts), np.int32), None
            d.keys, d.key_index = list(self.keys), dict(self.key_index)
            d._compact_keys()
            d._rebuild(d.fps)
            out[t] = d
        return out

    @classmethod
    def merge(cls, parts: Sequence[ColumnarDedup]) -> ColumnarDedup:
        """One index of ``parts``, which hold disjoint keys (what :meth:`split` gave several
        key intervals for one new interval); the first part's Bloom settings."""
        if not parts:
            return cls()
        out = parts[0].empty_like()
        full = [p for p in parts if len(p.ts)]
        if not full:
            return out
        keys: list[bytes] = []
        kix: list[np.ndarray] = []
        for p in full:
            kix.append(
                p.kix + len(keys)
            )  # each part's rows are sorted by key index: so is the concatenation
            keys.extend(p.keys)
        if len(set(keys)) != len(keys):
            msg = "the dedup indexes to merge hold ids of the same key: they are not disjoint key intervals"
            raise ValueError(msg)
        out.ids = pa.chunked_array(
            [p._ids_of(np.arange(len(p)))[0].combine_chunks() for p in full], pa.string()
        )
        out.ptr = np.arange(len(out.ids), dtype=np.int64)
        out.kix = np.concatenate(kix).astype(np.int32)
        out.ts = np.concatenate([p.ts for p in full])
        out.fps = np.concatenate(
            [p._fps() for p in full]
        )  # a fingerprint is of the id and the key's bytes: the same in any index
        out.seg, out.segs = np.zeros(len(out.ts), np.int32), None
        out.keys, out.key_index = keys, {kb: i for i, kb in enumerate(keys)}
        out._rebuild(out.fps)
        return out

    # -- storage -------------------------------------------------------------------
    def to_wire(self, files: SegmentFiles | None = None) -> list[Any] | None:
        """The stored form: the ids in segments, each encoded once (Arrow IPC: ids, key
        indexes, timestamps; rows sorted by key; :meth:`_encode_segment`), and the filter's bits.

        A batch's new ids become a segment of their own; once :data:`SEGMENTS_PER_TIER`
        segments of about the same size (within a factor of 4) follow each other they are
        re-encoded as one, so an id is re-encoded about log4(batches) times, not in every
        batch; garbage collection and a rescale's split or merge rewrite them as one.
        Reading several segments back costs a merge of sorted runs. ``files``: new segments
        go to files, named by URI (``_colsegments.py``: the store's row then carries no ids);
        files no longer named are deleted once the state store's history is past them."""
        if len(self.ts):
            self._compact_keys()
            if self.segs is None:
                self.seg, self.segs = np.zeros(len(self.ts), np.int32), [(len(self.ts), None)]
            self._tier()
            for i, (n, data) in enumerate(self.segs):
                if data is None:
                    data = self._encode_segment(
                        np.flatnonzero(self.seg == i), compress=files is None
                    )
                    self.segs[i] = (n, data if files is None else [files.put(data[0]), data[1]])
        refs = (
            {d[0] for _, d in self.segs or () if d is not None and isinstance(d[0], str)}
            if len(self.ts)
            else set()
        )
        dropped = self.refs - refs
        self.retired = (
            files.collect(self.retired, dropped)
            if files is not None
            else [*self.retired, *([None, u] for u in dropped)]
        )
        self.refs = refs
        if not len(self.ts) and not self.retired:
            return None
        stored = [d for _, d in self.segs or ()] if len(self.ts) else []
        return [
            stored,
            None,
            np.packbits(self.bits).tobytes(),
            self.m,
            self.k,
            self.capacity,
            self.fpr,
            self.fixed,
            FINGERPRINTS,
            self.retired,
        ]

    def _tier(self) -> None:
        """Merge the last :data:`SEGMENTS_PER_TIER` segments while they are of one size tier:
        the oldest of them at most 4 times the newest (older segments are the larger ones)."""
        segs = self.segs
        assert segs is not None
        t = SEGMENTS_PER_TIER
        while len(segs) >= t and segs[-t][0] <= 4 * segs[-1][0]:
            first = len(segs) - t
            self.seg = np.minimum(self.seg, first).astype(np.int32, copy=False)
            segs[first:] = [(sum(n for n, _ in segs[first:]), None)]

    def _encode_segment(self, rows: np.ndarray, compress: bool = True) -> list[Any]:
        """Rows ``rows`` as a segment ``[ipc, keys]``: ids, key indexes into ``keys`` and
        timestamps, sorted by the key's bytes (each key's rows in their order) and ``keys``
        sorted the same way, so that segments read back merge by key in one pass
        (:meth:`from_wire`: a stable sort of sorted runs). (The keys are not an Arrow
        dictionary column: writing one cost more than the rest of the segment.) ``compress``:
        zstd, for a segment kept in the store; one for a file is not (:data:`_IPC_FILE`)."""
        kix = self.kix[rows]  # sorted: rows are kept sorted by key index
        new_key = np.r_[True, kix[1:] != kix[:-1]]
        kbs = [self.keys[i] for i in kix[new_key].tolist()]
        local = (np.cumsum(new_key) - 1).astype(np.int32)
        by_bytes = sorted(range(len(kbs)), key=kbs.__getitem__)
        if any(
            a > b for a, b in zip(by_bytes, by_bytes[1:], strict=False)
        ):  # the key table is not in bytes order (keys added since it was read)
            rank = np.empty(len(kbs), np.int32)
            rank[by_bytes] = np.arange(len(kbs), dtype=np.int32)
            local = rank[local]
            o = np.argsort(local, kind="stable")
            rows, local = rows[o], local[o]
        batch = pa.RecordBatch.from_arrays(
            [self._ids_of(rows)[0].combine_chunks(), pa.array(local), pa.array(self.ts[rows])],
            ["id", "kix", "ts"],
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema, options=_IPC if compress else _IPC_FILE) as w:
            w.write_batch(batch)
        return [sink.getvalue().to_pybytes(), [kbs[i] for i in by_bytes]]

    @classmethod
    def from_wire(
        cls, wire: list[Any] | None, fpr: float = 0.01, capacity: int | None = None
    ) -> ColumnarDedup:
        if wire is None:
            return cls(fpr, capacity)
        stored, keys, bits, m, k, cap, fpr_, fixed = wire[:8]
        version = wire[8] if len(wire) > 8 else 1
        if version not in (1, FINGERPRINTS):
            msg = f"columnar dedup index with fingerprints version {version!r}; this millwheel reads 1 and {FINGERPRINTS}"
            raise ValueError(msg)
        d = cls.__new__(cls)
        d.fpr, d.fixed = fpr_, fixed
        d.m, d.k, d.capacity = m, k, cap
        if (
            version == 1
        ):  # one segment: ids, key indexes into ``keys``, timestamps; a filter of xxh3 fingerprints
            batch = pa.ipc.open_stream(stored).read_next_batch()
            d.ids, d.kix, d.ts = (
                pa.chunked_array([batch.column(0)]),
                batch.column(1).to_numpy(),
                batch.column(2).to_numpy(),
            )
            d.ptr = np.arange(len(d.ts), dtype=np.int64)
            d.keys = list(keys)
            d.key_index = {kb: i for i, kb in enumerate(d.keys)}
            d.seg, d.segs = np.zeros(len(d.ts), np.int32), None
            d.refs, d.retired = set(), []
            d.fps = d._fingerprints()
            d._rebuild(d.fps)  # a version-1 filter is of other fingerprints
            return d
        if not stored:  # no ids held, only files to collect
            d = cls(fpr_, cap if fixed else None)
            d.retired = list(wire[9])
            return d
        batches = [
            pa.ipc.open_stream(
                read_segment(data) if isinstance(data, str) else data
            ).read_next_batch()
            for data, _ in stored
        ]
        dicts = [list(keys) for _, keys in stored]
        d.keys = (
            sorted(set().union(*dicts)) if len(dicts) > 1 else dicts[0]
        )  # every segment's keys, by their bytes
        d.key_index = {kb: i for i, kb in enumerate(d.keys)}
        ids, kix, ts, seg = [], [], [], []
        for i, (batch, keys) in enumerate(zip(batches, dicts, strict=True)):
            to_global = np.fromiter(map(d.key_index.__getitem__, keys), np.int32, len(keys))
            ids.append(batch.column(0))
            kix.append(
                to_global[batch.column(1).to_numpy()]
            )  # sorted: a segment's keys are sorted by bytes as the table is
            ts.append(batch.column(2).to_numpy())
            seg.append(np.full(batch.num_rows, i, np.int32))
        # by key, each key's rows in segment order (as inserted): the stable sort merges the segments' sorted runs
        o = np.argsort(np.concatenate(kix), kind="stable")
        d.ids, d.ptr = pa.chunked_array(ids, pa.string()), o.astype(np.int64)
        d.kix, d.ts, d.seg = np.concatenate(kix)[o], np.concatenate(ts)[o], np.concatenate(seg)[o]
        d.segs = [(len(t), data) for t, data in zip(ts, stored, strict=True)]
        d.refs = {data[0] for data in stored if isinstance(data[0], str)}
        d.retired = list(wire[9]) if len(wire) > 9 else []
        d.bits = np.unpackbits(np.frombuffer(bits, np.uint8), count=m).astype(np.bool_)
        d.fps = None  # hashed when first needed (a store read back is often stepped without)
        return d


#: how many segments of one size tier (``to_wire``) are kept before they are re-encoded as one
SEGMENTS_PER_TIER = 4
#: ids, keys and timestamps compress well; zstd at level 1 stores ids a third smaller than LZ4
_IPC = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))
#: a segment for a file (``_colsegments.py``): plain (6,000 ids: zstd ~380/350 us to write/read, plain ~19/8)
_IPC_FILE = pa.ipc.IpcWriteOptions()


def chunk_stamps(
    kbs: Sequence[bytes] | None,
    ts: np.ndarray,
    gc_interval_ms: int,
    codes: np.ndarray | None = None,
) -> np.ndarray:
    """The timestamp each new id is kept under, as the per-record path keeps it
    (``_envelope._chunks``): the newest timestamp among the same key's ids of the batch in
    its ``gc_interval_ms`` bucket (``codes``: the keys already factorized)."""
    n = len(ts)
    if n == 0:
        return ts
    width = max(1, gc_interval_ms)
    bucket = ts // width
    if codes is None:
        codes, _ = pd.factorize(pd.Series(kbs, dtype=object))
    b0, b1 = int(bucket.min()), int(bucket.max())
    if b0 == b1:
        group = codes
    else:
        _, group = np.unique(
            np.stack([codes.astype(np.int64), bucket - b0]), axis=1, return_inverse=True
        )
        group = group.ravel()
    top = np.full(int(group.max()) + 1, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(top, group, ts)
    return top[group]
