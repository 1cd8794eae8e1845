"""The columnar store: what a columnar computation keeps for the keys of one key interval.

One blob, committed atomically with the batch (``applyInPandasWithState``'s interval row
on Spark, one per computation in the harness): the user's state as an Arrow table with a
``_kb`` (encoded key) column, the timers, each key's production sequence, life and hold,
pending strong productions and the dedup index (``_coldedup.py``). Used by
``_colrunner.py``'s runner and ``_colbatch.py``'s user view.

A key's production sequence and life (``meta``, ``_identity.py``) are kept while the key
holds anything, and forgotten with it (:meth:`ColumnarStore.forget_empty`): its next
productions are numbered in a new life, whose ids none of the old one's equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millwheel._coldedup import ColumnarDedup
from millwheel._colsegments import SegmentFiles
from millwheel._coltimers import TimerTable
from millwheel._contract import unacknowledged, with_collect_at
from millwheel._errors import EnvelopeError
from millwheel._options import ComputationOptions, DedupOptions
from millwheel._record import MAX_TIMESTAMP, TimeDomain

_LW = int(TimeDomain.LOW_WATERMARK)
_LAST = MAX_TIMESTAMP - 1
#: the head of a columnar store blob (a per-record interval row is a msgpack map)
STORE_MAGIC = "millwheel-columnar"
#: 4: the version of the user's state (``ColumnarComputation.state_version``) follows the
#: dedup index (older stores: state version 1); 3: a key's ``meta`` entry may carry its life
#: (``[sequence, hold, life]``); 2: the dedup index's ids in segments, its filter over
#: :func:`~millwheel._coldedup.hash_bytes` fingerprints; version 1 and 2 stores still decode
#: (``ColumnarDedup.from_wire``), their keys without a life (numbered as before until they
#: are forgotten)
STORE_VERSION = 4
_READS = (1, 2, 3, 4)
_packb = msgpack.packb
_pending_id = itemgetter(4)
_unpackb = msgpack.unpackb


@dataclass(slots=True)
class ColumnarStore:
    """What a columnar computation keeps for the keys of one key interval, committed as one blob."""

    #: user state: an Arrow table whose ``_kb`` column is the encoded key (None: no state)
    state: pa.Table | None = None
    #: ``(encoded key, tag) -> (timestamp, domain)``, as columns (never changed in place: replaced)
    timers: TimerTable = field(default_factory=TimerTable)
    #: encoded key -> [production sequence, hold_watermark or None, life] (no life: a key from
    #: a store written before lives, ``_identity.py``)
    meta: dict[bytes, list[Any]] = field(default_factory=dict)
    #: strong productions checkpointed and not yet acknowledged: [stream, key bytes, value bytes, ts, id]
    pending: list[list[Any]] = field(default_factory=list)
    dedup: ColumnarDedup = field(default_factory=ColumnarDedup)
    #: the version of the computation that stored ``state`` (``ColumnarComputation.state_version``,
    #: ``_colversions.py``): 1 for a store written before versions; ``None``: not said (a new
    #: store), read as the version of the code that reads it
    state_version: int | None = None

    def encode(self, files: SegmentFiles | None = None) -> bytes | None:
        """The blob (the dedup's held ids in segments, each encoded once: ``ColumnarDedup.to_wire``;
        ``files``: the segments written to files, the blob naming them, ``_colsegments.py``)."""
        dd = self.dedup.to_wire(files)
        if self.state is not None and self.state.num_rows == 0:
            self.state = None
        if (
            self.state is None
            and not self.timers
            and not self.meta
            and not self.pending
            and dd is None
        ):
            return None
        state = None
        if self.state is not None:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, self.state.schema) as w:
                w.write_table(self.state)
            state = sink.getvalue().to_pybytes()
        t = self.timers
        return _packb(
            [
                STORE_MAGIC,
                STORE_VERSION,
                list(self.meta),
                list(self.meta.values()),
                state,
                t.kb.tolist(),
                t.tag.tolist(),
                t.ts.tolist(),
                t.d.tolist(),
                self.pending,
                dd,
                self.state_version,
            ],
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, data: bytes | None, options: ComputationOptions | None = None) -> ColumnarStore:
        dd_opts = (options or ComputationOptions()).dedup
        if data is None:
            return cls(dedup=ColumnarDedup(dd_opts.bloom_fpr, dd_opts.bloom_capacity))
        try:
            wire = _unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:
            msg = f"corrupt columnar store ({len(data)} bytes): {exc}"
            raise EnvelopeError(msg) from exc
        if not isinstance(wire, list) or len(wire) < 2 or wire[0] != STORE_MAGIC:
            msg = (
                "this state was not written by a columnar computation (a per-record computation's state under the same name?); "
                "a computation cannot switch between per-record and columnar within one run directory"
            )
            raise EnvelopeError(msg)
        if wire[1] not in _READS:
            msg = f"unknown columnar store version {wire[1]!r}; this millwheel reads versions {', '.join(map(str, _READS))}"
            raise EnvelopeError(msg)
        _, _, mk, mv, state, tkb, ttag, tts, td, pending, dd, *rest = wire
        table = None if state is None else pa.ipc.open_stream(state).read_all()
        return cls(
            state=table,
            timers=TimerTable.of(tkb, ttag, tts, td),
            meta=dict(zip(mk, mv, strict=True)),
            pending=pending,
            dedup=ColumnarDedup.from_wire(dd, dd_opts.bloom_fpr, dd_opts.bloom_capacity),
            state_version=rest[0] if rest else 1,
        )

    def copy(self) -> ColumnarStore:
        """A copy that a run may change and a crash throw away (the harness keeps its store
        decoded between rounds: a round works on a copy, committed by keeping it)."""
        # meta's lists are replaced, never changed in place (``set_hold``, ``_colout.py``): a shallow copy suffices
        return ColumnarStore(
            self.state,
            self.timers,
            dict(self.meta),
            list(self.pending),
            self.dedup.copy(),
            self.state_version,
        )

    @classmethod
    def of(
        cls, store: bytes | ColumnarStore | None, options: ComputationOptions | None = None
    ) -> ColumnarStore:
        """``store`` itself if it is decoded, else decoded."""
        return store if isinstance(store, ColumnarStore) else cls.decode(store, options)

    # -- what a columnar call changes (``Batch.apply``) ----------------------------------
    def replace_state(self, kbs: Iterable[bytes], table: pa.Table | None) -> None:
        """The state rows of keys ``kbs`` replaced by ``table`` (``None``: they keep none)."""
        cur = self.state
        if cur is not None and cur.num_rows:
            gone = pc.is_in(cur.column("_kb"), value_set=pa.array(list(kbs), pa.binary()))
            cur = cur.filter(pc.invert(gone))
        if table is None:
            self.state = cur
        elif cur is None or cur.num_rows == 0:
            self.state = table
        else:
            self.state = pa.concat_tables([cur, table], promote_options="permissive")

    def set_hold(self, kb: bytes, t: int | None) -> None:
        """Key ``kb`` holds the low watermark at ``t`` (``None``: releases it, §7.2)."""
        m = self.meta.get(kb)
        if m is None:
            if t is not None:
                self.meta[kb] = [0, t]  # its life starts at its first production (``_colout.py``)
        else:
            self.meta[kb] = [m[0], t, *m[2:]]  # replaced, never changed in place: copies share them

    def acknowledge(self, ids: Iterable[str] | None) -> set[bytes]:
        """Drop delivered strong productions (all if ``ids`` is None); the keys that had any."""
        keys = {p[1] for p in self.pending}
        self.pending = unacknowledged(self.pending, ids, _pending_id)
        self.forget_empty(keys)
        return keys

    def forget_empty(self, kbs: Iterable[bytes]) -> None:
        """Drop the sequence and life of keys that keep nothing else, as an empty per-record
        envelope is not stored (``Envelope.is_empty``): such a key's next production starts a
        new life, numbered from 0 in it, so its ids are none of the old life's (``_identity.py``)."""
        cands = [kb for kb in kbs if kb in self.meta and self.meta[kb][1] is None]
        if not cands:
            return
        busy = self.timers.key_set() | {p[1] for p in self.pending}
        cands = [kb for kb in cands if kb not in busy]
        if cands and self.state is not None and self.state.num_rows:
            busy = set(
                pc.unique(
                    self.state.column("_kb").filter(
                        pc.is_in(self.state.column("_kb"), value_set=pa.array(cands, pa.binary()))
                    )
                ).to_pylist()
            )
            cands = [kb for kb in cands if kb not in busy]
        if cands:
            busy = self.dedup.keys_with_ids(cands)
            for kb in cands:
                if kb not in busy:
                    del self.meta[kb]

    def keeping_nothing(self, kbs: Iterable[bytes], busy: set[bytes]) -> list[bytes]:
        """Which of keys ``kbs`` keep nothing — no state, timers, pending productions, dedup
        ids or hold (an empty per-record envelope, ``Envelope.is_empty``); ``busy``: keys
        known to keep something."""
        cands = set(kbs) - busy  # the cheapest tests first: most keys keep ids or timers
        if cands:
            cands -= self.dedup.keys_with_ids(list(cands))
        if cands and len(self.timers):
            cands -= set(self.timers.kb[self.timers.of_keys(cands)].tolist())
        if cands and self.pending:
            cands -= {p[1] for p in self.pending}
        if cands and self.state is not None and self.state.num_rows:
            col = self.state.column("_kb")
            cands -= set(
                pc.unique(
                    col.filter(pc.is_in(col, value_set=pa.array(list(cands), pa.binary())))
                ).to_pylist()
            )
        meta = self.meta
        return [kb for kb in cands if (m := meta.get(kb)) is None or m[1] is None]

    def key_summary(
        self, kbs: Iterable[bytes], collect: DedupOptions | None = None
    ) -> dict[bytes, tuple[int | None, int | None, int | None]]:
        """Per key: (hold, next low-watermark timer, next wall timer) — what the harness
        indexes. With ``collect``, a key's next low-watermark wake-up is also when its
        oldest ids can go (``_contract.dedup_collect_at``), which holds nothing."""
        want = set(kbs)
        out: dict[bytes, list[Any]] = {kb: [None, None, None] for kb in want}
        for kb in want:
            m = self.meta.get(kb)
            if m is not None:
                out[kb][0] = m[1]
        t = self.timers
        rows = t.of_keys(
            want
        )  # the timers of the wanted keys, found without a Python step per timer
        for kb, ts, d in zip(
            t.kb[rows].tolist(), t.ts[rows].tolist(), t.d[rows].tolist(), strict=True
        ):
            s = out[kb]
            if d == _LW:
                h = ts if ts < _LAST else _LAST
                s[0] = h if s[0] is None or h < s[0] else s[0]
                s[1] = ts if s[1] is None or ts < s[1] else s[1]
            else:
                s[2] = ts if s[2] is None or ts < s[2] else s[2]
        for p in self.pending:
            if p[1] in want:
                s = out[p[1]]
                s[0] = p[3] if s[0] is None or p[3] < s[0] else s[0]
        if collect is not None:
            for kb, oldest in self.dedup.oldest(want).items():
                s = out[kb]
                s[1] = with_collect_at(s[1], oldest, collect.slack_ms, collect.gc_interval_ms)
        return {kb: (s[0], s[1], s[2]) for kb, s in out.items()}

    def summary(
        self, collect: DedupOptions | None = None
    ) -> tuple[int | None, int | None, int | None, int]:
        """The whole store's hold, earliest low-watermark and wall timers, and keys kept;
        with ``collect``, the earliest low-watermark wake-up is also when the oldest ids
        can go (:meth:`key_summary`)."""
        hold = nlw = nwall = None
        for m in self.meta.values():
            if m[1] is not None and (hold is None or m[1] < hold):
                hold = m[1]
        if self.timers:
            nlw, nwall = self.timers.next_timers()
            if nlw is not None:
                h = nlw if nlw < _LAST else _LAST
                hold = h if hold is None or h < hold else hold
        for p in self.pending:
            hold = p[3] if hold is None or p[3] < hold else hold
        if collect is not None and len(self.dedup.ts):
            nlw = with_collect_at(
                nlw, int(self.dedup.ts.min()), collect.slack_ms, collect.gc_interval_ms
            )
        keys = set(self.meta) | self.timers.key_set()
        if self.state is not None:
            keys |= set(self.state.column("_kb").to_pylist())
        return hold, nlw, nwall, len(keys)

    def keys_held(self) -> set[bytes]:
        """Every key the store holds anything for (state, timers, sequence or hold, pending
        productions, dedup ids)."""
        keys = (
            set(self.meta)
            | self.timers.key_set()
            | {p[1] for p in self.pending}
            | set(self.dedup.keys)
        )
        if self.state is not None:
            keys.update(self.state.column("_kb").to_pylist())
        return keys

    def split(self, where: Callable[[bytes], int]) -> dict[int, ColumnarStore]:
        """What each key holds, moved to the store of ``where(key)`` (a rescale: the key
        interval the key hashes to in the new layout, MillWheel §7.1): one store per target
        that gets a key, together holding exactly what this one holds."""
        target = {kb: where(kb) for kb in self.keys_held()}
        out: dict[int, ColumnarStore] = {}

        def at(t: int) -> ColumnarStore:
            st = out.get(t)
            if st is None:
                st = out[t] = ColumnarStore(
                    dedup=self.dedup.empty_like(), state_version=self.state_version
                )
            return st

        def of(kb: bytes) -> ColumnarStore:
            return at(target[kb])

        for kb, m in self.meta.items():
            of(kb).meta[kb] = m
        timers = self.timers
        if len(timers):
            to = np.fromiter(map(target.__getitem__, timers.kb.tolist()), np.int64, len(timers))
            for i in np.unique(to).tolist():
                at(i).timers = timers.take(np.flatnonzero(to == i))
        for p in self.pending:
            of(p[1]).pending.append(p)
        if self.state is not None and self.state.num_rows:
            to = np.fromiter(
                map(target.__getitem__, self.state.column("_kb").to_pylist()),
                np.int64,
                self.state.num_rows,
            )
            for t in np.unique(to).tolist():
                at(t).state = self.state.filter(pa.array(to == t))
        for t, d in self.dedup.split([target[kb] for kb in self.dedup.keys]).items():
            at(t).dedup = d
        return out

    @classmethod
    def merge(cls, stores: Sequence[ColumnarStore]) -> ColumnarStore:
        """One store of ``stores``, which hold disjoint keys (the pieces :meth:`split` gave
        one new key interval); raises :class:`EnvelopeError` if two hold the same key."""
        if len(stores) == 1:
            return stores[0]
        versions = {st.state_version for st in stores if st.state is not None and st.state.num_rows}
        if len(versions) > 1:
            msg = f"columnar stores to merge hold state of versions {sorted(versions, key=str)}: upgrade each to one version first (``_colversions.py``)"
            raise EnvelopeError(msg)
        seen: set[bytes] = set()
        for st in stores:
            ks = st.keys_held()
            if ks & seen:
                msg = f"columnar stores to merge hold the same keys ({len(ks & seen)}): they are not the pieces of disjoint key intervals"
                raise EnvelopeError(msg)
            seen |= ks
        tables = [st.state for st in stores if st.state is not None and st.state.num_rows]
        return cls(
            state=(
                tables[0]
                if len(tables) == 1
                else pa.concat_tables(tables, promote_options="permissive")
            )
            if tables
            else None,
            timers=TimerTable.concat([st.timers for st in stores]),
            meta={k: v for st in stores for k, v in st.meta.items()},
            pending=[p for st in stores for p in st.pending],
            dedup=ColumnarDedup.merge([st.dedup for st in stores]),
            state_version=versions.pop() if versions else None,  # no rows: any version reads them
        )

    def state_rows(self, kbs: Sequence[bytes] | pa.Array) -> tuple[pa.Table, np.ndarray] | None:
        """The state rows of keys ``kbs`` and the index in ``kbs`` of each row's key, found
        with one hash lookup (``None``: no rows)."""
        if self.state is None or self.state.num_rows == 0:
            return None
        t = self.state
        found = pc.index_in(
            t.column("_kb"),
            value_set=kbs if isinstance(kbs, pa.Array) else pa.array(list(kbs), pa.binary()),
        )
        if found.null_count:
            held = pc.is_valid(found)
            t, found = t.filter(held), found.filter(held)
        if t.num_rows == 0:
            return None
        return t, found.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
