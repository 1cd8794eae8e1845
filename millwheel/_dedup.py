"""One key's record ids, for exactly-once delivery (MillWheel §6.1.1): :class:`DedupIndex`.

A record is delivered exactly once because each key keeps the ids of the records it has
already processed and drops a record whose id it has seen; the ids are collected once
they are older than a horizon past which no duplicate can arrive. The index is part of
the key's envelope (``_envelope.py``, §6.2), written with the state in one operation.

The exact id list is an append-only byte string of msgpack chunks ``[ids, timestamp]``
(one per step that added ids, or per garbage-collection bucket), with a Bloom filter over
their 64-bit fingerprints in front. The list is parsed only when it is small (a key keeps
no filter while reading its list costs less than a filter would: :data:`SMALL_IDS`,
:data:`EXACT_IDS_PER_RECORD`), for a Bloom "maybe" whose msgpack bytes it contains, or
when the filter grows or ids are collected, so the common path (a new record) never
decodes it. An index read from an envelope before version 3 (``[id, timestamp]`` pairs,
128-bit fingerprints) is checked as it was written and rewritten in the current form the
first time the key gets new ids.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import compress
from typing import Any, cast

import msgpack

from millwheel._bloom import (
    BloomFilter,
    fingerprint,
    fingerprints,
    legacy_fingerprint,
    legacy_fingerprints,
)

#: the first envelope version whose ids are chunks ``[ids, timestamp]`` under 64-bit fingerprints
CHUNKED_IDS_VERSION = 3

#: a key with at most this many ids keeps no Bloom filter: the list is smaller than a filter
#: (~77 bytes at 64 ids and 1%), and reading it costs about what loading a filter does
SMALL_IDS = 16
#: nor while it keeps at most this many ids per record its step checks: reading an id from
#: the list (~0.13 µs) costs half what a record costs through a filter (fingerprint, check,
#: insert: ~0.25 µs), so a step of ``n`` records reads ``2n`` ids for what the filter costs
#: it; the filter is built (over every id kept) the first step that would read more
EXACT_IDS_PER_RECORD = 2

_packb = msgpack.packb


@dataclass(slots=True)
class DedupStats:
    """Counters the dedup pass reports to the step's metrics."""

    bloom_maybe: int = 0
    bloom_false_positive: int = 0
    gc_runs: int = 0
    ids_collected: int = 0


class DedupIndex:
    """Record ids seen by one key, garbage-collected behind a horizon (§6.1.1).

    ``blob`` is a concatenation of msgpack chunks ``[ids, timestamp]``, one per step that
    added ids (the newest timestamp among them); ``bloom`` is a Bloom filter over the
    fingerprints of every id in ``blob``.
    ``legacy`` marks an index read from an envelope before version 3 (chunks of
    ``[id, timestamp]`` pairs, 128-bit fingerprints): it is checked as it was written and
    rewritten in the current form by the next :meth:`finish` that has new ids.

    The step calls :meth:`admit` once with all its records' ids: fingerprints and Bloom
    checks are computed for the whole list in C-level passes (no Python code per id on
    the common path), and the new ids are kept as three parallel lists until
    :meth:`finish` folds them into ``blob`` and the filter.
    """

    __slots__ = (
        "blob",
        "count",
        "min_ts",
        "bloom_bytes",
        "capacity",
        "_bloom",
        "_exact",
        "_new_ids",
        "_new_ts",
        "_new_fps",
        "_new_set",
        "_new_in_order",
        "_repeats",
        "_checked",
        "legacy",
    )

    def __init__(
        self,
        blob: bytes = b"",
        count: int = 0,
        min_ts: int | None = None,
        bloom_bytes: bytes | None = None,
        capacity: int = 0,
        legacy: bool = False,
    ) -> None:
        self.legacy = legacy
        self.blob = blob
        self.count = count
        self.min_ts = min_ts
        self.bloom_bytes = bloom_bytes
        self.capacity = capacity
        self._bloom: BloomFilter | None = None
        self._exact: dict[str, int] | None = None
        self._new_ids: list[str] = []
        self._new_ts: list[int] = []
        #: the fingerprints of ``_new_ids`` when the check computed them (``None``: not all known)
        self._new_fps: list[int] | None = []
        self._new_set: set[str] | None = None  # built only if single-id calls need it
        self._new_in_order = False  # True: ``_new_ts`` is known to be sorted
        self._repeats = False  # add() was given an id twice (admit() never does)
        self._checked = 0  # records checked since the last finish() (EXACT_IDS_PER_RECORD)

    # -- reading -----------------------------------------------------------------
    def _exact_ids(self) -> dict[str, int]:
        if self._exact is None:
            exact: dict[str, int] = {}
            if self.blob:
                unpacker = msgpack.Unpacker(raw=False)
                unpacker.feed(self.blob)
                if self.legacy:
                    for chunk in unpacker:
                        exact.update(chunk)
                else:
                    for (
                        ids,
                        ts,
                    ) in (
                        unpacker
                    ):  # a chunk's timestamp; a list of them: written before chunks had one
                        exact.update(
                            dict.fromkeys(ids, ts) if type(ts) is int else zip(ids, ts, strict=True)
                        )
            self._exact = exact
        return self._exact

    def _bloom_filter(self) -> BloomFilter | None:
        if self._bloom is None and self.bloom_bytes is not None:
            self._bloom = BloomFilter.load(self.bloom_bytes, self.capacity)
        return self._bloom

    def _added(self) -> set[str]:
        if self._new_set is None:
            self._new_set = set(self._new_ids)
        return self._new_set

    def admit(
        self, ids: list[str], timestamps: list[int], stats: DedupStats, in_order: bool = False
    ) -> list[bool] | None:
        """Check a step's record ids in one call and remember the new ones (§6.1.1).

        Returns ``None`` when every id is new (the common case), else a list saying which
        are. A new id is remembered with its entry of ``timestamps``; an id repeated in
        ``ids`` is new only the first time. A Bloom "no" is final; a "maybe" checks the
        exact ids, which are never parsed otherwise. A key with few ids (at most
        :data:`SMALL_IDS`, or :data:`EXACT_IDS_PER_RECORD` per record checked) keeps no
        filter: its id list is read instead. The fingerprints computed for the check are
        the ones :meth:`finish` inserts. ``in_order``: the caller knows ``timestamps`` is sorted.
        """
        n = len(ids)
        if n == 0:
            return None
        self._checked += n
        self._new_in_order = in_order and not self._new_ids
        unique = len(set(ids)) == n
        earlier = (
            self._new_set
            if self._new_set is not None
            else (set(self._new_ids) if self._new_ids else None)
        )
        fps = None
        stored: set[str] | None = None  # ids of this step kept by an earlier one
        if self.count == 0:
            pass
        elif self.bloom_bytes is None:
            exact = self._exact_ids()
            if not exact.keys().isdisjoint(ids):
                stored = exact.keys() & set(ids)
        else:
            contains = cast(BloomFilter, self._bloom_filter())._bloom.__contains__
            if self.legacy:
                hits = list(map(contains, legacy_fingerprints(ids)))
            else:
                fps = fingerprints(ids)
                hits = list(map(contains, fps))
            if any(hits):
                # each "maybe" is settled on its own (the exact ids are parsed only if the
                # id's bytes are in them); the other ids need no Python code
                stored = set()
                for rid in set(compress(ids, hits)):
                    if earlier is None or rid not in earlier:
                        stats.bloom_maybe += 1
                        if self._stored(rid):
                            stored.add(rid)
                        else:
                            stats.bloom_false_positive += 1
        new_fps = self._new_fps if fps is not None else None
        if not stored and unique and not earlier:
            self._new_ids += ids
            self._new_ts += timestamps
            if new_fps is not None:
                new_fps += fps  # type: ignore[arg-type]  # fps is set with new_fps
            else:
                self._new_fps = None
            if self._new_set is not None:
                self._new_set.update(ids)
            return None
        keep = [True] * n
        added = self._added()
        for i in range(n):
            rid = ids[i]
            if rid in added or (stored and rid in stored):
                keep[i] = False
                continue
            added.add(rid)
            self._new_ids.append(rid)
            self._new_ts.append(timestamps[i])
            if new_fps is not None:
                new_fps.append(fps[i])  # type: ignore[index]
        if new_fps is None:
            self._new_fps = None
        return keep

    def _stored(self, rid: str) -> bool:
        """Whether ``rid`` is among the stored ids (not this step's). The chunks are msgpack,
        and msgpack writes a str one way only: an id whose bytes are not in the blob is not
        in it, found without parsing it (a Bloom false positive costs a byte search)."""
        if self._exact is None and _packb(rid) not in self.blob:
            return False
        return rid in self._exact_ids()

    def seen(self, rid: str, stats: DedupStats) -> int | None:
        """``None`` if ``rid`` was seen, else its fingerprint (to pass to :meth:`add`)."""
        if self._new_ids and rid in self._added():
            return None
        fp = fingerprint(rid)
        if self.count == 0:
            return fp
        if self.bloom_bytes is None:
            return None if rid in self._exact_ids() else fp
        bloom = self._bloom_filter()
        if (
            bloom is not None
            and (legacy_fingerprint(rid) if self.legacy else fp) not in bloom._bloom
        ):
            return fp
        stats.bloom_maybe += 1
        if self._stored(rid):
            return None
        stats.bloom_false_positive += 1
        return fp

    def contains(self, rid: str, stats: DedupStats) -> bool:
        """True if ``rid`` was seen."""
        return self.seen(rid, stats) is None

    def add(self, rid: str, timestamp: int, fp: int | None = None) -> None:
        """Remember one id (:meth:`admit` is the batched form); ``fp``: its fingerprint, as :meth:`seen` returned it."""
        added = self._added()
        if rid in added:
            self._repeats = True
        added.add(rid)
        self._new_ids.append(rid)
        self._new_ts.append(timestamp)
        self._new_in_order = False
        if fp is None or self._new_fps is None:
            self._new_fps = None
        else:
            self._new_fps.append(fp)

    def ids(self) -> dict[str, int]:
        """Every id kept (for tests and inspection)."""
        out = dict(self._exact_ids())
        out.update(zip(self._new_ids, self._new_ts, strict=False))
        return out

    # -- writing -----------------------------------------------------------------
    def finish(
        self,
        horizon: int,
        fpr: float,
        fixed_capacity: int | None,
        gc_interval_ms: int,
        stats: DedupStats,
    ) -> None:
        """Fold this step's new ids in, and collect ids older than ``horizon``.

        Ids are stored in chunks of one timestamp (:func:`_chunks`): the newest of the ids
        in one ``gc_interval_ms`` bucket, at most one garbage-collection interval above an
        id's own (collection runs at that granularity anyway; ``gc_interval_ms=0``: exact).
        """
        new_ids = self._new_ids
        total = self.count + len(new_ids)
        limit = max(SMALL_IDS, EXACT_IDS_PER_RECORD * self._checked)
        self._checked = 0
        if total == 0:
            return
        blob, stamps, chunk_min = (
            _chunks(new_ids, self._new_ts, gc_interval_ms, self._new_in_order)
            if new_ids
            else (b"", [], None)
        )
        min_ts = (
            self.min_ts
            if chunk_min is None
            else chunk_min
            if self.min_ts is None
            else min(self.min_ts, chunk_min)
        )
        needs_gc = min_ts is not None and horizon > min_ts + gc_interval_ms
        needs_grow = (fixed_capacity is None and total > self.capacity) or self.legacy
        unfiltered = self.bloom_bytes is None
        if self.count == 0 and not needs_gc and unfiltered and not self._repeats:
            # a key's first ids (or the first after all were collected): nothing to merge
            self._exact = None
            self._build(new_ids, blob, chunk_min, fpr, fixed_capacity, limit)
        elif (
            unfiltered
            and total <= limit
            and fixed_capacity is None
            and not (needs_gc or self.legacy or self._repeats)
        ):
            # a key with few ids keeps no filter: its new chunk is appended, the others are
            # not re-read (the exact ids are parsed only if the step's check needed them)
            self._append(blob, stamps)
            self.count = total
            self.min_ts = min_ts
        elif needs_gc or self.legacy or self._repeats:
            exact = self._exact_ids()
            exact.update(zip(new_ids, stamps, strict=True))
            if needs_gc:
                stats.gc_runs += 1
                before = len(exact)
                exact = {rid: ts for rid, ts in exact.items() if ts >= horizon}
                stats.ids_collected += before - len(exact)
            ids = list(exact)
            kept_blob, _, kept_min = (
                _chunks(ids, list(exact.values()), gc_interval_ms) if ids else (b"", [], None)
            )
            self._build(ids, kept_blob, kept_min, fpr, fixed_capacity, limit)
            self._exact = exact
        elif needs_grow or unfiltered:
            # the filter outgrew its capacity (or the key outgrew its list): a new filter over
            # every id; the stored chunks stay as they are, the new one is appended
            exact = self._exact_ids()
            self._append(blob, stamps)
            self.count, self.min_ts = total, min_ts
            self._filter(list(exact), None, fpr, fixed_capacity, limit)
        else:
            if new_ids:
                self.blob += blob
                bloom = cast(BloomFilter, self._bloom_filter())  # bloom_bytes is set on this branch
                bloom.update(self._new_fps if self._new_fps is not None else fingerprints(new_ids))
                self.bloom_bytes = bloom.to_bytes()
                if self._exact is not None:
                    self._exact.update(zip(new_ids, stamps, strict=True))
            self.count = total
            self.min_ts = min_ts
        (
            self._new_ids,
            self._new_ts,
            self._new_fps,
            self._new_set,
            self._new_in_order,
            self._repeats,
        ) = [], [], [], None, False, False

    def _append(self, blob: bytes, stamps: list[int]) -> None:
        """Append the step's new chunks (``blob``; ``stamps``: each new id's stored timestamp)."""
        if self._new_ids:
            self.blob += blob
            if self._exact is not None:
                self._exact.update(zip(self._new_ids, stamps, strict=True))

    def _build(
        self,
        ids: list[str],
        blob: bytes,
        min_ts: int | None,
        fpr: float,
        fixed_capacity: int | None,
        limit: int = SMALL_IDS,
    ) -> None:
        """Keep ``ids`` (distinct, encoded as ``blob``) as the whole id list, with a filter
        over them (:meth:`_filter`)."""
        self.legacy = False
        self.count = len(ids)
        self.blob, self.min_ts = blob, min_ts
        if not ids:
            self.bloom_bytes, self.capacity, self._bloom = None, 0, None
            self._exact = {}
            return
        self._filter(
            ids, self._new_fps if ids is self._new_ids else None, fpr, fixed_capacity, limit
        )

    def _filter(
        self,
        ids: list[str],
        fps: list[int] | None,
        fpr: float,
        fixed_capacity: int | None,
        limit: int,
    ) -> None:
        """A Bloom filter over ``ids`` (every id kept; ``fps``: their fingerprints if known);
        none for at most ``limit`` ids unless the capacity is fixed."""
        if fixed_capacity is None and len(ids) <= limit:
            self.bloom_bytes, self.capacity, self._bloom = None, 0, None
            return
        capacity = fixed_capacity if fixed_capacity is not None else max(64, 2 * len(ids))
        bloom = BloomFilter.create(capacity, fpr)
        bloom.update(fps if fps is not None else fingerprints(ids))
        self._bloom = bloom
        self.capacity = capacity
        self.bloom_bytes = bloom.to_bytes()

    def to_wire(self) -> list[Any] | None:
        if self.count == 0 and not self._new_ids:
            return None
        return [self.blob, self.count, self.min_ts, self.bloom_bytes, self.capacity]

    @classmethod
    def from_wire(cls, wire: list[Any] | None, version: int | None = None) -> DedupIndex:
        """The index as :meth:`to_wire` wrote it, in an envelope of ``version`` (``None``: the current one)."""
        if wire is None:
            return cls()
        blob, count, min_ts, bloom_bytes, capacity = wire
        legacy = version is not None and version < CHUNKED_IDS_VERSION
        return cls(blob, count, min_ts, bloom_bytes, capacity, legacy=legacy)


def _chunks(
    ids: list[str], timestamps: list[int], gc_interval_ms: int, in_order: bool = False
) -> tuple[bytes, list[int], int]:
    """``ids`` as msgpack chunks ``[ids, timestamp]``, one per ``gc_interval_ms`` bucket of
    their timestamps (in bucket order), each under the newest of its ids; returns the bytes,
    each id's stored timestamp and the oldest chunk's (``in_order``: ``timestamps`` is known sorted)."""
    width = max(1, gc_interval_ms)
    in_order = in_order or timestamps == sorted(timestamps)  # records usually arrive in time order
    lo, hi = (timestamps[0], timestamps[-1]) if in_order else (min(timestamps), max(timestamps))
    if lo // width == hi // width:  # the common case: one step's ids, one bucket
        return _packb([ids, hi]), [hi] * len(ids), hi
    if in_order:
        return _chunks_sorted(ids, timestamps, width)
    return _chunks_by_dict(ids, timestamps, width)


def _chunks_sorted(
    ids: list[str], timestamps: list[int], width: int
) -> tuple[bytes, list[int], int]:
    """:func:`_chunks` of ids whose timestamps are sorted: each bucket is a slice, found by
    bisection (Python work per bucket, not per id)."""
    n = len(ids)
    parts: list[bytes] = []
    stamps: list[int] = []
    i = 0
    while i < n:
        j = bisect_left(timestamps, (timestamps[i] // width + 1) * width, i)
        top = timestamps[j - 1]
        parts.append(_packb([ids[i:j], top]))
        stamps += [top] * (j - i)
        i = j
    return b"".join(parts), stamps, stamps[0]


def _chunks_by_dict(
    ids: list[str], timestamps: list[int], width: int
) -> tuple[bytes, list[int], int]:
    """:func:`_chunks` of ids in any order."""
    buckets: dict[int, tuple[list[str], list[int]]] = {}
    for rid, ts in zip(ids, timestamps, strict=True):
        b = buckets.get(ts // width)
        if b is None:
            buckets[ts // width] = ([rid], [ts])
        else:
            b[0].append(rid)
            b[1].append(ts)
    parts, stamps_of = [], {}
    for _, (b_ids, b_ts) in sorted(buckets.items()):
        top = max(b_ts)
        parts.append(_packb([b_ids, top]))
        stamps_of.update(dict.fromkeys(b_ids, top))
    return (
        b"".join(parts),
        [stamps_of[rid] for rid in ids],
        min(max(b_ts) for _, b_ts in buckets.values()),
    )
