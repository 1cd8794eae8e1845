"""Columnar computations: a micro-batch of many keys as columns, inside the exactly-once envelope.

The per-record contract (``process_record`` once per record, ``process_timer`` once per
timer, ``_step.py``) costs Python work per record and per key. A
:class:`ColumnarComputation` gets a batch of records of *many keys at once* as a pandas
frame and answers with columns: per-key state read and replaced in bulk, timers set and
deleted as columns, productions as columns. Everything MillWheel guarantees per key is
kept, by the framework, around each call (:class:`ColumnarRunner`):

* **exactly once** (§6.1.1): ``(key, id)`` pairs are checked for the whole batch in a few
  numpy calls (``_coldedup.py``: fingerprints, a Bloom filter over a bit array, the exact
  ids only for a "maybe"); duplicates never reach user code;
* **late records** (§4.5): judged per record against the watermark it arrived under;
  the computation's :class:`~millwheel.LatePolicy` applies;
* **order** (§4.1, §4.6): within a key, records in delivery order (the frame is grouped
  by key, keys in order of first appearance); then due timers, per key in timestamp order
  (ties by domain, then tag); a timer set while firing that is already due fires in the
  next round of the same batch;
* **holds** (§7.2): per key, low-watermark timers, ``hold_watermark`` and (harness)
  pending strong productions;
* **atomicity** (§6.2): each call is applied all or nothing. A call that raises is run
  again per key; a key whose call raises falls back to one record (one timer) per call,
  and each record or timer that still raises is rolled back and dead-lettered with its
  reason, as on the per-record path;
* **production ids** (§6.1.2): ``production_id(computation, key, seq)`` with the per-key
  sequence kept in the store, so a replay assigns the same ids and a columnar
  computation that produces what a per-record one does, in the same per-key order,
  produces the same records.

What the framework keeps per key interval (the harness: per computation) is one blob, the
*columnar store* (:class:`ColumnarStore`): the user's state as an Arrow table with a key
column, the timers, each key's production sequence and hold, pending strong productions,
and the dedup index — one atomic write per interval and micro-batch.

>>> import pandas as pd
>>> from millwheel.testing import Harness
>>> class Count(ColumnarComputation):
...     record_columns = ("key", "timestamp")            # values are not decoded
...     def process_batch(self, batch):
...         n = batch.records.groupby("key", sort=False, observed=True).size().rename("n").reset_index()
...         old = batch.state
...         if len(old):
...             n = pd.concat([n, old]).groupby("key", sort=False, as_index=False, observed=True)["n"].sum()
...         batch.set_state(n)
...         batch.set_timers(n["key"], ["end"] * len(n), [1_000] * len(n))
...     def process_timers(self, batch, timers):
...         s = batch.state
...         batch.produce("counts", list(zip(s["key"], s["n"])), keys=s["key"], timestamps=[1_000] * len(s))
...         batch.set_state(s.iloc[:0])
>>> h = Harness.for_computation(Count, inputs={"q": lambda r: r.value}, outputs=["counts"])
>>> h.inject("q", [h.record("cats", 10, id="a"), h.record("dogs", 20, id="b"), h.record("cats", 30, id="a")])
>>> h.finish("q"); h.run()
>>> sorted(h.values("counts")), h.metrics("Count")["duplicates"]
([('cats', 1), ('dogs', 1)], 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from millwheel._codec import decode_value, encode_value
from millwheel._coldedup import ColumnarDedup, chunk_stamps, fingerprints
from millwheel._computation import Computation
from millwheel._deadletter import (
    DEAD_LETTER_STREAM,
    DeadLetter,
    Stage,
    dead_letter_record,
    reason_of,
)
from millwheel._envelope import DedupStats
from millwheel._errors import ComputationError, EnvelopeError, StateCodecError
from millwheel._options import ComputationOptions, ErrorPolicy, LateAction
from millwheel._record import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Key,
    Production,
    Record,
    TimeDomain,
    Timer,
    decode_key,
    key_problem,
    production_time,
    short_repr,
)
from millwheel._step import production_id

_LW = int(TimeDomain.LOW_WATERMARK)
_WALL = int(TimeDomain.WALL_TIME)
_LAST = MAX_TIMESTAMP - 1
#: the head of a columnar store blob (a per-record interval row is a msgpack map)
STORE_MAGIC = "millwheel-columnar"
STORE_VERSION = 1
_packb = msgpack.packb
_unpackb = msgpack.unpackb

RECORD_COLUMNS = ("key", "id", "timestamp", "stream", "value")
TIMER_COLUMNS = ("key", "tag", "timestamp", "domain")


class ColumnarComputation(Computation):
    """Base class of columnar computations: override :meth:`process_batch` (and
    :meth:`process_timers` if you set timers). See the module docstring.

    ``record_columns`` lists the columns :attr:`Batch.records` carries; leave ``"value"``
    out and values are never decoded (a count needs only keys and timestamps).
    """

    record_columns: ClassVar[tuple[str, ...]] = RECORD_COLUMNS

    def process_batch(self, batch: Batch) -> None:
        """Called with records of many keys (:attr:`Batch.records`), once per batch (or per key, record: see the module docstring)."""
        msg = f"columnar computation {self.name or type(self).__name__!r} must override process_batch(self, batch)"
        raise NotImplementedError(msg)

    def process_timers(self, batch: Batch, timers: pd.DataFrame) -> None:
        """Called with due timers (``key, tag, timestamp, domain``), per key in timestamp order."""
        msg = f"columnar computation {self.name or type(self).__name__!r} set timers but does not override process_timers(self, batch, timers)"
        raise ComputationError(msg)

    def process_record(self, record: Record) -> None:
        """Not used: the framework calls :meth:`process_batch` (with one record when it falls back)."""
        msg = f"columnar computation {self.name or type(self).__name__!r} runs process_batch, not process_record"
        raise ComputationError(msg)


def is_columnar(cls: type) -> bool:
    """Whether a computation class runs on the columnar path."""
    return isinstance(cls, type) and issubclass(cls, ColumnarComputation)


# ------------------------------------------------------------------------------ the store
@dataclass(slots=True)
class ColumnarStore:
    """What a columnar computation keeps for the keys of one key interval, committed as one blob."""

    #: user state: an Arrow table whose ``_kb`` column is the encoded key (None: no state)
    state: pa.Table | None = None
    #: ``(encoded key, tag) -> (timestamp, domain)``
    timers: dict[tuple[bytes, str], tuple[int, int]] = field(default_factory=dict)
    #: encoded key -> [production sequence, hold_watermark or None]
    meta: dict[bytes, list[Any]] = field(default_factory=dict)
    #: strong productions checkpointed and not yet acknowledged: [stream, key bytes, value bytes, ts, id]
    pending: list[list[Any]] = field(default_factory=list)
    dedup: ColumnarDedup = field(default_factory=ColumnarDedup)

    def encode(self) -> bytes | None:
        dd = self.dedup.to_wire()
        if self.state is not None and self.state.num_rows == 0:
            self.state = None
        if self.state is None and not self.timers and not self.meta and not self.pending and dd is None:
            return None
        state = None
        if self.state is not None:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, self.state.schema) as w:
                w.write_table(self.state)
            state = sink.getvalue().to_pybytes()
        tk = list(self.timers)
        tv = list(self.timers.values())
        return _packb(
            [STORE_MAGIC, STORE_VERSION, list(self.meta), list(self.meta.values()), state,
             [k for k, _ in tk], [t for _, t in tk], [v[0] for v in tv], [v[1] for v in tv], self.pending, dd],
            use_bin_type=True,
        )  # fmt: skip

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
        if wire[1] != STORE_VERSION:
            msg = f"unknown columnar store version {wire[1]!r}; this millwheel reads version {STORE_VERSION}"
            raise EnvelopeError(msg)
        _, _, mk, mv, state, tkb, ttag, tts, td, pending, dd = wire
        table = None if state is None else pa.ipc.open_stream(state).read_all()
        return cls(
            state=table,
            timers=dict(zip(zip(tkb, ttag, strict=True), zip(tts, td, strict=True), strict=True)),
            meta=dict(zip(mk, mv, strict=True)),
            pending=pending,
            dedup=ColumnarDedup.from_wire(dd, dd_opts.bloom_fpr, dd_opts.bloom_capacity),
        )

    def forget_empty(self, kbs: Iterable[bytes]) -> None:
        """Drop the sequence of keys that keep nothing else, as an empty per-record envelope is
        not stored (``Envelope.is_empty``): such a key's next production is numbered from 0 again."""
        cands = [kb for kb in kbs if kb in self.meta and self.meta[kb][1] is None]
        if not cands:
            return
        busy = {kb for kb, _ in self.timers} | {p[1] for p in self.pending}
        cands = [kb for kb in cands if kb not in busy]
        if cands and self.state is not None and self.state.num_rows:
            busy = set(pc.unique(self.state.column("_kb").filter(pc.is_in(self.state.column("_kb"), value_set=pa.array(cands, pa.binary())))).to_pylist())
            cands = [kb for kb in cands if kb not in busy]
        if cands:
            busy = self.dedup.keys_with_ids(cands)
            for kb in cands:
                if kb not in busy:
                    del self.meta[kb]

    def key_summary(self, kbs: Iterable[bytes]) -> dict[bytes, tuple[int | None, int | None, int | None]]:
        """Per key: (hold, next low-watermark timer, next wall timer) — what the harness indexes."""
        want = set(kbs)
        out: dict[bytes, list[Any]] = {kb: [None, None, None] for kb in want}
        for kb in want:
            m = self.meta.get(kb)
            if m is not None:
                out[kb][0] = m[1]
        for (kb, _), (ts, d) in self.timers.items():
            if kb not in want:
                continue
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
        return {kb: (s[0], s[1], s[2]) for kb, s in out.items()}

    def summary(self) -> tuple[int | None, int | None, int | None, int]:
        """The whole store's hold, earliest low-watermark and wall timers, and keys kept."""
        hold = nlw = nwall = None
        for m in self.meta.values():
            if m[1] is not None and (hold is None or m[1] < hold):
                hold = m[1]
        if self.timers:
            d = np.fromiter((v[1] for v in self.timers.values()), np.int8, len(self.timers))
            lw = d == _LW
            if lw.any():
                nlw = min(v[0] for v in self.timers.values() if v[1] == _LW)
                h = nlw if nlw < _LAST else _LAST
                hold = h if hold is None or h < hold else hold
            if (~lw).any():
                nwall = min(v[0] for v in self.timers.values() if v[1] != _LW)
        for p in self.pending:
            hold = p[3] if hold is None or p[3] < hold else hold
        keys = set(self.meta) | {kb for kb, _ in self.timers}
        if self.state is not None:
            keys |= set(self.state.column("_kb").to_pylist())
        return hold, nlw, nwall, len(keys)

    def state_rows(self, kbs: Sequence[bytes]) -> pa.Table | None:
        """The state rows of keys ``kbs``."""
        if self.state is None or self.state.num_rows == 0:
            return None
        mask = pc.is_in(self.state.column("_kb"), value_set=pa.array(list(kbs), pa.binary()))
        return self.state.filter(mask)


# ------------------------------------------------------------------------------ user view
def _to_pandas(t: pa.Table) -> pd.DataFrame:
    """A table as a frame, column by column (cheaper than ``Table.to_pandas`` for small tables)."""
    cols = {}
    for name, col in zip(t.column_names, t.columns, strict=True):
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            cols[name] = col.to_numpy() if col.null_count == 0 else col.to_pandas()
        else:
            cols[name] = col.to_pandas()
    return pd.DataFrame(cols)


def _categories(keys: list[Key]) -> pd.Index | None:
    """The categories of a call's ``key`` columns: its keys (``None``: tuple keys, which a
    pandas index would turn into levels; their columns stay plain objects)."""
    if any(type(k) is tuple for k in keys):
        return None
    return pd.Index(keys, dtype=object)


def _key_column(codes: np.ndarray, keys: list[Key], cats: pd.Index | None) -> Any:
    if cats is None:
        return [keys[c] for c in codes.tolist()]
    return pd.Categorical.from_codes(codes, categories=cats)


def _to_arrow(rows: pd.DataFrame) -> pa.Table:
    """The non-key columns of ``rows`` as an Arrow table (numeric numpy columns without pandas' conversion machinery)."""
    arrays, names = [], []
    for name in rows.columns:
        if name == "key":
            continue
        col = rows[name]
        v = col.to_numpy() if col.dtype.kind in "iufb" else None
        arrays.append(pa.array(v) if v is not None else pa.Array.from_pandas(col))
        names.append(str(name))
    return pa.Table.from_arrays(arrays, names=names)


class Batch:
    """What a columnar computation sees in one call: records (or due timers) of some keys,
    their state, and the calls that change them. Changes apply when the call returns
    (all or nothing)."""

    __slots__ = (
        "_runner", "_store", "_kbs", "_key_of", "_kb_of", "_rows", "_state_cache", "_cats", "_kb_arr", "_keys",
        "low_watermark", "now", "_set_state", "_timer_ops", "_prod", "_holds",
    )  # fmt: skip

    def __init__(self, runner: ColumnarRunner, store: ColumnarStore, kbs: list[bytes], key_of: dict[bytes, Key], rows: pd.DataFrame | None, low_watermark: int, now: int) -> None:
        self._runner = runner
        self._store = store
        self._kbs = kbs
        self._key_of = key_of
        self._keys = [key_of[kb] for kb in kbs]
        self._cats = _categories(self._keys)
        self._kb_arr = np.array(kbs + [b""], dtype=object)[:-1]  # an object array even if every key has one length
        self._kb_of: dict[Any, bytes] | None = None
        self._rows = rows
        self._state_cache: pd.DataFrame | None = None
        self.low_watermark = low_watermark
        self.now = now
        self._set_state: list[tuple[set[bytes], pa.Table | None]] = []
        self._timer_ops: list[tuple[str, list[bytes], list[str], Any, Any]] = []
        self._prod: list[tuple[str, list[bytes], list[Any], list[bytes], np.ndarray]] = []
        self._holds: dict[bytes, int | None] = {}

    # -- reading ---------------------------------------------------------------------
    @property
    def records(self) -> pd.DataFrame:
        """This call's records (``record_columns``), grouped by key, each key's in delivery order."""
        if self._rows is None:
            return pd.DataFrame({c: [] for c in self._runner.record_columns})
        return self._rows

    @property
    def keys(self) -> list[Key]:
        """The keys of this call: those with records, or with due timers (the categories of the ``key`` columns)."""
        return list(self._keys)

    @property
    def state(self) -> pd.DataFrame:
        """The state rows of this call's keys: a ``key`` column and the columns you stored."""
        if self._state_cache is None:
            t = self._store.state_rows(self._kbs)
            if t is None:
                empty = np.empty(0, np.int64)
                self._state_cache = pd.DataFrame({"key": _key_column(empty, self._keys, self._cats)})
            else:
                df = _to_pandas(t.drop_columns(["_kb"]))
                codes = pc.index_in(t.column("_kb"), value_set=pa.array(self._kbs, pa.binary())).to_numpy(zero_copy_only=False)
                df.insert(0, "key", _key_column(codes.astype(np.int64), self._keys, self._cats))
                self._state_cache = df
        return self._state_cache.copy()

    def pending_timers(self) -> pd.DataFrame:
        """Pending timers of this call's keys (``key, tag, timestamp, domain``), earliest first per key."""
        want = set(self._kbs)
        items = sorted(((kb, tag, ts, d) for (kb, tag), (ts, d) in self._store.timers.items() if kb in want), key=lambda x: (x[0], x[2], x[3], x[1]))
        index = {kb: i for i, kb in enumerate(self._kbs)}
        return pd.DataFrame({
            "key": _key_column(np.array([index[i[0]] for i in items], np.int64), self._keys, self._cats), "tag": [i[1] for i in items],
            "timestamp": np.array([i[2] for i in items], np.int64), "domain": np.array([i[3] for i in items], np.int8),
        })  # fmt: skip

    # -- checks ----------------------------------------------------------------------
    def _kb(self, keys: Any, what: str) -> list[bytes]:
        """Encoded keys of ``keys``, each one of this call's keys."""
        if isinstance(keys, (pd.Series, pd.Categorical, pd.CategoricalIndex)) and isinstance(keys.dtype, pd.CategoricalDtype) and self._cats is not None:
            cat = keys.dtype.categories
            if cat is self._cats or cat.equals(self._cats):
                codes = np.asarray(keys.cat.codes if isinstance(keys, pd.Series) else keys.codes)
                if len(codes) and codes.min() < 0:
                    msg = f"columnar computation {self._runner.name!r}: {what}: a key is missing (NaN)"
                    raise ComputationError(msg)
                return self._kb_arr[codes].tolist()
            keys = np.asarray(keys, dtype=object)
        if self._kb_of is None:
            key_of = self._key_of
            self._kb_of = {key_of[kb]: kb for kb in self._kbs}
        kb_of = self._kb_of
        out = []
        for k in keys.tolist() if hasattr(keys, "tolist") else list(keys):
            kb = kb_of.get(k) if type(k) is not list else None
            if kb is None:
                why = key_problem(k)
                detail = why if why is not None else f"key {short_repr(k)} is not one of this call's keys (a computation changes only the keys it was given)"
                msg = f"columnar computation {self._runner.name!r}: {what}: {detail}"
                raise ComputationError(msg)
            out.append(kb)
        return out

    def _timestamps(self, timestamps: Any, n: int, what: str, *, upper: int = MAX_TIMESTAMP - 1) -> np.ndarray:
        arr = np.asarray(timestamps)
        if arr.shape != (n,):
            msg = f"columnar computation {self._runner.name!r}: {what}: {n} keys but timestamps of shape {arr.shape}"
            raise ComputationError(msg)
        if n and arr.dtype.kind not in "iu":
            msg = f"columnar computation {self._runner.name!r}: {what}: timestamps must be ints (ms since epoch), got dtype {arr.dtype}"
            raise ComputationError(msg)
        arr = arr.astype(np.int64, copy=False) if arr.dtype.kind == "i" else arr.astype(np.int64)
        if n and (int(arr.min()) <= MIN_TIMESTAMP or int(arr.max()) > upper):
            msg = f"columnar computation {self._runner.name!r}: {what}: a timestamp is outside the 64-bit range of millwheel timestamps"
            raise ComputationError(msg)
        return arr

    # -- changing --------------------------------------------------------------------
    def set_state(self, rows: pd.DataFrame, keys: Any = None) -> None:
        """The state of ``keys`` (default: every key of this call) becomes their rows in
        ``rows`` (a frame with a ``key`` column); a key without rows keeps no state."""
        if not isinstance(rows, pd.DataFrame) or "key" not in rows.columns:
            msg = f"columnar computation {self._runner.name!r}: set_state takes a pandas DataFrame with a 'key' column"
            raise ComputationError(msg)
        replaced = set(self._kbs) if keys is None else set(self._kb(keys, "set_state(keys=...)"))
        kbs = self._kb(rows["key"], "set_state")
        if not replaced.issuperset(kbs):
            msg = f"columnar computation {self._runner.name!r}: set_state has rows of keys outside keys=..."
            raise ComputationError(msg)
        table = None
        if len(rows):
            try:
                table = _to_arrow(rows)
            except Exception as exc:
                msg = f"columnar computation {self._runner.name!r}: set_state: the rows cannot be stored as Arrow columns: {type(exc).__name__}: {str(exc)[:200]}"
                raise StateCodecError(msg) from None
            table = table.add_column(0, "_kb", pa.array(kbs, pa.binary()))
        self._set_state.append((replaced, table))
        self._state_cache = None

    def set_timers(self, keys: Any, tags: Any, timestamps: Any, domain: TimeDomain = TimeDomain.LOW_WATERMARK) -> None:
        """Set (or replace: same key and tag) one timer per row (§4.6)."""
        kbs = self._kb(keys, "set_timers")
        tag_l = tags.tolist() if hasattr(tags, "tolist") else list(tags)
        if len(tag_l) != len(kbs) or any(type(t) is not str for t in tag_l):
            msg = f"columnar computation {self._runner.name!r}: set_timers takes one str tag per key ({len(kbs)} keys, {len(tag_l)} tags)"
            raise ComputationError(msg)
        d = int(domain) if isinstance(domain, int) else -1
        if d not in (_LW, _WALL):
            msg = f"columnar computation {self._runner.name!r}: set_timers domain must be a TimeDomain, got {domain!r}"
            raise ComputationError(msg)
        ts = self._timestamps(timestamps, len(kbs), "set_timers", upper=MAX_TIMESTAMP if d == _LW else MAX_TIMESTAMP - 1)
        self._timer_ops.append(("set", kbs, tag_l, ts.tolist(), d))

    def delete_timers(self, keys: Any, tags: Any) -> None:
        """Cancel timers ``(key, tag)``; no error for one that is not set."""
        kbs = self._kb(keys, "delete_timers")
        tag_l = tags.tolist() if hasattr(tags, "tolist") else list(tags)
        self._timer_ops.append(("delete", kbs, tag_l, None, None))

    def hold_watermark(self, keys: Any, timestamps: Sequence[int | None]) -> None:
        """Hold the low watermark per key (§7.2, ``Computation.hold_watermark``); ``None`` releases."""
        kbs = self._kb(keys, "hold_watermark")
        vals = timestamps.tolist() if hasattr(timestamps, "tolist") else list(timestamps)
        for kb, t in zip(kbs, vals, strict=True):
            if t is not None and (type(t) is not int or not MIN_TIMESTAMP < t < MAX_TIMESTAMP):
                msg = f"columnar computation {self._runner.name!r}: hold_watermark takes int timestamps (ms) or None, got {short_repr(t)}"
                raise ComputationError(msg)
            self._holds[kb] = t

    def produce(self, stream: str, values: Sequence[Any], *, keys: Any, timestamps: Any = None) -> None:
        """Productions to ``stream``, one per value, each for its key (the key whose
        sequence numbers its id); ``timestamps`` default to the low watermark."""
        runner = self._runner
        if stream not in runner.outputs:
            declared = ", ".join(sorted(runner.outputs)) or "none"
            msg = (
                f"computation {runner.name!r} produced to stream {stream!r}, which it does not declare "
                f"(declared outputs: {declared}); add it to outputs=[...] in Topology.computation"
            )
            raise ComputationError(msg)
        kbs = self._kb(keys, f"produce({stream!r})")
        vals = values.tolist() if isinstance(values, (pd.Series, np.ndarray)) else list(values)
        if len(vals) != len(kbs):
            msg = f"columnar computation {runner.name!r}: produce({stream!r}): {len(vals)} values for {len(kbs)} keys"
            raise ComputationError(msg)
        if timestamps is None:
            ts = np.full(len(kbs), production_time(self.low_watermark), np.int64)
        else:
            ts = self._timestamps(timestamps, len(kbs), f"produce({stream!r})")
        try:
            encoded = list(map(encode_value, vals))
        except StateCodecError as exc:
            msg = f"computation {runner.name!r}: produce({stream!r}): {exc}"
            raise ComputationError(msg) from None
        self._prod.append((stream, kbs, vals, encoded, ts))


# ------------------------------------------------------------------------------ the runner
@dataclass(slots=True)
class InputColumns:
    """One key interval's records of a batch, in delivery order."""

    kbs: list[bytes]
    ids: list[str]
    ts: np.ndarray
    streams: list[str]
    #: values, encoded (``encoded=True``) or as objects
    values: list[Any]
    #: the watermark each record arrived under (``None``: the batch's low watermark)
    arrival: list[int | None] | None = None
    encoded: bool = True

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(slots=True)
class ColumnarResult:
    """What one run over a key interval's batch returns."""

    store: bytes | None
    #: productions as columns, in the order user code made them
    streams: list[str]
    ids: list[str]
    ts: list[int]
    kbs: list[bytes]
    keys: list[Key]
    values: list[Any]
    encoded: list[bytes]
    dead_letters: list[Production]
    metrics: dict[str, int]
    hold: int | None
    next_low_watermark_timer: int | None
    next_wall_timer: int | None
    keys_kept: int
    #: per touched key (harness): (hold, next lw timer, next wall timer)
    key_summaries: dict[bytes, tuple[int | None, int | None, int | None]] | None = None

    def productions(self) -> list[Production]:
        return [
            Production(s, Record(k, v, t, i, s), e)
            for s, k, v, t, i, e in zip(self.streams, self.keys, self.values, self.ts, self.ids, self.encoded, strict=True)
        ]


class _CallFailed(Exception):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


METRIC_NAMES = (
    "records_in", "duplicates", "late", "late_dropped", "late_to_stream", "processed", "timers_fired",
    "timers_deferred", "productions", "productions_behind_watermark", "dead_letters", "dead_letters_dropped",
    "bloom_maybe", "bloom_false_positive", "dedup_gc_runs", "dedup_ids_collected",
)  # fmt: skip


class ColumnarRunner:
    """Runs a :class:`ColumnarComputation` over one key interval's batch (both backends)."""

    def __init__(self, computation: ColumnarComputation, *, name: str, outputs: Iterable[str], options: ComputationOptions | None = None) -> None:
        self.computation = computation
        self.name = name
        self.options = options or type(computation).options
        outs = set(outputs)
        if self.options.late.action is LateAction.TO_STREAM and self.options.late.stream:
            outs.add(self.options.late.stream)
        self.outputs = frozenset(outs)
        self.record_columns = tuple(c for c in RECORD_COLUMNS if c in computation.record_columns)
        computation.name = name

    # ---------------------------------------------------------------------------------
    def run(self, store: bytes | None, recs: InputColumns, *, low_watermark: int, now: int, key_summaries: bool = False) -> ColumnarResult:
        """Records of the batch (delivery order), then due timers; see the module docstring."""
        opts = self.options
        st = ColumnarStore.decode(store, opts)
        stats = DedupStats()
        c = dict.fromkeys(METRIC_NAMES, 0)
        out = _Outputs()
        dead: list[Production] = []
        n = c["records_in"] = len(recs)
        key_of: dict[bytes, Key] = {}
        lw = low_watermark
        touched: set[bytes] = set()
        horizon_wm = lw
        if n:
            kbs, ts = recs.kbs, recs.ts
            kcodes, uniques = pd.factorize(np.array(kbs + [b""], dtype=object)[:-1])  # codes in order of first appearance
            kcodes = kcodes.astype(np.int64, copy=False)
            uniq = uniques.tolist()
            for kb in uniq:
                key_of[kb] = decode_key(kb)
            touched.update(key_of)
            if DEAD_LETTER_STREAM in set(recs.streams):
                not_dead = np.array([s != DEAD_LETTER_STREAM for s in recs.streams], np.bool_)
            else:
                not_dead = np.ones(n, np.bool_)
            if recs.arrival is None:
                late_wm = np.full(n, lw, np.int64)
            else:
                late_wm = np.fromiter((lw if a is None else a for a in recs.arrival), np.int64, n)
            late_wm = np.where(not_dead, late_wm, MIN_TIMESTAMP)
            if not_dead.any():
                horizon_wm = min(lw, int(late_wm[not_dead].min()))
            late = ts < late_wm
            if opts.exactly_once:
                # a late record is remembered under the watermark it was late for: a re-delivery is a duplicate
                stamps = chunk_stamps(kbs, np.maximum(ts, late_wm), opts.dedup.gc_interval_ms, kcodes)
                keep = st.dedup.admit(recs.ids, kbs, stamps, stats, fingerprints(recs.ids, kbs, kcodes, uniq), kcodes, uniq)
            else:
                keep = np.ones(n, np.bool_)
            c["duplicates"] = int(n - keep.sum())
            late &= keep
            c["late"] = int(late.sum())
            action = opts.late.action
            admit = keep.copy()
            if c["late"] and action is not LateAction.PROCESS:
                admit &= ~late
                if action is LateAction.DROP:
                    c["late_dropped"] = c["late"]
                else:
                    c["late_to_stream"] = c["late"]
                    for i in np.flatnonzero(late).tolist():
                        v = recs.values[i]
                        enc = v if recs.encoded else encode_value(v)
                        dec = decode_value(v) if recs.encoded else v
                        out.add(opts.late.stream, kbs[i], key_of[kbs[i]], dec, enc, int(ts[i]), recs.ids[i])  # type: ignore[arg-type]
            if admit.all():
                idx, codes, order = np.arange(n), kcodes, uniq
            else:
                idx = np.flatnonzero(admit)
                sub, present = pd.factorize(kcodes[idx])
                codes, order = sub.astype(np.int64, copy=False), [uniq[k] for k in present.tolist()]
            if len(idx):
                # grouped by key, keys in order of first appearance, each key's records in delivery order
                srt = np.argsort(codes, kind="stable")
                c["processed"] += self._records(st, recs, idx[srt], codes[srt], order, key_of, lw, now, out, dead)
        self._timers(st, key_of, lw, now, out, dead, c, touched)
        # ---- checkpoint ----
        if opts.exactly_once:
            st.dedup.collect(horizon_wm - opts.dedup.slack_ms, opts.dedup.gc_interval_ms, stats, list(touched))
        prods = out.finish(self, st, lw, c)
        if opts.strong_productions and prods.ids:
            st.pending.extend([s, kb, e, t, i] for s, kb, e, t, i in zip(prods.streams, prods.kbs, prods.encoded, prods.ts, prods.ids, strict=True))
        st.forget_empty(touched)
        letters = [d for d in dead if d is not None]
        c["dead_letters"] = len(letters)
        c["dead_letters_dropped"] = len(dead) - len(letters)
        c["bloom_maybe"], c["bloom_false_positive"] = stats.bloom_maybe, stats.bloom_false_positive
        c["dedup_gc_runs"], c["dedup_ids_collected"] = stats.gc_runs, stats.ids_collected
        hold, nlw, nwall, kept = st.summary()
        summaries = st.key_summary(touched | set(prods.kbs)) if key_summaries else None
        return ColumnarResult(
            st.encode(), prods.streams, prods.ids, prods.ts, prods.kbs, prods.keys, prods.values, prods.encoded,
            letters, c, hold, nlw, nwall, kept, summaries,
        )  # fmt: skip

    # ---------------------------------------------------------------------------------
    def _frame(self, recs: InputColumns, idx: np.ndarray, key_of: dict[bytes, Key], order: list[bytes], codes: np.ndarray | None = None) -> pd.DataFrame:
        il = idx.tolist()
        cols: dict[str, Any] = {}
        for name in self.record_columns:
            if name == "key":
                keys = [key_of[kb] for kb in order]
                if codes is None:
                    kbs = recs.kbs
                    index = {kb: i for i, kb in enumerate(order)}
                    codes = np.fromiter(map(index.__getitem__, [kbs[i] for i in il]), np.int64, len(il))
                cols["key"] = _key_column(codes, keys, _categories(keys))
            elif name == "id":
                ids = recs.ids
                cols["id"] = [ids[i] for i in il]
            elif name == "timestamp":
                cols["timestamp"] = recs.ts[idx]
            elif name == "stream":
                ss = recs.streams
                cols["stream"] = [ss[i] for i in il]
            else:
                vs = recs.values
                cols["value"] = [decode_value(vs[i]) for i in il] if recs.encoded else [vs[i] for i in il]
        return pd.DataFrame(cols)

    def _call(self, st: ColumnarStore, kbs: list[bytes], key_of: dict[bytes, Key], rows: pd.DataFrame | None, timers: pd.DataFrame | None, lw: int, now: int, out: _Outputs) -> None:
        """One call of user code, applied all or nothing; raises :class:`_CallFailed`."""
        batch = Batch(self, st, kbs, key_of, rows, lw, now)
        try:
            if timers is None:
                self.computation.process_batch(batch)
            else:
                self.computation.process_timers(batch, timers)
        except Exception as exc:
            raise _CallFailed(exc) from None
        # ---- apply ----
        for replaced, table in batch._set_state:
            cur = st.state
            if cur is not None and cur.num_rows:
                cur = cur.filter(pc.invert(pc.is_in(cur.column("_kb"), value_set=pa.array(list(replaced), pa.binary()))))
            if table is None:
                st.state = cur
            elif cur is None or cur.num_rows == 0:
                st.state = table
            else:
                st.state = pa.concat_tables([cur, table], promote_options="permissive")
        timers_d = st.timers
        for op, tkbs, tags, tss, d in batch._timer_ops:
            if op == "set":
                timers_d.update(zip(zip(tkbs, tags, strict=True), [(t, d) for t in tss], strict=True))
            else:
                for k in zip(tkbs, tags, strict=True):
                    timers_d.pop(k, None)
        for kb, t in batch._holds.items():
            m = st.meta.get(kb)
            if m is None:
                if t is not None:
                    st.meta[kb] = [0, t]
            else:
                m[1] = t
        for stream, pkbs, vals, enc, ts in batch._prod:
            out.extend(stream, pkbs, [key_of[kb] for kb in pkbs], vals, enc, ts)

    def _fail(self, exc: BaseException) -> None:
        if self.options.on_error is ErrorPolicy.RAISE:
            raise exc

    def _records(
        self, st: ColumnarStore, recs: InputColumns, idx: np.ndarray, codes: np.ndarray, order: list[bytes], key_of: dict[bytes, Key],
        lw: int, now: int, out: _Outputs, dead: list[Any],
    ) -> int:  # fmt: skip
        """The admitted records ``idx`` (grouped by key: ``codes`` into ``order``), in one call; on failure per key, then per record."""
        kbs = recs.kbs
        try:
            self._call(st, order, key_of, self._frame(recs, idx, key_of, order, codes), None, lw, now, out)
            return len(idx)
        except _CallFailed as failed:
            self._fail(failed.exc)
        # careful: per key, then per record for a key whose call fails
        processed = 0
        per_key: dict[bytes, list[int]] = {}
        for i in idx.tolist():
            per_key.setdefault(kbs[i], []).append(i)
        for kb, rows in per_key.items():
            sub = np.array(rows, np.int64)
            try:
                self._call(st, [kb], key_of, self._frame(recs, sub, key_of, [kb]), None, lw, now, out)
                processed += len(rows)
                continue
            except _CallFailed:
                pass
            for i in rows:
                try:
                    self._call(st, [kb], key_of, self._frame(recs, np.array([i]), key_of, [kb]), None, lw, now, out)
                    processed += 1
                except _CallFailed as failed:
                    v = recs.values[i]
                    rec = Record(key_of[kb], decode_value(v) if recs.encoded else v, int(recs.ts[i]), recs.ids[i], recs.streams[i])
                    dead.append(self._dead_letter(key_of[kb], failed.exc, Stage.PROCESS_RECORD, rec, None, now))
        return processed

    def _timers(self, st: ColumnarStore, key_of: dict[bytes, Key], lw: int, now: int, out: _Outputs, dead: list[Any], c: dict[str, int], touched: set[bytes]) -> None:
        budget = self.options.max_timer_fires_per_step
        fired: dict[bytes, int] = {}
        while st.timers:
            due = [(kb, ts, d, tag) for (kb, tag), (ts, d) in st.timers.items() if ts <= (lw if d == _LW else now)]
            if not due:
                return
            due.sort()  # per key, by timestamp, domain, tag
            firing = []
            for kb, ts, d, tag in due:
                item = (kb, tag, ts, d)
                k = fired.get(kb, 0)
                if k >= budget:
                    continue
                fired[kb] = k + 1
                firing.append(item)
            if not firing:
                c["timers_deferred"] += len(due)
                return
            for kb, tag, _, _ in firing:
                del st.timers[(kb, tag)]
                if kb not in key_of:
                    key_of[kb] = decode_key(kb)
                touched.add(kb)
            frame = _timer_frame(firing, key_of)
            order = list(dict.fromkeys(x[0] for x in firing))
            try:
                self._call(st, order, key_of, None, frame, lw, now, out)
                c["timers_fired"] += len(firing)
                continue
            except _CallFailed as failed:
                self._fail(failed.exc)
            by_key: dict[bytes, list[Any]] = {}
            for item in firing:
                by_key.setdefault(item[0], []).append(item)
            for kb, items in by_key.items():
                try:
                    self._call(st, [kb], key_of, None, _timer_frame(items, key_of), lw, now, out)
                    c["timers_fired"] += len(items)
                    continue
                except _CallFailed:
                    pass
                for item in items:
                    try:
                        self._call(st, [kb], key_of, None, _timer_frame([item], key_of), lw, now, out)
                        c["timers_fired"] += 1
                    except _CallFailed as failed:  # the timer stays deleted: it is dead-lettered
                        timer = Timer(item[1], item[2], TimeDomain(item[3]))
                        dead.append(self._dead_letter(key_of[kb], failed.exc, Stage.PROCESS_TIMER, None, timer, now))

    def _dead_letter(self, key: Key, exc: BaseException, stage: str, rec: Record | None, timer: Timer | None, now: int) -> Production | None:
        """As ``StepRunner._dead_letter``: the same ids for the same failure."""
        if rec is not None and rec.stream == DEAD_LETTER_STREAM:
            return None
        letter = DeadLetter(stage, reason_of(exc), computation=self.name, stream=rec.stream if rec else None, key=key, record=rec, timer=timer)
        if timer is not None:
            ts, parts = timer.timestamp, (key, timer.tag, timer.timestamp, int(timer.domain))
        else:
            ts, parts = (rec.timestamp if rec is not None else now), (rec.id if rec is not None else key,)
        return Production(DEAD_LETTER_STREAM, dead_letter_record(letter, ts, *parts))

    def acknowledge(self, store: bytes | None, ids: Iterable[str] | None = None) -> tuple[bytes | None, dict[bytes, tuple[int | None, int | None, int | None]]]:
        """Drop delivered strong productions (all if ``ids`` is None); the new store and the summaries of their keys."""
        st = ColumnarStore.decode(store, self.options)
        if not st.pending:
            return store, {}
        keys = {p[1] for p in st.pending}
        if ids is None:
            st.pending = []
        else:
            acked = set(ids)
            st.pending = [p for p in st.pending if p[4] not in acked]
        st.forget_empty(keys)
        return st.encode(), st.key_summary(keys)

    def pending(self, store: bytes | None) -> list[tuple[bytes, Production]]:
        """Strong productions checkpointed and not yet acknowledged, with their keys' bytes."""
        st = ColumnarStore.decode(store, self.options)
        out = []
        for stream, kb, enc, ts, rid in st.pending:
            key = decode_key(kb)
            out.append((kb, Production(stream, Record(key, decode_value(enc), ts, rid, stream), enc)))
        return out


def _timer_frame(items: list[tuple[bytes, str, int, int]], key_of: dict[bytes, Key]) -> pd.DataFrame:
    order = list(dict.fromkeys(i[0] for i in items))
    index = {kb: n for n, kb in enumerate(order)}
    keys = [key_of[kb] for kb in order]
    return pd.DataFrame({
        "key": _key_column(np.fromiter((index[i[0]] for i in items), np.int64, len(items)), keys, _categories(keys)), "tag": [i[1] for i in items],
        "timestamp": np.fromiter((i[2] for i in items), np.int64, len(items)),
        "domain": np.fromiter((i[3] for i in items), np.int8, len(items)),
    })  # fmt: skip


class _Outputs:
    """Productions of one run, as columns; ids assigned at the end from the per-key sequences."""

    __slots__ = ("streams", "kbs", "keys", "values", "encoded", "ts", "fixed_ids")

    def __init__(self) -> None:
        self.streams: list[str] = []
        self.kbs: list[bytes] = []
        self.keys: list[Key] = []
        self.values: list[Any] = []
        self.encoded: list[bytes] = []
        self.ts: list[int] = []
        #: position -> id, for outputs that keep their own id (late records to a stream)
        self.fixed_ids: dict[int, str] = {}

    def add(self, stream: str, kb: bytes, key: Key, value: Any, enc: bytes, ts: int, rid: str) -> None:
        self.fixed_ids[len(self.streams)] = rid
        self.streams.append(stream)
        self.kbs.append(kb)
        self.keys.append(key)
        self.values.append(value)
        self.encoded.append(enc)
        self.ts.append(ts)

    def extend(self, stream: str, kbs: list[bytes], keys: list[Key], values: list[Any], enc: list[bytes], ts: np.ndarray) -> None:
        self.streams += [stream] * len(kbs)
        self.kbs += kbs
        self.keys += keys
        self.values += values
        self.encoded += enc
        self.ts += ts.tolist()

    def finish(self, runner: ColumnarRunner, st: ColumnarStore, lw: int, c: dict[str, int]) -> _Produced:
        meta = st.meta
        seqs: dict[bytes, int] = {}
        ids: list[str] = []
        name = runner.name
        fixed = self.fixed_ids
        behind = 0
        for i, (kb, key) in enumerate(zip(self.kbs, self.keys, strict=True)):
            rid = fixed.get(i)
            if rid is not None:
                ids.append(rid)
                continue
            s = seqs.get(kb)
            if s is None:
                m = meta.get(kb)
                s = 0 if m is None else m[0]
            ids.append(production_id(name, key, s))
            seqs[kb] = s + 1
        for kb, s in seqs.items():
            m = meta.get(kb)
            if m is None:
                meta[kb] = [s, None]
            else:
                m[0] = s
        n = len(self.kbs) - len(fixed)
        c["productions"] = n
        if n:
            ts = np.asarray(self.ts, np.int64)
            if fixed:
                mask = np.ones(len(ts), np.bool_)
                mask[list(fixed)] = False
                ts = ts[mask]
            behind = int((ts < lw).sum())
        c["productions_behind_watermark"] = behind
        return _Produced(self.streams, ids, self.ts, self.kbs, self.keys, self.values, self.encoded)


@dataclass(slots=True)
class _Produced:
    streams: list[str]
    ids: list[str]
    ts: list[int]
    kbs: list[bytes]
    keys: list[Key]
    values: list[Any]
    encoded: list[bytes]

