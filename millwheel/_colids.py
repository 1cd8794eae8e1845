"""The ids a columnar dedup index holds, and its two operations per batch (MillWheel §6.1.1).

:class:`HeldIds` (the in-memory part of ``_coldedup.ColumnarDedup``) checks a whole
micro-batch of ``(key, id)`` pairs in a few numpy calls, the admission rule of the delivery
contract (``_contract.py``) over columns:

1. **fingerprints** of every pair (``_colhash.fingerprints``), so two keys never share a decision;
2. **Bloom check** over a bit array for the whole batch in one fancy-indexing call; a "no" is final;
3. a **"maybe"** is compared with the exact ids kept for its key (the rows are sorted by
   key: two ``np.searchsorted`` calls find them): a Bloom false positive never drops a record;
4. **insert**: ids (an Arrow array) merged after their key's, their bits set in one call;
   the filter is rebuilt from the ids when they outgrow its capacity, or after garbage
   collection;

and **collects** ids behind the horizon, per key, at the per-record path's moments (:meth:`HeldIds.collect`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from millwheel._colhash import (
    KEY_SEED,
    as_ids,
    bloom_positions,
    bloom_size,
    fingerprints,
    hash_bytes,
)
from millwheel._colinput import factorize
from millwheel._envelope import DedupStats


class HeldIds:
    """Record ids seen, with their key and timestamp, behind a Bloom filter; see the module docstring.
    (:class:`~millwheel._coldedup.ColumnarDedup` adds its stored form and moves between key intervals.)

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
        #: each row's fingerprint (:func:`~millwheel._colhash.fingerprints`), kept in memory once known (not
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
            self.rebuild(np.empty(0, np.uint64))

    def __len__(self) -> int:
        return len(self.ts)

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
        ids = as_ids(ids)
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
            pos = bloom_positions(fps, self.m, self.k)
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
        cand = np.isin(fps[idx], self.all_fps()[rows])
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
            self.rebuild(self.all_fps())
        else:
            self.bits[
                (bloom_positions(new_fps, self.m, self.k) if pos is None else pos).ravel()
            ] = True

    def ids_of(self, rows: np.ndarray) -> tuple[pa.ChunkedArray, np.ndarray]:
        """The ids of rows ``rows``, as a new ``(ids, ptr)`` pair holding only them."""
        return pa.chunked_array(
            [self.ids.take(pa.array(self.ptr[rows])).combine_chunks()], pa.string()
        ), np.arange(len(rows), dtype=np.int64)

    def all_fps(self) -> np.ndarray:
        """:attr:`fps`, hashed from the ids if not known."""
        if self.fps is None:
            self.fps = self.hashed_fps()
        return self.fps

    def hashed_fps(self) -> np.ndarray:
        """Fingerprints of every kept id, from the ids themselves (a store read back)."""
        if not len(self.ts):
            return np.empty(0, np.uint64)
        return (
            hash_bytes(self.ids)[self.ptr]
            ^ hash_bytes(pa.array(self.keys, pa.binary()), KEY_SEED)[self.kix]
        )

    def rebuild(self, fps: np.ndarray) -> None:
        """A filter over ``fps`` (sized to twice the ids unless the capacity is fixed)."""
        if not self.fixed:
            self.capacity = max(64, 2 * len(self.ts))
        self.m, self.k = bloom_size(self.capacity, self.fpr)
        self.bits = np.zeros(self.m, np.bool_)
        if len(fps):
            self.bits[bloom_positions(fps, self.m, self.k).ravel()] = True

    def collect(
        self,
        horizon: int,
        gc_interval_ms: int,
        stats: DedupStats | None = None,
        keys: Sequence[bytes] | None = None,
        exclude: Iterable[bytes] = (),
    ) -> list[bytes]:
        """Collect ids older than ``horizon`` of each key (of ``keys``, default all but
        ``exclude``) whose oldest id is more than ``gc_interval_ms`` behind it: the
        per-record rule (``DedupIndex.finish``), applied to the keys a batch stepped, or
        woke to collect (``_contract.dedup_collect_at``). Returns the keys it collected from."""
        if not len(self.ts) or horizon <= int(self.ts.min()) + gc_interval_ms:
            return []
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
        else:
            out = [self.key_index[kb] for kb in exclude if kb in self.key_index]
            if out:
                scope = np.ones(len(self.keys), np.bool_)
                scope[out] = False
                due &= scope[run_keys]
        if not due.any():
            return []
        stats.gc_runs += int(due.sum())
        triggered = np.zeros(len(self.keys), np.bool_)
        triggered[run_keys[due]] = True
        collected = [self.keys[i] for i in run_keys[due].tolist()]
        drop = triggered[self.kix] & (self.ts < horizon)
        if not drop.any():
            return collected
        kept = ~drop
        stats.ids_collected += int(drop.sum())
        fps = self.all_fps()[kept]  # of the rows as they are, before the ids are rewritten
        self.ids, self.ptr = self.ids_of(np.flatnonzero(kept))
        self.kix, self.ts, self.fps = self.kix[kept], self.ts[kept], fps
        self.seg, self.segs = np.zeros(len(self.ts), np.int32), None  # rewritten as one segment
        self.compact_keys()
        self.rebuild(self.fps)
        return collected

    def compact_keys(self) -> None:
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

    def oldest(self, keys: Iterable[bytes]) -> dict[bytes, int]:
        """The oldest id's timestamp of each of ``keys`` that keeps ids."""
        want = [self.key_index[kb] for kb in keys if kb in self.key_index]
        if not want or not len(self.ts):
            return {}
        starts = np.flatnonzero(np.r_[True, self.kix[1:] != self.kix[:-1]])
        mins = dict(
            zip(
                self.kix[starts].tolist(),
                np.minimum.reduceat(self.ts, starts).tolist(),
                strict=True,
            )
        )
        return {self.keys[i]: mins[i] for i in want if i in mins}

    def keys_with_ids(self, keys: Sequence[bytes]) -> set[bytes]:
        """Which of ``keys`` have ids kept: a binary search of each in the sorted key column,
        so a call costs what it asks, not the ids held (a batch of many arrival watermarks
        asks once per call, ``_colruns.run_in_order``)."""
        if not len(self.ts) or not keys:
            return set()
        index = self.key_index
        asked = [(kb, i) for kb in keys if (i := index.get(kb)) is not None]
        if not asked:
            return set()
        ix = np.fromiter((i for _, i in asked), np.int64, len(asked))
        pos = np.searchsorted(self.kix, ix)
        hit = pos < len(self.kix)
        hit[hit] = self.kix[pos[hit]] == ix[hit]
        return {kb for (kb, _), h in zip(asked, hit.tolist(), strict=True) if h}
