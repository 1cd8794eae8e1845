"""Vectorised exactly-once dedup for columnar computations (MillWheel §6.1.1).

The per-record path (``_dedup.DedupIndex``) keeps one id list and one Bloom filter per
key. A columnar computation keeps one :class:`ColumnarDedup` per key interval (the
harness: per computation) and checks a whole micro-batch in a few numpy calls: the
fingerprints of its ``(key, id)`` pairs (``_colhash.py``), a Bloom check whose "no" is
final, the exact ids of a key for a "maybe", the new ids inserted (``_colids.py``). This
module is the index as it is stored (segments of Arrow IPC, in the store or in files,
``_colsegments.py``) and as a rescale moves it between key intervals.

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

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from millwheel._colhash import FINGERPRINTS
from millwheel._colids import HeldIds
from millwheel._colsegments import SegmentFiles, read_segment


class ColumnarDedup(HeldIds):
    """A columnar dedup index: the ids held and their checks (:class:`~millwheel._colids.HeldIds`),
    their stored form (:meth:`to_wire`: segments of Arrow IPC, zstd in the store, plain in
    files, the keys once per segment, the rows sorted by key) and their moves between key
    intervals (:meth:`split`, :meth:`merge`); see the module docstring."""

    __slots__ = ()

    def copy(self) -> ColumnarDedup:
        """A copy that changes independently (what ``admit`` and ``collect`` change in place is copied)."""
        c = type(self).__new__(type(self))
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
            d.ids, d.ptr = self.ids_of(np.flatnonzero(sel))
            d.kix, d.ts, d.fps = self.kix[sel], self.ts[sel], self.all_fps()[sel]
            d.seg, d.segs = np.zeros(len(d.ts), np.int32), None
            d.keys, d.key_index = list(self.keys), dict(self.key_index)
            d.compact_keys()
            d.rebuild(d.fps)
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
            [p.ids_of(np.arange(len(p)))[0].combine_chunks() for p in full], pa.string()
        )
        out.ptr = np.arange(len(out.ids), dtype=np.int64)
        out.kix = np.concatenate(kix).astype(np.int32)
        out.ts = np.concatenate([p.ts for p in full])
        out.fps = np.concatenate(
            [p.all_fps() for p in full]
        )  # a fingerprint is of the id and the key's bytes: the same in any index
        out.seg, out.segs = np.zeros(len(out.ts), np.int32), None
        out.keys, out.key_index = keys, {kb: i for i, kb in enumerate(keys)}
        out.rebuild(out.fps)
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
            self.compact_keys()
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
            [self.ids_of(rows)[0].combine_chunks(), pa.array(local), pa.array(self.ts[rows])],
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
            d.fps = d.hashed_fps()
            d.rebuild(d.fps)  # a version-1 filter is of other fingerprints
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
