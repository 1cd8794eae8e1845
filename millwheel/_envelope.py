"""The per-key envelope: everything the system keeps for one key, committed atomically.

MillWheel stores "timers, pending productions, and persistent state for a given key ...
in the same row" (§7.1) and adds exactly-once data "in this same operation, adding it to
the per-key consistency envelope" (§6.2). The envelope is that row:

* ``state``   — the user's state, already encoded by the computation's codec (§4.4);
* ``timers``  — pending timers, ``tag -> (timestamp, domain)`` (§4.6);
* ``pending`` — strong productions checkpointed but not yet acknowledged (§6.1.2);
* ``seq``     — a per-key production counter, so production ids are deterministic
  given the committed state;
* ``dedup``   — record ids seen, with a Bloom filter in front (§6.1.1).

The encoding is msgpack with a leading version number. The exact id list is an
append-only byte string that is only parsed on a Bloom "maybe" or at garbage
collection, so the common path (a new record) never decodes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import msgpack

from millwheel._bloom import _OFFSET, BloomFilter, _digest, fingerprint
from millwheel._errors import EnvelopeError
from millwheel._record import Key

#: version 2 adds ``held`` (a state-kept hold of the low watermark); version 1 still decodes
ENVELOPE_VERSION = 2

_packb = msgpack.packb
_unpackb = msgpack.unpackb


@dataclass(slots=True)
class PendingProduction:
    """A strong production checkpointed in the envelope until delivery is acknowledged."""

    stream: str
    key: Key | None
    value: bytes  # encoded with the value codec (millwheel._codec.encode_value)
    timestamp: int
    id: str


@dataclass(slots=True)
class DedupStats:
    """Counters the dedup pass reports to the step's metrics."""

    bloom_maybe: int = 0
    bloom_false_positive: int = 0
    gc_runs: int = 0
    ids_collected: int = 0


class DedupIndex:
    """Record ids seen by one key, garbage-collected behind a horizon (§6.1.1).

    ``blob`` is a concatenation of msgpack lists of ``[id, timestamp]`` pairs, one list
    per step that added ids; ``bloom`` is a Bloom filter over every id in ``blob``.
    """

    __slots__ = ("blob", "count", "min_ts", "bloom_bytes", "capacity", "_bloom", "_exact", "_new", "_new_set")

    def __init__(
        self,
        blob: bytes = b"",
        count: int = 0,
        min_ts: int | None = None,
        bloom_bytes: bytes | None = None,
        capacity: int = 0,
    ) -> None:
        self.blob = blob
        self.count = count
        self.min_ts = min_ts
        self.bloom_bytes = bloom_bytes
        self.capacity = capacity
        self._bloom: BloomFilter | None = None
        self._exact: dict[str, int] | None = None
        self._new: list[tuple[str, int, int]] = []  # (id, timestamp, fingerprint)
        self._new_set: set[str] = set()

    # -- reading -----------------------------------------------------------------
    def _exact_ids(self) -> dict[str, int]:
        if self._exact is None:
            exact: dict[str, int] = {}
            if self.blob:
                unpacker = msgpack.Unpacker(raw=False)
                unpacker.feed(self.blob)
                for chunk in unpacker:
                    for rid, ts in chunk:
                        exact[rid] = ts
            self._exact = exact
        return self._exact

    def _bloom_filter(self) -> BloomFilter | None:
        if self._bloom is None and self.bloom_bytes is not None:
            self._bloom = BloomFilter.load(self.bloom_bytes, self.capacity)
        return self._bloom

    def seen(self, rid: str, stats: DedupStats) -> int | None:
        """``None`` if ``rid`` was seen, else its fingerprint (to pass to :meth:`add`).

        A Bloom "no" is final; a "maybe" checks the exact ids, which are never parsed
        otherwise. The fingerprint is computed once, for both the check and the insert.
        """
        if rid in self._new_set:
            return None
        fp = _digest(rid.encode()) - _OFFSET  # fingerprint(rid), inlined: once per record
        if self.count == 0:
            return fp
        bloom = self._bloom
        if bloom is None:
            bloom = self._bloom_filter()
        if bloom is not None and fp not in bloom._bloom:
            return fp
        stats.bloom_maybe += 1
        if rid in self._exact_ids():
            return None
        stats.bloom_false_positive += 1
        return fp

    def contains(self, rid: str, stats: DedupStats) -> bool:
        """True if ``rid`` was seen."""
        return self.seen(rid, stats) is None

    def add(self, rid: str, timestamp: int, fp: int | None = None) -> None:
        """Remember ``rid``; ``fp`` is its fingerprint if :meth:`seen` already computed it."""
        self._new.append((rid, timestamp, fingerprint(rid) if fp is None else fp))
        self._new_set.add(rid)

    def ids(self) -> dict[str, int]:
        """Every id kept (for tests and inspection)."""
        out = dict(self._exact_ids())
        out.update((rid, ts) for rid, ts, _ in self._new)
        return out

    # -- writing -----------------------------------------------------------------
    def finish(self, horizon: int, fpr: float, fixed_capacity: int | None, gc_interval_ms: int, stats: DedupStats) -> None:
        """Fold this step's new ids in, and collect ids older than ``horizon``."""
        new = self._new
        total = self.count + len(new)
        if total == 0:
            return
        min_ts = self.min_ts
        if new:
            new_min = min([t[1] for t in new])
            min_ts = new_min if min_ts is None else min(min_ts, new_min)
        needs_gc = min_ts is not None and horizon > min_ts + gc_interval_ms
        needs_grow = fixed_capacity is None and total > self.capacity
        if needs_gc or needs_grow or self.bloom_bytes is None:
            exact = self._exact_ids()
            exact.update((rid, ts) for rid, ts, _ in new)
            if needs_gc:
                stats.gc_runs += 1
                before = len(exact)
                exact = {rid: ts for rid, ts in exact.items() if ts >= horizon}
                stats.ids_collected += before - len(exact)
            self._rebuild(exact, fpr, fixed_capacity, {rid: fp for rid, _, fp in new})
        else:
            self.blob += _packb([(rid, ts) for rid, ts, _ in new])
            bloom = cast(BloomFilter, self._bloom_filter())  # bloom_bytes is set on this branch
            bloom.update([t[2] for t in new])
            self.bloom_bytes = bloom.to_bytes()
            self.count = total
            self.min_ts = min_ts
        self._new = []
        self._new_set = set()

    def _rebuild(self, exact: dict[str, int], fpr: float, fixed_capacity: int | None, known: dict[str, int]) -> None:
        """Re-encode the kept ids and rebuild the filter; ``known`` maps ids to fingerprints already computed."""
        self._exact = exact
        self.count = len(exact)
        if not exact:
            self.blob, self.min_ts, self.bloom_bytes, self.capacity, self._bloom = b"", None, None, 0, None
            return
        self.blob = _packb(list(exact.items()))
        self.min_ts = min(exact.values())
        capacity = fixed_capacity if fixed_capacity is not None else max(64, 2 * len(exact))
        bloom = BloomFilter.create(capacity, fpr)
        bloom.update([known[rid] if rid in known else fingerprint(rid) for rid in exact])
        self._bloom = bloom
        self.capacity = capacity
        self.bloom_bytes = bloom.to_bytes()

    def to_wire(self) -> list[Any] | None:
        if self.count == 0 and not self._new:
            return None
        return [self.blob, self.count, self.min_ts, self.bloom_bytes, self.capacity]

    @classmethod
    def from_wire(cls, wire: list[Any] | None) -> DedupIndex:
        if wire is None:
            return cls()
        blob, count, min_ts, bloom_bytes, capacity = wire
        return cls(blob, count, min_ts, bloom_bytes, capacity)


@dataclass(slots=True)
class Envelope:
    """One key's checkpoint: state, timers, pending productions, dedup data."""

    state: bytes | None = None
    timers: dict[str, tuple[int, int]] = field(default_factory=dict)
    pending: list[PendingProduction] = field(default_factory=list)
    seq: int = 0
    dedup: DedupIndex = field(default_factory=DedupIndex)
    #: the oldest timestamp the key's state still stands for (``Computation.hold_watermark``, §7.2)
    held: int | None = None

    def is_empty(self) -> bool:
        """An empty envelope need not be stored at all."""
        return (
            self.state is None
            and not self.timers
            and not self.pending
            and self.dedup.count == 0
            and not self.dedup._new
            and self.held is None
        )

    def hold(self) -> int | None:
        """The oldest pending work of this key (§7.2): low-watermark timers, pending
        productions and what its state holds."""
        hold: int | None = self.held
        for ts, domain in self.timers.values():
            if domain == 0 and (hold is None or ts < hold):
                hold = ts
        for p in self.pending:
            if hold is None or p.timestamp < hold:
                hold = p.timestamp
        return hold

    def encode(self) -> bytes:
        timers: list[Any] = []
        for tag, (ts, domain) in self.timers.items():
            timers += (tag, ts, domain)
        pending = [[p.stream, p.key, p.value, p.timestamp, p.id] for p in self.pending]
        return _packb(
            [ENVELOPE_VERSION, self.state, timers, pending, self.seq, self.dedup.to_wire(), self.held],
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, data: bytes | None) -> Envelope:
        if data is None:
            return cls()
        try:
            wire = _unpackb(data, raw=False, strict_map_key=False, use_list=False)
        except Exception as exc:
            msg = f"corrupt envelope ({len(data)} bytes): {exc}"
            raise EnvelopeError(msg) from exc
        if not isinstance(wire, tuple) or not wire or wire[0] not in (1, ENVELOPE_VERSION):
            version = wire[0] if isinstance(wire, tuple) and wire else None
            msg = f"unknown envelope version {version!r}; this millwheel reads versions 1 to {ENVELOPE_VERSION}"
            raise EnvelopeError(msg)
        if wire[0] == 1:
            _, state, flat, pending, seq, dedup = wire
            held = None
        else:
            _, state, flat, pending, seq, dedup, held = wire
        timers = {flat[i]: (flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)}
        return cls(
            state=state,
            timers=timers,
            pending=[PendingProduction(*p) for p in pending],
            seq=seq,
            dedup=DedupIndex.from_wire(dedup),
            held=held,
        )

