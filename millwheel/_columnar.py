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
* **production ids** (§6.1.2): ``production_id(computation, key, seq, life)`` with the
  per-key sequence and the key's life kept in the store (``_identity.py``): a replay of
  the batch assigns the same ids, a key forgotten and made again in a later batch never
  repeats one, and a columnar computation that produces what a per-record one does, in
  the same per-key order and batches, produces the same records.

What the framework keeps per key interval (the harness: per computation) is one blob, the
*columnar store* (:class:`ColumnarStore`): the user's state as an Arrow table with a key
column, the timers, each key's production sequence, life and hold, pending strong productions,
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
RunResult(counts=2, q=3)
>>> sorted(h.values("counts")), h.metrics("Count")["duplicates"]
([('cats', 1), ('dogs', 1)], 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from millwheel._codec import decode_value, encode_value
from millwheel._colbatch import Batch, _categories, _key_column
from millwheel._coldedup import chunk_stamps, fingerprints
from millwheel._colinput import InputColumns, factorize
from millwheel._colout import Outputs
from millwheel._colsegments import SegmentFiles
from millwheel._colstore import STORE_MAGIC, STORE_VERSION, ColumnarStore
from millwheel._computation import Computation
from millwheel._deadletter import (
    DEAD_LETTER_STREAM,
    DeadLetter,
    Stage,
    dead_letter_record,
    reason_of,
)
from millwheel._envelope import DedupStats
from millwheel._errors import ComputationError
from millwheel._fields import (
    FIELD_PREFIX,
    StreamFields,
    decode_cell,
    field_column,
    field_type,
    requested_fields,
)
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
)

_LW = int(TimeDomain.LOW_WATERMARK)
_WALL = int(TimeDomain.WALL_TIME)
_LAST = MAX_TIMESTAMP - 1
#: decoded keys a runner keeps (``ColumnarRunner._decode_key``); past it, it starts again
_KEYS_KEPT = 1 << 20

RECORD_COLUMNS = ("key", "id", "timestamp", "stream", "value")
TIMER_COLUMNS = ("key", "tag", "timestamp", "domain")


class ColumnarComputation(Computation):
    """Base class of columnar computations: override :meth:`process_batch` (and
    :meth:`process_timers` if you set timers). See the module docstring.

    ``record_columns`` lists the columns :attr:`Batch.records` carries; leave ``"value"``
    out and values are never decoded (a count needs only keys and timestamps).
    ``"value.<field>"`` asks for one field of the values (``millwheel/_fields.py``): on a
    stream that declares its fields, read from the file's columns without unpickling; a
    value stored pickled gives its field, a missing field or a value that is not a
    mapping gives null.
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


# ------------------------------------------------------------------------------ the runner
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
    #: per production: its ``once_id`` (Photon §2) or ``None``, and whether it is tentative (``None``: no once-productions)
    once_ids: list[str | None] | None = None
    once_tentative: list[bool] | None = None
    #: the store after the run, decoded (a caller that keeps it skips the next decode; with
    #: ``run(encode=False)`` the only form of it: ``store`` is then ``None``)
    decoded: ColumnarStore | None = None

    def productions(self) -> list[Production]:
        n = len(self.ids)
        once = self.once_ids or [None] * n
        tent = self.once_tentative or [False] * n
        return [
            Production(s, Record(k, v, t, i, s), e, o, f)
            for s, k, v, t, i, e, o, f in zip(
                self.streams,
                self.keys,
                self.values,
                self.ts,
                self.ids,
                self.encoded,
                once,
                tent,
                strict=True,
            )
        ]

    def drop(self, ids: set[str]) -> None:
        """Drop the productions ``ids`` (once-productions another pipeline holds)."""
        keep = [i not in ids for i in self.ids]
        for name in (
            "streams",
            "ids",
            "ts",
            "kbs",
            "keys",
            "values",
            "encoded",
            "once_ids",
            "once_tentative",
        ):
            col = getattr(self, name)
            if col is not None:
                setattr(self, name, [x for x, k in zip(col, keep, strict=True) if k])


class _CallFailed(Exception):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


METRIC_NAMES = (
    "records_in",
    "duplicates",
    "late",
    "late_dropped",
    "late_to_stream",
    "processed",
    "timers_fired",
    "timers_deferred",
    "productions",
    "productions_behind_watermark",
    "dead_letters",
    "dead_letters_dropped",
    "bloom_maybe",
    "bloom_false_positive",
    "dedup_gc_runs",
    "dedup_ids_collected",
)


class ColumnarRunner:
    """Runs a :class:`ColumnarComputation` over one key interval's batch (both backends)."""

    def __init__(
        self,
        computation: ColumnarComputation,
        *,
        name: str,
        outputs: Iterable[str],
        options: ComputationOptions | None = None,
        fields: Mapping[str, StreamFields] | None = None,
    ) -> None:
        self.computation = computation
        self.name = name
        self.options = options or type(computation).options
        outs = set(outputs)
        if self.options.late.action is LateAction.TO_STREAM and self.options.late.stream:
            outs.add(self.options.late.stream)
        self.outputs = frozenset(outs)
        asked = requested_fields(computation.record_columns)
        self.record_columns = tuple(
            c for c in RECORD_COLUMNS if c in computation.record_columns
        ) + tuple(FIELD_PREFIX + f for f in asked)
        #: ``value.<field>`` columns and their types over the declared input streams (``fields``: stream -> its declaration)
        self.value_fields = {
            f: field_type((fields or {}).values(), f, f"columnar computation {name!r}")
            for f in asked
        }
        computation.name = name
        #: encoded key -> key, for the keys of the runs so far (a key is decoded once, not in every batch)
        self._keys: dict[bytes, Key] = {}

    def _decode_key(self, kb: bytes) -> Key:
        key = self._keys.get(kb)
        if key is None:
            if len(self._keys) >= _KEYS_KEPT:
                self._keys.clear()
            key = self._keys[kb] = decode_key(kb)
        return key

    # ---------------------------------------------------------------------------------
    def run(
        self,
        store: bytes | ColumnarStore | None,
        recs: InputColumns,
        *,
        low_watermark: int,
        now: int,
        key_summaries: bool = False,
        encode: bool = True,
        files: SegmentFiles | None = None,
        life: int | None = None,
    ) -> ColumnarResult:
        """Records of the batch (delivery order), then due timers; see the module docstring.

        ``store``: the interval's blob, or a decoded :class:`ColumnarStore` that the run
        changes in place (the Arrow mapping's worker cache, the harness). The result's
        ``decoded`` is the store after the run; with ``encode=False`` (the harness, which
        keeps it decoded) ``store`` is not encoded, nor are the whole store's hold and next
        timers summarised, only ``key_summaries``. ``files``: where the store's held-id
        segments are written (``_colsegments.py``; ``None``: inside the blob). ``life``: the
        life a key the store holds nothing for starts (``_identity.py``; ``None``: none known)."""
        opts = self.options
        live = not encode
        st = ColumnarStore.of(store, opts)
        stats = DedupStats()
        c = dict.fromkeys(METRIC_NAMES, 0)
        out = Outputs(life)
        dead: list[Production] = []
        n = c["records_in"] = len(recs)
        key_of: dict[bytes, Key] = {}
        lw = low_watermark
        touched: set[bytes] = set()
        horizon_wm = lw
        if n:
            ts, kcodes, uniq = (
                recs.ts,
                recs.codes,
                recs.uniques,
            )  # key codes in order of first appearance
            key_of.update(zip(uniq, map(self._decode_key, uniq), strict=True))
            touched.update(key_of)
            not_dead = recs.not_stream(DEAD_LETTER_STREAM)
            late_wm = np.where(not_dead, recs.arrival_watermarks(lw), MIN_TIMESTAMP)
            if not_dead.any():
                horizon_wm = min(lw, int(late_wm[not_dead].min()))
            late = ts < late_wm
            if opts.exactly_once:
                # a late record is remembered under the watermark it was late for: a re-delivery is a duplicate
                stamps = chunk_stamps(
                    None, np.maximum(ts, late_wm), opts.dedup.gc_interval_ms, kcodes
                )
                keep = st.dedup.admit(
                    recs.ids,
                    None,
                    stamps,
                    stats,
                    fingerprints(recs.ids, None, kcodes, uniq),
                    kcodes,
                    uniq,
                )
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
                        v = recs.value(i)
                        dec = decode_cell(v) if recs.encoded else v
                        enc = v if type(v) is bytes else encode_value(dec)
                        kb = recs.kb(i)
                        out.add(opts.late.stream, kb, key_of[kb], dec, enc, int(ts[i]), recs.id(i))  # type: ignore[arg-type]
            if admit.all():
                idx, codes, order = np.arange(n), kcodes, uniq
            else:
                idx = np.flatnonzero(admit)
                sub, present = pd.factorize(kcodes[idx])
                codes, order = sub.astype(np.int64, copy=False), [uniq[k] for k in present.tolist()]
            if len(idx):
                # grouped by key, keys in order of first appearance, each key's records in delivery order
                srt = np.argsort(codes, kind="stable")
                c["processed"] += self._records(
                    st, recs, idx[srt], codes[srt], order, key_of, lw, now, out, dead
                )
        self._timers(st, key_of, lw, now, out, dead, c, touched)
        # ---- checkpoint ----
        if opts.exactly_once:
            st.dedup.collect(
                horizon_wm - opts.dedup.slack_ms, opts.dedup.gc_interval_ms, stats, list(touched)
            )
        prods = out.finish(self, st, lw, c)
        if opts.strong_productions and prods.ids:
            st.pending.extend(
                [s, kb, e, t, i]
                for s, kb, e, t, i in zip(
                    prods.streams, prods.kbs, prods.encoded, prods.ts, prods.ids, strict=True
                )
            )
        st.forget_empty(touched)
        letters = [d for d in dead if d is not None]
        c["dead_letters"] = len(letters)
        c["dead_letters_dropped"] = len(dead) - len(letters)
        c["bloom_maybe"], c["bloom_false_positive"] = stats.bloom_maybe, stats.bloom_false_positive
        c["dedup_gc_runs"], c["dedup_ids_collected"] = stats.gc_runs, stats.ids_collected
        hold, nlw, nwall, kept = (None, None, None, 0) if live else st.summary()
        summaries = st.key_summary(touched | set(prods.kbs)) if key_summaries else None
        return ColumnarResult(
            None if live else st.encode(files),
            prods.streams,
            prods.ids,
            prods.ts,
            prods.kbs,
            prods.keys,
            prods.values,
            prods.encoded,
            letters,
            c,
            hold,
            nlw,
            nwall,
            kept,
            summaries,
            prods.once_ids,
            prods.once_tentative,
            st,
        )

    # ---------------------------------------------------------------------------------
    def _frame(
        self,
        recs: InputColumns,
        idx: np.ndarray,
        key_of: dict[bytes, Key],
        order: list[bytes],
        codes: np.ndarray | None = None,
    ) -> pd.DataFrame:
        il = idx.tolist()
        cols: dict[str, Any] = {}
        values: list[Any] | None = None
        for name in self.record_columns:
            if name == "key":
                keys = [key_of[kb] for kb in order]
                if codes is None:
                    index = {kb: i for i, kb in enumerate(order)}
                    codes = np.array([index.get(kb, -1) for kb in recs.uniques], np.int64)[
                        recs.codes[idx]
                    ]
                cols["key"] = _key_column(codes, keys, _categories(keys))
            elif name == "id":
                cols["id"] = recs.ids_at(il)
            elif name == "timestamp":
                cols["timestamp"] = recs.ts[idx]
            elif name == "stream":
                cols["stream"] = recs.streams_at(il)
            elif name == "value":
                cols["value"] = values = _values(recs, il, values)
            else:
                f = name[len(FIELD_PREFIX) :]
                values = _values(recs, il, values)
                cols[name] = field_column(values, f, self.value_fields[f])
        return pd.DataFrame(cols)

    def _call(
        self,
        st: ColumnarStore,
        kbs: list[bytes],
        key_of: dict[bytes, Key],
        rows: pd.DataFrame | None,
        timers: pd.DataFrame | None,
        lw: int,
        now: int,
        out: Outputs,
    ) -> None:
        """One call of user code, applied all or nothing; raises :class:`_CallFailed`."""
        frame = rows if rows is not None else timers
        keys = None if frame is None else frame["key"].array
        # the key column's categories are the call's keys in order: the batch shares them (``Batch._codes`` then
        # recognises the user's key columns by identity, not by comparing every key)
        batch = Batch(
            self,
            st,
            kbs,
            key_of,
            rows,
            lw,
            now,
            keys.categories if isinstance(keys, pd.Categorical) else None,
        )
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
                cur = cur.filter(
                    pc.invert(
                        pc.is_in(cur.column("_kb"), value_set=pa.array(list(replaced), pa.binary()))
                    )
                )
            if table is None:
                st.state = cur
            elif cur is None or cur.num_rows == 0:
                st.state = table
            else:
                st.state = pa.concat_tables([cur, table], promote_options="permissive")
        for op, tkbs, tags, tss, d in batch._timer_ops:
            st.timers = (
                st.timers.set_many(tkbs, tags, tss, d)
                if op == "set"
                else st.timers.delete_many(tkbs, tags)
            )
        for kb, t in batch._holds.items():
            m = st.meta.get(kb)
            if m is None:
                if t is not None:
                    st.meta[kb] = [0, t]  # its life starts at its first production (``_colout.py``)
            else:
                st.meta[kb] = [
                    m[0],
                    t,
                    *m[2:],
                ]  # replaced, never changed in place: copies share the lists
        for stream, pkbs, vals, enc, ts, once, tentative in batch._prod:
            out.extend(stream, pkbs, [key_of[kb] for kb in pkbs], vals, enc, ts, once, tentative)

    def _fail(self, exc: BaseException) -> None:
        if self.options.on_error is ErrorPolicy.RAISE:
            raise exc

    def _records(
        self,
        st: ColumnarStore,
        recs: InputColumns,
        idx: np.ndarray,
        codes: np.ndarray,
        order: list[bytes],
        key_of: dict[bytes, Key],
        lw: int,
        now: int,
        out: Outputs,
        dead: list[Any],
    ) -> int:
        """The admitted records ``idx`` (grouped by key: ``codes`` into ``order``), in one call; on failure per key, then per record."""
        try:
            self._call(
                st, order, key_of, self._frame(recs, idx, key_of, order, codes), None, lw, now, out
            )
            return len(idx)
        except _CallFailed as failed:
            self._fail(failed.exc)
        # careful: per key, then per record for a key whose call fails
        processed = 0
        per_key: dict[bytes, list[int]] = {}
        kbs = recs.kbs
        for i in idx.tolist():
            per_key.setdefault(kbs[i], []).append(i)
        for kb, rows in per_key.items():
            sub = np.array(rows, np.int64)
            try:
                self._call(
                    st, [kb], key_of, self._frame(recs, sub, key_of, [kb]), None, lw, now, out
                )
                processed += len(rows)
                continue
            except _CallFailed:
                pass
            for i in rows:
                try:
                    self._call(
                        st,
                        [kb],
                        key_of,
                        self._frame(recs, np.array([i]), key_of, [kb]),
                        None,
                        lw,
                        now,
                        out,
                    )
                    processed += 1
                except _CallFailed as failed:
                    v = recs.value(i)
                    rec = Record(
                        key_of[kb],
                        decode_cell(v) if recs.encoded else v,
                        int(recs.ts[i]),
                        recs.id(i),
                        recs.stream(i),
                    )
                    dead.append(
                        self._dead_letter(
                            key_of[kb], failed.exc, Stage.PROCESS_RECORD, rec, None, now
                        )
                    )
        return processed

    def _timers(
        self,
        st: ColumnarStore,
        key_of: dict[bytes, Key],
        lw: int,
        now: int,
        out: Outputs,
        dead: list[Any],
        c: dict[str, int],
        touched: set[bytes],
    ) -> None:
        budget = self.options.max_timer_fires_per_step
        fired: dict[bytes, int] = {}
        while st.timers:
            tt = st.timers
            due = tt.ordered(tt.due(lw, now))  # per key, by timestamp, domain, tag
            if not len(due):
                return
            # at most ``budget`` fires per key and step: each key's first due timers
            kcodes, kbs = factorize(tt.kb[due])
            starts = np.flatnonzero(np.r_[True, kcodes[1:] != kcodes[:-1]])
            rank = np.arange(len(due)) - np.repeat(starts, np.diff(np.r_[starts, len(due)]))
            before = np.fromiter(map(fired.get, kbs, [0] * len(kbs)), np.int64, len(kbs))
            go = before[kcodes] + rank < budget
            if not go.any():
                c["timers_deferred"] += len(due)
                return
            rows = due[go]
            counts = np.bincount(kcodes[go], minlength=len(kbs))
            moved = np.flatnonzero(counts)
            went = [kbs[i] for i in moved.tolist()]
            fired.update(zip(went, (before[moved] + counts[moved]).tolist(), strict=True))
            missing = [kb for kb in went if kb not in key_of]
            key_of.update(zip(missing, map(self._decode_key, missing), strict=True))
            touched.update(went)
            st.timers = tt.without(rows)
            f_kb, f_tag, f_ts, f_d = tt.kb[rows], tt.tag[rows], tt.ts[rows], tt.d[rows]
            frame, order = _timer_frame(f_kb, f_tag, f_ts, f_d, key_of)
            try:
                self._call(st, order, key_of, None, frame, lw, now, out)
                c["timers_fired"] += len(rows)
                continue
            except _CallFailed as failed:
                self._fail(failed.exc)
            firing = list(
                zip(f_kb.tolist(), f_tag.tolist(), f_ts.tolist(), f_d.tolist(), strict=True)
            )
            by_key: dict[bytes, list[Any]] = {}
            for item in firing:
                by_key.setdefault(item[0], []).append(item)
            for kb, items in by_key.items():
                try:
                    self._call(st, [kb], key_of, None, _timer_frame_of(items, key_of), lw, now, out)
                    c["timers_fired"] += len(items)
                    continue
                except _CallFailed:
                    pass
                for item in items:
                    try:
                        self._call(
                            st, [kb], key_of, None, _timer_frame_of([item], key_of), lw, now, out
                        )
                        c["timers_fired"] += 1
                    except _CallFailed as failed:  # the timer stays deleted: it is dead-lettered
                        timer = Timer(item[1], item[2], TimeDomain(item[3]))
                        dead.append(
                            self._dead_letter(
                                key_of[kb], failed.exc, Stage.PROCESS_TIMER, None, timer, now
                            )
                        )

    def _dead_letter(
        self,
        key: Key,
        exc: BaseException,
        stage: str,
        rec: Record | None,
        timer: Timer | None,
        now: int,
    ) -> Production | None:
        """As ``StepRunner._dead_letter``: the same ids for the same failure."""
        if rec is not None and rec.stream == DEAD_LETTER_STREAM:
            return None
        letter = DeadLetter(
            stage,
            reason_of(exc),
            computation=self.name,
            stream=rec.stream if rec else None,
            key=key,
            record=rec,
            timer=timer,
        )
        parts: tuple[Any, ...]
        if timer is not None:
            ts, parts = timer.timestamp, (key, timer.tag, timer.timestamp, int(timer.domain))
        else:
            ts, parts = (
                (rec.timestamp if rec is not None else now),
                (rec.id if rec is not None else key,),
            )
        return Production(DEAD_LETTER_STREAM, dead_letter_record(letter, ts, *parts))

    def acknowledge(
        self, store: Any, ids: Iterable[str] | None = None
    ) -> tuple[Any, dict[bytes, tuple[int | None, int | None, int | None]]]:
        """Drop delivered strong productions (all if ``ids`` is None); the new store (a
        decoded one: itself, changed) and the summaries of their keys."""
        st = ColumnarStore.of(store, self.options)
        if not st.pending:
            return store, {}
        keys = {p[1] for p in st.pending}
        if ids is None:
            st.pending = []
        else:
            acked = set(ids)
            st.pending = [p for p in st.pending if p[4] not in acked]
        st.forget_empty(keys)
        return st if isinstance(store, ColumnarStore) else st.encode(), st.key_summary(keys)

    def pending(self, store: bytes | ColumnarStore | None) -> list[tuple[bytes, Production]]:
        """Strong productions checkpointed and not yet acknowledged, with their keys' bytes."""
        st = ColumnarStore.of(store, self.options)
        out = []
        for stream, kb, enc, ts, rid in st.pending:
            key = decode_key(kb)
            out.append(
                (kb, Production(stream, Record(key, decode_value(enc), ts, rid, stream), enc))
            )
        return out


def _values(recs: InputColumns, il: list[int], done: list[Any] | None) -> list[Any]:
    """The values of rows ``il``, decoded (``done``: decoded already)."""
    if done is not None:
        return done
    vs = recs.values_at(il)
    return [decode_cell(v) for v in vs] if recs.encoded else vs


def _timer_frame(
    kb: np.ndarray, tag: np.ndarray, ts: np.ndarray, d: np.ndarray, key_of: dict[bytes, Key]
) -> tuple[pd.DataFrame, list[bytes]]:
    """The frame of timers firing (grouped by key) and its keys, in order."""
    codes, order = factorize(kb)
    keys = [key_of[k] for k in order]
    frame = pd.DataFrame(
        {
            "key": _key_column(codes, keys, _categories(keys)),
            "tag": tag.tolist(),
            "timestamp": ts.astype(np.int64),
            "domain": d.astype(np.int8),
        }
    )
    return frame, order


def _timer_frame_of(
    items: list[tuple[bytes, str, int, int]], key_of: dict[bytes, Key]
) -> pd.DataFrame:
    """:func:`_timer_frame` of ``(key, tag, timestamp, domain)`` items."""
    kb, tag, ts, d = (np.array(c, dtype=object) for c in zip(*items, strict=True))
    return _timer_frame(kb, tag, ts.astype(np.int64), d.astype(np.int8), key_of)[0]


__all__ = [
    "STORE_MAGIC",
    "STORE_VERSION",
    "Batch",
    "ColumnarComputation",
    "ColumnarResult",
    "ColumnarRunner",
    "ColumnarStore",
    "InputColumns",
    "is_columnar",
]
