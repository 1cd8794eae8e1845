"""Vectorised exactly-once dedup for columnar computations (MillWheel §6.1.1, issue 26).

The per-record path (``_envelope.DedupIndex``) keeps one id list and one Bloom filter per
key. A columnar computation keeps one :class:`ColumnarDedup` per key interval (the
harness: per computation) and checks a whole micro-batch in a few numpy calls:

1. **fingerprints** of every ``(key, id)`` pair: xxh3-64 of the id (the per-record
   path's :func:`~millwheel._bloom.fingerprint`) mixed with the key's hash (computed once
   per distinct key), so two keys never share a decision — dedup stays per key (§6.1.1);
2. **Bloom check** over a bit array (double hashing, ``k`` positions a fingerprint) for
   the whole batch in one fancy-indexing call; a "no" is final;
3. a **"maybe"** is looked up in the sorted fingerprints (``np.searchsorted``), and only
   a fingerprint that matches is compared with the exact ``(id, key)`` kept: a Bloom or
   fingerprint false positive never drops a record;
4. **insert**: ids appended (Arrow arrays), fingerprints merged into the sorted array,
   their bits set in one call; the filter is rebuilt from the fingerprints when the ids
   outgrow its capacity, or after garbage collection.

Ids are kept while their timestamp is ``>= horizon`` (``low watermark - slack_ms``), as in
the per-record path, but collected by their own timestamp rather than by the newest of a
step's chunk: collection happens at the same moments (when the oldest id is more than
``gc_interval_ms`` behind the horizon), and may drop an id up to ``gc_interval_ms``
earlier. Such an id is behind the watermark by more than ``slack_ms``, so a re-delivery
of it is late either way.

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
import pyarrow.compute as pc
import xxhash

from millwheel._envelope import DedupStats

_digest = xxhash.xxh3_64_intdigest
_encode = str.encode
_MASK32 = np.uint64(0xFFFFFFFF)


def fingerprints(ids: Sequence[str], kbs: Sequence[bytes], codes: np.ndarray | None = None, uniques: Sequence[bytes] | None = None) -> np.ndarray:
    """uint64 fingerprints of ``(id, encoded key)`` pairs: xxh3-64 of the id xor that of the key
    (``codes``/``uniques``: the keys already factorized, ``kbs[i] == uniques[codes[i]]``)."""
    fp = np.fromiter(map(_digest, map(_encode, ids)), np.uint64, len(ids))
    if codes is not None and uniques is not None:
        return fp ^ np.fromiter(map(_digest, uniques), np.uint64, len(uniques))[codes]
    keys = {kb: _digest(kb) for kb in set(kbs)}
    if len(keys) == 1:
        return fp ^ np.uint64(next(iter(keys.values())))
    return fp ^ np.fromiter(map(keys.__getitem__, kbs), np.uint64, len(kbs))


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
    return (h1[:, None] + steps[None, :] * h2[:, None]) % np.uint64(m)


class ColumnarDedup:
    """Record ids seen, with their key and timestamp, behind a Bloom filter; see the module docstring."""

    __slots__ = ("ids", "kbs", "ts", "sfp", "order", "bits", "m", "k", "capacity", "fpr", "fixed")

    def __init__(self, fpr: float = 0.01, capacity: int | None = None) -> None:
        self.ids = pa.array([], pa.string())
        self.kbs = pa.array([], pa.binary())
        self.ts = np.empty(0, np.int64)
        #: fingerprints, sorted; ``order[i]``: the row (insertion order) of ``sfp[i]``
        self.sfp = np.empty(0, np.uint64)
        self.order = np.empty(0, np.int64)
        self.fpr = fpr
        self.fixed = capacity is not None
        self.capacity = capacity or 0
        self.m, self.k = 0, 0
        self.bits = np.zeros(0, np.bool_)
        if self.fixed:
            self._rebuild()

    def __len__(self) -> int:
        return len(self.ts)

    # -- checking ------------------------------------------------------------------
    def admit(
        self, ids: Sequence[str], kbs: Sequence[bytes], timestamps: Sequence[int] | np.ndarray,
        stats: DedupStats | None = None, fps: np.ndarray | None = None,
    ) -> np.ndarray:  # fmt: skip
        """Which ``(id, key)`` pairs are new (a bool array); the new ones are remembered
        with their timestamp. A pair repeated in the batch is new only the first time."""
        n = len(ids)
        if n == 0:
            return np.zeros(0, np.bool_)
        stats = stats if stats is not None else DedupStats()
        if fps is None:
            fps = fingerprints(ids, kbs)
        keep = np.ones(n, np.bool_)
        # repeats inside the batch: equal fingerprints, then the exact pair
        srt = np.sort(fps)
        same = srt[1:] == srt[:-1]
        if same.any():
            seen: set[tuple[str, bytes]] = set()
            suspects = set(srt[1:][same].tolist())
            for i in np.flatnonzero(np.isin(fps, np.fromiter(suspects, np.uint64, len(suspects)))).tolist():
                pair = (ids[i], kbs[i])
                if pair in seen:
                    keep[i] = False
                else:
                    seen.add(pair)
        if len(self.ts):
            pos = _positions(fps, self.m, self.k)
            maybe = self.bits[pos].all(axis=1) & keep
            if maybe.any():
                idx = np.flatnonzero(maybe)
                stats.bloom_maybe += len(idx)
                cand = fps[idx]
                lo = np.searchsorted(self.sfp, cand, "left")
                hi = np.searchsorted(self.sfp, cand, "right")
                for i, a, b in zip(idx.tolist(), lo.tolist(), hi.tolist(), strict=True):
                    hit = False
                    for row in self.order[a:b].tolist():
                        if self.ids[row].as_py() == ids[i] and self.kbs[row].as_py() == kbs[i]:
                            hit = True
                            break
                    if hit:
                        keep[i] = False
                    else:
                        stats.bloom_false_positive += 1
        self._insert(ids, kbs, np.asarray(timestamps, np.int64), fps, keep)
        return keep

    # -- writing -------------------------------------------------------------------
    def _insert(self, ids: Sequence[str], kbs: Sequence[bytes], ts: np.ndarray, fps: np.ndarray, keep: np.ndarray) -> None:
        if keep.all():
            new_ids, new_kbs, new_ts, new_fps = ids, kbs, ts, fps
        else:
            sel = np.flatnonzero(keep)
            if not len(sel):
                return
            new_ids = [ids[i] for i in sel.tolist()]
            new_kbs = [kbs[i] for i in sel.tolist()]
            new_ts, new_fps = ts[sel], fps[sel]
        base = len(self.ts)
        self.ids = pa.concat_arrays([self.ids, pa.array(new_ids, pa.string())])
        self.kbs = pa.concat_arrays([self.kbs, pa.array(new_kbs, pa.binary())])
        self.ts = np.concatenate([self.ts, new_ts])
        o = np.argsort(new_fps, kind="stable")
        sorted_new = new_fps[o]
        at = np.searchsorted(self.sfp, sorted_new, "right")
        self.sfp = np.insert(self.sfp, at, sorted_new)
        self.order = np.insert(self.order, at, o.astype(np.int64) + base)
        if not self.fixed and len(self.ts) > self.capacity:
            self._rebuild()
        else:
            self.bits[_positions(sorted_new, self.m, self.k).ravel()] = True

    def _rebuild(self) -> None:
        """A filter over every kept fingerprint (sized to twice the ids unless the capacity is fixed)."""
        if not self.fixed:
            self.capacity = max(64, 2 * len(self.ts))
        self.m, self.k = bloom_size(self.capacity, self.fpr)
        self.bits = np.zeros(self.m, np.bool_)
        if len(self.sfp):
            self.bits[_positions(self.sfp, self.m, self.k).ravel()] = True

    def collect(self, horizon: int, gc_interval_ms: int, stats: DedupStats | None = None, keys: Sequence[bytes] | None = None) -> None:
        """Collect ids older than ``horizon`` of each key (of ``keys``, default all) whose
        oldest id is more than ``gc_interval_ms`` behind it: the per-record rule
        (``DedupIndex.finish``), applied to the keys a batch stepped."""
        if not len(self.ts) or horizon <= int(self.ts.min()) + gc_interval_ms:
            return
        stats = stats if stats is not None else DedupStats()
        scope = np.ones(len(self.ts), np.bool_) if keys is None else pc.is_in(self.kbs, value_set=pa.array(list(keys), pa.binary())).to_numpy(zero_copy_only=False)
        if not scope.any():
            return
        t = pa.table({"kb": self.kbs.filter(pa.array(scope)), "ts": self.ts[scope]})
        mins = t.group_by("kb").aggregate([("ts", "min")])
        due = pc.less(pc.add(mins.column("ts_min"), gc_interval_ms), horizon)
        triggered = mins.column("kb").filter(due)
        if not len(triggered):
            return
        stats.gc_runs += len(triggered)
        drop = pc.is_in(self.kbs, value_set=triggered.combine_chunks()).to_numpy(zero_copy_only=False) & (self.ts < horizon)
        if not drop.any():
            return
        kept = ~drop
        stats.ids_collected += int(drop.sum())
        sel = pa.array(np.flatnonzero(kept))
        fps = np.empty(len(self.ts), np.uint64)
        fps[self.order] = self.sfp  # insertion order
        self.ids, self.kbs = self.ids.take(sel), self.kbs.take(sel)
        self.ts, fps = self.ts[kept], fps[kept]
        self.order = np.argsort(fps, kind="stable").astype(np.int64)
        self.sfp = fps[self.order]
        self._rebuild()

    def keys_with_ids(self, keys: Sequence[bytes]) -> set[bytes]:
        """Which of ``keys`` have ids kept."""
        if not len(self.ts) or not keys:
            return set()
        mask = pc.is_in(self.kbs, value_set=pa.array(list(keys), pa.binary()))
        return set(pc.unique(self.kbs.filter(mask)).to_pylist())


    # -- storage -------------------------------------------------------------------
    def to_wire(self) -> list[Any] | None:
        if not len(self.ts):
            return None
        batch = pa.RecordBatch.from_arrays([self.ids, self.kbs], ["id", "key"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        return [
            sink.getvalue().to_pybytes(), self.ts.tobytes(), self.sfp.tobytes(), self.order.tobytes(),
            np.packbits(self.bits).tobytes(), self.m, self.k, self.capacity, self.fpr, self.fixed,
        ]  # fmt: skip

    @classmethod
    def from_wire(cls, wire: list[Any] | None, fpr: float = 0.01, capacity: int | None = None) -> ColumnarDedup:
        if wire is None:
            return cls(fpr, capacity)
        ipc, ts, sfp, order, bits, m, k, cap, fpr_, fixed = wire
        d = cls(fpr_, cap if fixed else None)
        batch = pa.ipc.open_stream(ipc).read_next_batch()
        d.ids, d.kbs = batch.column(0), batch.column(1)
        d.ts = np.frombuffer(ts, np.int64).copy()
        d.sfp = np.frombuffer(sfp, np.uint64).copy()
        d.order = np.frombuffer(order, np.int64).copy()
        d.m, d.k, d.capacity = m, k, cap
        d.bits = np.unpackbits(np.frombuffer(bits, np.uint8), count=m).astype(np.bool_)
        return d


def chunk_stamps(kbs: Sequence[bytes], ts: np.ndarray, gc_interval_ms: int, codes: np.ndarray | None = None) -> np.ndarray:
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
        _, group = np.unique(np.stack([codes.astype(np.int64), bucket - b0]), axis=1, return_inverse=True)
        group = group.ravel()
    top = np.full(int(group.max()) + 1, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(top, group, ts)
    return top[group]
