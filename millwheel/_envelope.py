"""The per-key envelope: everything the system keeps for one key, committed atomically.

MillWheel stores "timers, pending productions, and persistent state for a given key ...
in the same row" (§7.1) and adds exactly-once data "in this same operation, adding it to
the per-key consistency envelope" (§6.2). The envelope is that row:

* ``state``   — the user's state, already encoded by the computation's codec (§4.4);
* ``timers``  — pending timers, ``tag -> (timestamp, domain)`` (§4.6);
* ``pending`` — strong productions checkpointed but not yet acknowledged (§6.1.2);
* ``seq``     — a per-key production counter, so production ids are deterministic
  given the committed state;
* ``life``    — which life of the key this is, fixed by the batch that made the envelope
  from nothing: production ids hash it with ``seq`` (``_identity.py``), so a key
  forgotten when it keeps nothing (:meth:`Envelope.is_empty`) and made again later never
  repeats an id;
* ``dedup``   — record ids seen, with a Bloom filter in front (§6.1.1).

The record ids (``dedup``) are a :class:`~millwheel._dedup.DedupIndex` (``_dedup.py``): an
append-only id list with a Bloom filter in front, stored as it is here. The envelope is
msgpack with a leading version number.

Versions: 1 (the first); 2 adds ``held``; 3 keeps each step's new ids as one chunk
``[ids, timestamp]`` (half the bytes of ``[id, ts]`` pairs, and faster to pack) and
builds the Bloom filter over 64-bit fingerprints; 4 adds ``life`` (an envelope without
one is still written as version 3). Older envelopes decode; their id list and filter are
rewritten in the version 3 form the first time the key gets new ids; one without a life
keeps it (and its ids their numbering) until the key is forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from millwheel._contract import with_collect_at
from millwheel._dedup import EXACT_IDS_PER_RECORD, SMALL_IDS, DedupIndex, DedupStats
from millwheel._errors import EnvelopeError
from millwheel._record import MAX_TIMESTAMP, Key

__all__ = [
    "ENVELOPE_VERSION",
    "EXACT_IDS_PER_RECORD",
    "SMALL_IDS",
    "DedupIndex",
    "DedupStats",
    "Envelope",
    "PendingProduction",
]

_LAST = MAX_TIMESTAMP - 1  # the latest timestamp a record may carry

#: version 4: the key's life; 3: columnar id chunks, 64-bit fingerprints; versions 1 to 3 still decode
ENVELOPE_VERSION = 4

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
class Envelope:
    """One key's checkpoint: state, timers, pending productions, dedup data."""

    state: bytes | None = None
    timers: dict[str, tuple[int, int]] = field(default_factory=dict)
    pending: list[PendingProduction] = field(default_factory=list)
    seq: int = 0
    dedup: DedupIndex = field(default_factory=DedupIndex)
    #: the oldest timestamp the key's state still stands for (``Computation.hold_watermark``, §7.2)
    held: int | None = None
    #: the key's life (``millwheel/_identity.py``; ``None``: an envelope from before lives)
    life: int | None = None

    def is_empty(self) -> bool:
        """An empty envelope need not be stored at all: neither its sequence nor its life,
        since the key's next life numbers its productions apart (``_identity.py``)."""
        return (
            self.state is None
            and not self.timers
            and not self.pending
            and self.dedup.count == 0
            and not self.dedup._new_ids
            and self.held is None
        )

    def hold(self) -> int | None:
        """The oldest pending work of this key (§7.2): low-watermark timers, pending
        productions and what its state holds."""
        return self.schedule()[0]

    def schedule(self) -> tuple[int | None, int | None, int | None]:
        """:meth:`hold`, and the earliest pending low-watermark and wall-time timers, in one pass."""
        hold: int | None = self.held
        next_lw = next_wall = None
        for ts, domain in self.timers.values():
            if domain == 0:
                if next_lw is None or ts < next_lw:
                    next_lw = ts
            elif next_wall is None or ts < next_wall:
                next_wall = ts
        if next_lw is not None and (hold is None or next_lw < hold):
            # a timer set at MAX_TIMESTAMP (fire when the input is finished) holds the
            # watermark just below it: what it produces is on time downstream
            hold = next_lw if next_lw < _LAST else _LAST
        for p in self.pending:
            if hold is None or p.timestamp < hold:
                hold = p.timestamp
        return hold, next_lw, next_wall

    def collect_wake(self, next_lw: int | None, slack_ms: int, gc_interval_ms: int) -> int | None:
        """``next_lw``, or earlier the low watermark from which this key, if it keeps ids and
        no state, is stepped again to collect its oldest ids even with nothing else due
        (``_contract.dedup_collect_at``): a wake-up, not a timer, so it holds nothing
        (§6.1.1). Else a key seen once would keep its ids, and its envelope, for ever; a
        key with state keeps its last ids until its next step (no entry in its interval's
        timer index for them: a key layout holds millions of such keys)."""
        if not self.dedup.count or self.state is not None:
            return next_lw
        return with_collect_at(next_lw, self.dedup.min_ts, slack_ms, gc_interval_ms)

    def encode(self) -> bytes:
        timers: list[Any] = []
        for tag, (ts, domain) in self.timers.items():
            timers += (tag, ts, domain)
        pending = [[p.stream, p.key, p.value, p.timestamp, p.id] for p in self.pending]
        wire = [
            ENVELOPE_VERSION,
            self.state,
            timers,
            pending,
            self.seq,
            self.dedup.to_wire(),
            self.held,
            self.life,
        ]
        if self.life is None or self.dedup.legacy:
            # without a life: version 3; an index still in the version 2 form (no step has
            # rewritten it yet: an envelope from before lives) is written as such
            wire[0] = 2 if self.dedup.legacy else 3
            wire.pop()
        return _packb(wire, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes | None) -> Envelope:
        if data is None:
            return cls()
        try:
            wire = _unpackb(data, raw=False, strict_map_key=False, use_list=False)
        except Exception as exc:
            msg = f"corrupt envelope ({len(data)} bytes): {exc}"
            raise EnvelopeError(msg) from exc
        if not isinstance(wire, tuple) or not wire or wire[0] not in (1, 2, 3, ENVELOPE_VERSION):
            version = wire[0] if isinstance(wire, tuple) and wire else None
            msg = f"unknown envelope version {version!r}; this millwheel reads versions 1 to {ENVELOPE_VERSION}"
            raise EnvelopeError(msg)
        version = wire[0]
        life = None
        if version == 1:
            _, state, flat, pending, seq, dedup = wire
            held = None
        elif version < 4:
            _, state, flat, pending, seq, dedup, held = wire
        else:
            _, state, flat, pending, seq, dedup, held, life = wire
        timers = {flat[i]: (flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)}
        return cls(
            state=state,
            timers=timers,
            pending=[PendingProduction(*p) for p in pending],
            seq=seq,
            dedup=DedupIndex.from_wire(dedup, version),
            held=held,
            life=life,
        )
