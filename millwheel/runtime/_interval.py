"""The worker side: the consumer's keying, then the per-key step over one key interval (MillWheel §7.1).

This module is Arrow/pandas plumbing around the delivery core (``millwheel/_delivery.py``:
keying, step planning, due timers) and the per-key step (``millwheel/_step.py``), the same
calls the in-memory harness makes.

Spark groups a computation's input by *key interval* (a hash range of the consumer's
encoded key), not by raw key: each Spark group costs a pandas frame in and out, so one
group per key is two orders of magnitude slower (``docs/performance.md``).
:class:`IntervalBatch` is one interval's share of a micro-batch, whatever the state
layout: rows grouped by key in one pass, each key's records in send order, each value
decoded once, the step run per key, productions written with the bytes ``produce()``
made. :class:`IntervalStep` is the default layout (``applyInPandasWithState``): the
interval's GroupState row holds ``envs`` (key -> envelope, msgpack) and ``meta`` (key ->
[hold, next low-watermark timer, next wall timer]); a batch decodes the map once, steps
the keys that have input or due timers, and re-encodes the map; envelopes of untouched
keys stay opaque bytes, so they cost a copy, not a decode. ``_mapstate.py`` is the
per-key layout. Either way, state, timers and dedup ids of every key commit atomically
with Spark's state store at the end of the micro-batch (§6.2).

Time (§4.5, §4.6, §7.2):

* the **low watermark** is Spark's event-time watermark, which the driver drives with
  heartbeat rows carrying the framework's input low watermark (``withWatermark(..., "0
  seconds")``). It is recorded in Spark's offset log, so a replayed batch sees the same
  value. Low-watermark timers map onto Spark's single ``EventTimeTimeout`` per group: the
  earliest pending timer of the interval.
* **wall time** is the batch's processing time (also fixed per batch and replay); wall
  timers fire when a batch runs for the interval, and the driver sends a tick row to an
  interval whose earliest wall timer is due.

Productions are not kept pending in the envelope here: the runtime checkpoints them in the
batch's outbox, which commits with the state (see ``_query.py`` and ``docs/runtime.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from time import perf_counter
from typing import Any, NamedTuple

import msgpack
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from millwheel._codec import decode_value, encode_value
from millwheel._counters import StepMetrics
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._delivery import (
    KeyOutcome,
    commit_once,
    count_keying,
    key_record,
    run_key,
    timers_due,
)
from millwheel._fields import decode_cell
from millwheel._options import ErrorPolicy
from millwheel._record import MIN_TIMESTAMP, Production, Record, decode_key, encode_key
from millwheel._step import StepRunner
from millwheel._topology import ComputationSpec
from millwheel.runtime._fieldcols import output_schema, production_fields, with_values
from millwheel.runtime._groupstate import MemoryGroupState  # noqa: F401 - re-exported: tests and benches run steps with it
from millwheel.runtime._keying import Keyer, cached_key, dead_interval, wants_dead_letters
from millwheel.runtime._life import task_life
from millwheel.runtime._move import RescaleMismatch, install_envelopes, retire_group
from millwheel.runtime._wire import (
    OUT_SCHEMA,
    SUMMARY_STREAM,
    IntervalSummary,
    RowKind,
    from_spark,
    timer_timeout,
)

_packb = msgpack.packb
_unpackb = msgpack.unpackb


class KeyMeta(NamedTuple):
    """What an interval keeps beside a key's envelope, to find its due timers and its hold
    without decoding the envelope (stored as a msgpack list)."""

    hold: int | None
    next_low_watermark_timer: int | None
    next_wall_timer: int | None

    @classmethod
    def of(cls, outcome: KeyOutcome) -> KeyMeta | None:
        """``None``: the key has nothing to schedule (no entry)."""
        if outcome.envelope is None or outcome.keeps_nothing_to_schedule:
            return None
        return cls(outcome.hold, outcome.next_low_watermark_timer, outcome.next_wall_timer)


def unpack_meta(data: bytes) -> Any:
    """A msgpack map (or list holding one) whose lists are :class:`KeyMeta`."""
    return _unpackb(data, raw=False, strict_map_key=False, list_hook=_meta_or_list)


def _meta_or_list(items: list[Any]) -> Any:
    return KeyMeta._make(items) if len(items) == 3 else items


class _Row(NamedTuple):
    """One input row of a key, as :meth:`IntervalBatch.add_frame` keeps it until its key's
    step runs: sorting rows (tuples) sorts them in send order."""

    #: the sender watermark (``MIN_TIMESTAMP`` when unknown), then the file and the row in it
    order: int
    src: Any
    row: int
    id: str
    ts: int
    value: Any  # pickled, or the dict of its fields (``_fieldcols.with_values``)
    stream: str
    #: the sender watermark it arrived under (``None``: not known)
    sent: int | None


#: what the consumer's keying function returns per row (:func:`make_keying`), as a Spark type
KEYING_RESULT = "interval int, kind int, key binary, id string, ts long, value binary"
_KEYING_FIELDS = [
    pa.field("interval", pa.int32()),
    pa.field("kind", pa.int32()),
    pa.field("key", pa.binary()),
    pa.field("id", pa.string()),
    pa.field("ts", pa.int64()),
    pa.field("value", pa.binary()),
]


def key_row(
    consumer: str,
    stream: str,
    extractor: Callable[[Record], Any],
    intervals: int,
    cache: dict[Any, tuple[bytes, int]],
    pk: bytes | None,
    value: Any,
    ts: int,
    rid: str,
    on_error: ErrorPolicy = ErrorPolicy.DEAD_LETTER,
) -> tuple[tuple[bytes, int] | None, Record | None]:
    """One stream-log row keyed by its consumer (§4.2): the value decoded, the record built as
    its producer made it, :func:`~millwheel._delivery.key_record`. Returns ``((encoded key,
    interval), None)``, or ``(None, dead letter)`` — ``(None, None)``: a dead letter the
    consumer could not key, dropped; under ``ErrorPolicy.RAISE`` a failed extractor raises
    (:func:`~millwheel._delivery.key_record`). Both places a consumer keys rows call it: the keying
    stage (:func:`make_keying`) and the step (:meth:`IntervalBatch._key_here`)."""
    rec = Record(None if pk is None else decode_key(pk), decode_cell(value), ts, rid, stream)
    keyed, dead = key_record(consumer, stream, extractor, rec, on_error)
    if keyed is None:
        return None, dead
    return cached_key(keyed.key, intervals, cache), None


def make_keying(
    consumer: str,
    stream: str,
    extractor: Callable[[Record], Any],
    intervals: int,
    on_error: ErrorPolicy = ErrorPolicy.DEAD_LETTER,
) -> Callable[..., pa.StructArray]:
    """The consumer's own keying of the rows its producer did not key (§4.2), as an Arrow UDF.

    Arguments, one array each: ``needed`` (the row has no ``interval:C``: a failed
    extractor at the producer, or a file written before this consumer read the stream or
    by a writer without a keyer), then the row's ``id``, ``ts``, ``key``, ``value`` and ``fields`` (its
    declared fields' struct, ``_fieldcols.keying_fields``: a value stored as columns) —
    which the query passes only where ``needed`` (``_query.py``): the rows their producer
    keyed, the common case, cost a few null columns, not their values, on the way to
    Python and back. Those rows get an all-null result and keep their producer's
    ``key:C`` / ``interval:C``. The others are keyed here, one
    :func:`~millwheel._delivery.key_record` call per record: ``interval``, ``kind`` and
    ``key``; a failed extractor gives the dead letter's ``kind``, and its ``id``, ``ts``
    and ``value`` replace the row's (null for a row keyed here: it keeps its own).
    """
    kind_record, kind_dropped, kind_dead = (
        int(RowKind.RECORD),
        int(RowKind.DROPPED),
        int(RowKind.DEAD_LETTER),
    )
    cache: dict[Any, tuple[bytes, int]] = {}

    def key(
        needed: pa.Array,
        ids: pa.Array,
        tss: pa.Array,
        pkeys: pa.Array,
        vals: pa.Array,
        fields: pa.Array,
    ) -> pa.Array:  # a StructArray; PySpark reads the hints as "scalar Arrow UDF"
        n = len(needed)
        if n == 0 or not pc.any(needed).as_py():  # every row keyed by its producer
            return pa.StructArray.from_arrays(
                [pa.nulls(n, f.type) for f in _KEYING_FIELDS], fields=_KEYING_FIELDS
            )
        if len(cache) > 100_000:
            cache.clear()
        o_interval: list[int | None] = [None] * n
        o_kind: list[int | None] = [None] * n
        o_key: list[bytes | None] = [None] * n
        o_id: list[str | None] = [None] * n
        o_ts: list[int | None] = [None] * n
        o_val: list[bytes | None] = [None] * n
        id_l, ts_l, pk_l, val_l = (
            ids.to_pylist(),
            tss.to_pylist(),
            pkeys.to_pylist(),
            [
                v if v is not None else f
                for v, f in zip(vals.to_pylist(), fields.to_pylist(), strict=True)
            ],
        )
        for i, need in enumerate(needed.to_pylist()):
            if not need:
                continue
            keyed, dead = key_row(
                consumer,
                stream,
                extractor,
                intervals,
                cache,
                pk_l[i],
                val_l[i],
                ts_l[i],
                id_l[i],
                on_error,
            )
            if keyed is not None:
                o_key[i], o_interval[i] = keyed
                o_kind[i] = kind_record
                continue
            o_interval[i] = dead_interval(id_l[i], intervals)
            if dead is None:
                o_kind[i] = kind_dropped
            else:
                o_kind[i] = kind_dead
                o_id[i], o_ts[i], o_val[i] = dead.id, dead.timestamp, encode_value(dead.value)
        return pa.StructArray.from_arrays(
            [
                pa.array(o_interval, pa.int32()),
                pa.array(o_kind, pa.int32()),
                pa.array(o_key, pa.binary()),
                pa.array(o_id, pa.string()),
                pa.array(o_ts, pa.int64()),
                pa.array(o_val, pa.binary()),
            ],
            fields=_KEYING_FIELDS,
        )

    return key


#: what the message of :class:`KeyingStageNeeded` starts with: the driver looks for it in a
#: failed query's error (``_query.ComputationQuery.check``)
KEYING_STAGE_NEEDED = (
    "millwheel: a row not keyed for this computation belongs to another key interval"
)


class KeyingStageNeeded(RuntimeError):
    """A row its producer did not key (:attr:`RowKind.UNKEYED`) reached a query planned
    without the keying stage, and its key falls in another interval than the one it was
    sent to. The batch fails before anything commits; the driver restarts the query with
    the keying stage, and the batch runs again from its checkpoint."""


class _Out:
    """The rows one interval emits: productions, dead letters, the summary.

    Each row is keyed for the consumers of its stream where it is made (``_keying.py``):
    :meth:`frame` adds their ``key:C`` / ``interval:C`` columns from the records kept in
    ``recs`` (``None`` for rows with nothing to key: the summary)."""

    __slots__ = ("stream", "id", "ts", "key", "value", "recs")

    def __init__(self) -> None:
        self.stream: list[str] = []
        self.id: list[str | None] = []
        self.ts: list[int | None] = []
        self.key: list[bytes | None] = []
        self.value: list[bytes] = []
        self.recs: list[tuple[str, Record | None]] = []

    def add(
        self,
        stream: str,
        rid: str | None,
        ts: int | None,
        key: bytes | None,
        value: bytes,
        rec: Record | None = None,
    ) -> None:
        self.stream.append(stream)
        self.id.append(rid)
        self.ts.append(ts)
        self.key.append(key)
        self.value.append(value)
        self.recs.append((stream, rec))

    def add_production(self, p: Production, key: Any = None, kb: bytes | None = None) -> None:
        """One production; its value's bytes are the ones ``produce()`` made (never re-encoded),
        and its key's bytes ``kb`` when it carries the stepped key ``key`` (the common case)."""
        r = p.record
        value = p.encoded if p.encoded is not None else encode_value(r.value)
        rk = r.key
        self.add(
            p.stream,
            r.id,
            r.timestamp,
            None if rk is None else kb if rk is key and kb is not None else encode_key(rk),
            value,
            r,
        )

    def frame(
        self, keyer: Keyer | None = None, consumers: Sequence[str] = (), out_fields: Any = None
    ) -> pd.DataFrame:
        cols: dict[str, Any] = {
            "stream": self.stream,
            "id": self.id,
            "ts": self.ts,
            "key": self.key,
            "value": self.value,
            "wm": [None] * len(self.id),
        }
        production_fields(
            cols, out_fields, self.stream, [None if r is None else r.value for _, r in self.recs]
        )
        if keyer is not None and consumers:
            for name, values in keyer.rows(self.recs, consumers).items():
                cols[name] = (
                    pd.array(values, dtype="Int32") if name.startswith("interval:") else values
                )
        return pd.DataFrame(cols)


class IntervalBatch:
    """One key interval's share of one micro-batch, whatever the state layout.

    Both layouts — interval rows (:class:`IntervalStep`, the default) and per-key rows
    (``_mapstate.py``) — feed it the interval's input frames, tell it which stored keys
    have due timers, hand it the envelopes of the keys it will step, and store what
    :meth:`run` returns. It groups rows by key in one pass, puts each key's records back
    in send order, decodes each value once (when its key's step runs), and runs
    :func:`~millwheel._delivery.plan_steps` and :meth:`StepRunner.step` per key.
    """

    __slots__ = (
        "owner",
        "interval",
        "low_watermark",
        "now",
        "per_key",
        "out",
        "totals",
        "installs",
        "retire",
        "started",
        "life",
    )

    def __init__(
        self,
        owner: IntervalStep,
        interval: int,
        low_watermark: int,
        now: int,
        batch_id: int | None = None,
    ) -> None:
        self.owner = owner
        self.life = task_life(
            batch_id
        )  # of the micro-batch (``batch_id``: the running task's if None), ``_life.py``
        self.interval = interval
        self.low_watermark = low_watermark
        self.now = now
        #: key bytes -> its input rows
        self.per_key: dict[bytes, list[_Row]] = {}
        self.out = _Out()
        self.totals = StepMetrics()
        #: a rescale's envelopes to install before anything runs: ``(key bytes, envelope)``
        self.installs: list[tuple[bytes, bytes]] = []
        #: a rescale's :func:`state_digest` of what this group must hold before it is emptied
        self.retire: list[int] | None = None
        self.started = perf_counter()  # the summary's step time (``_autoscale.py`` reads it)

    @classmethod
    def of(
        cls,
        owner: IntervalStep,
        group: tuple[Any, ...],
        frames: Iterable[pd.DataFrame],
        spark_watermark: int,
        now: int,
    ) -> IntervalBatch | None:
        """The batch of Spark group ``group`` (a key interval's group value) of ``owner``'s
        computation with its input frames; ``None`` for the heartbeat group, which only moves
        Spark's watermark."""
        g = int(group[0])
        if owner.retired(g):
            batch = cls(owner, -2, from_spark(spark_watermark), now)
            for pdf in frames:
                batch.add_frame(pdf)
            return batch
        interval = owner.interval_of(g)
        if interval < 0:
            for _ in frames:
                pass
            return None
        batch = cls(owner, interval, from_spark(spark_watermark), now)
        for pdf in frames:
            batch.add_frame(pdf)
        return batch

    def add_frame(self, pdf: pd.DataFrame) -> None:
        """The rows of one input frame: records, keying dead letters, wall-time ticks."""
        n = len(pdf)
        if n == 0:
            return
        pdf = with_values(pdf)  # values stored as columns: ``_fieldcols.py``
        kind = pdf["kind"]
        ticks = kind.isna()
        if ticks.any():  # a tick: a wall timer of this interval is due
            t = pdf["now"][ticks].max()
            if t == t and t is not None and int(t) > self.now:
                self.now = int(t)
            pdf = pdf[~ticks]
            kind = pdf["kind"]
            n = len(pdf)
        if n and (kind != int(RowKind.RECORD)).any():
            unkeyed = kind == int(RowKind.UNKEYED)
            moves = (kind == int(RowKind.INSTALL)) | (kind == int(RowKind.RETIRE))
            if moves.any():
                self._moves(pdf[moves])
            letters = (kind != int(RowKind.RECORD)) & ~unkeyed & ~moves
            if letters.any():
                self._dead_letters(pdf[letters], wants_dead_letters(self.owner.keyer))
            keyed_here = self._key_here(pdf[unkeyed]) if unkeyed.any() else None
            pdf = pdf[kind == int(RowKind.RECORD)]
            if keyed_here is not None:
                pdf = pd.concat([pdf, keyed_here]) if len(pdf) else keyed_here
            n = len(pdf)
        if n == 0:
            return
        wm = pdf["wm"]
        nulls = wm.isna()
        if nulls.all():
            sent = None
            order: list[Any] = [MIN_TIMESTAMP] * n
        elif not nulls.any():
            sent = order = wm.astype("int64").tolist()
        else:
            sent = [None if w != w else int(w) for w in wm.tolist()]
            order = [MIN_TIMESTAMP if w is None else w for w in sent]
        srcs = pdf["src"].tolist()
        rows = map(
            _Row._make,
            zip(
                order,
                srcs,
                pdf["row"].tolist(),
                pdf["id"].tolist(),
                pdf["ts"].tolist(),
                pdf["value"].tolist(),
                pdf["stream"].tolist(),
                [None] * n if sent is None else sent,
                strict=True,
            ),
        )
        per_key = self.per_key
        for kb, row in zip(pdf["key"].tolist(), rows, strict=True):
            lst = per_key.get(kb)
            if lst is None:
                per_key[kb] = [row]
            else:
                lst.append(row)

    def _moves(self, pdf: pd.DataFrame) -> None:
        """A rescale's rows (``_rescale.py``): envelopes to install here, or this group's
        retirement with the digest of what it must hold."""
        for kind, kb, value in zip(
            pdf["kind"].tolist(), pdf["key"].tolist(), pdf["value"].tolist(), strict=True
        ):
            if kind == RowKind.INSTALL:
                self.installs.append((kb, value))
            else:
                self.retire = list(_unpackb(value))

    def _key_here(self, pdf: pd.DataFrame) -> pd.DataFrame | None:
        """Rows their producer did not key for this computation (:attr:`RowKind.UNKEYED`),
        keyed here with the one :func:`~millwheel._delivery.key_record`, as the keying stage
        would have. A failed extractor's dead letter is emitted from this interval (any
        stable choice: it carries no state); a record whose key falls in this interval
        comes back as a keyed row, to be stepped with the others; one whose key falls in
        another raises :class:`KeyingStageNeeded`."""
        owner = self.owner
        spec = owner.spec
        if owner.intervals is None:
            msg = f"computation {spec.name!r}: rows to key in the step, but the step was built without its key intervals (groups)"
            raise RuntimeError(msg)
        totals, out, on_error = self.totals, self.out, spec.options.on_error
        keyed_letters = wants_dead_letters(owner.keyer)
        cache: dict[Any, tuple[bytes, int]] = {}
        keep: list[int] = []
        keys: list[bytes] = []
        cols = (
            pdf["key"].tolist(),
            pdf["id"].tolist(),
            pdf["ts"].tolist(),
            pdf["value"].tolist(),
            pdf["stream"].tolist(),
        )
        for i, (pk, rid, ts, value, stream) in enumerate(zip(*cols, strict=True)):
            keyed, dead = key_row(
                spec.name,
                stream,
                spec.inputs[stream],
                owner.intervals,
                cache,
                pk,
                value,
                ts,
                rid,
                on_error,
            )
            if keyed is None:
                count_keying(totals, dead is None)
                if dead is not None:
                    out.add(
                        DEAD_LETTER_STREAM,
                        dead.id,
                        dead.timestamp,
                        None,
                        encode_value(dead.value),
                        dead if keyed_letters else None,
                    )
                continue
            kb, interval = keyed
            if interval != self.interval:
                msg = (
                    f"{KEYING_STAGE_NEEDED}: computation {spec.name!r}, record {rid!r} of stream {stream!r} "
                    f"(key interval {interval}, sent to {self.interval}); the query restarts with its keying stage"
                )
                raise KeyingStageNeeded(msg)
            keep.append(i)
            keys.append(kb)
        if not keep:
            return None
        rows = pdf.iloc[keep].copy()
        rows["key"] = keys
        rows["kind"] = int(RowKind.RECORD)
        return rows

    def _dead_letters(self, pdf: pd.DataFrame, keyed: bool) -> None:
        """Dead letters of keying, forwarded to :data:`DEAD_LETTER_STREAM` (decoded only if
        ``keyed``: something reads dead letters and they are keyed for it here)."""
        totals = self.totals
        for kind, rid, ts, value in zip(
            pdf["kind"].tolist(),
            pdf["id"].tolist(),
            pdf["ts"].tolist(),
            pdf["value"].tolist(),
            strict=True,
        ):
            if kind in (
                RowKind.INSTALL,
                RowKind.RETIRE,
            ):  # a caller that did not take a rescale's rows out first
                msg = f"computation {self.owner.spec.name!r}: a rescale's state move reached an interval function that cannot apply it ({type(self.owner).__name__})"
                raise RescaleMismatch(msg)
            count_keying(totals, kind == RowKind.DROPPED)
            if kind != RowKind.DROPPED:
                rec = (
                    Record(None, decode_value(value), ts, rid, DEAD_LETTER_STREAM)
                    if keyed
                    else None
                )
                self.out.add(DEAD_LETTER_STREAM, rid, ts, None, value, rec)

    def add_due(self, meta: Iterable[tuple[bytes, KeyMeta]]) -> None:
        """Keys without input whose earliest timer is due: ``(key bytes, its KeyMeta)``."""
        lw, now, per_key = self.low_watermark, self.now, self.per_key
        for kb, m in meta:
            if kb not in per_key and timers_due(
                m.next_low_watermark_timer, m.next_wall_timer, lw, now
            ):
                per_key[kb] = []

    def run(self, envelopes: Callable[[bytes], bytes | None]) -> dict[bytes, KeyOutcome]:
        """Step every key with input or due timers (:func:`~millwheel._delivery.run_key`);
        return what each key keeps."""
        owner = self.owner
        runner = owner.runner()
        lw, now, totals, out = self.low_watermark, self.now, self.totals, self.out
        once: list[tuple[Any, Production]] = []
        outcomes: dict[bytes, KeyOutcome] = {}
        for kb, rows in self.per_key.items():
            key = decode_key(kb)
            if len(rows) > 1:
                # send order: Spark reads a batch's files in any order; sender watermarks
                # only grow, and file names (then rows) sort in publication order: rows are
                # tuples that start with (sender watermark, file, row), sorted natively
                rows.sort()
            items = [
                (Record(key, decode_cell(r.value), r.ts, r.id, r.stream), r.sent) for r in rows
            ]
            outcome = outcomes[kb] = run_key(
                runner,
                key,
                envelopes(kb),
                items,
                low_watermark=lw,
                now=now,
                metrics=totals,
                life=self.life,
            )
            for plist in (outcome.productions, outcome.dead_letters):
                for p in plist:
                    if p.once_id is not None:
                        once.append((key, p))
                    else:
                        out.add_production(p, key, kb)
        if once:
            # one IdRegistry round trip for the interval's whole batch (Photon §2); a replay
            # commits the same ids with the same tokens and gets the same answers
            result = commit_once(
                once,
                owner.registry(),
                pipeline=owner.pipeline,
                computation=owner.spec.name,
                metrics=totals,
            )
            for _, p in once:
                if p.record.id not in result.dropped:
                    out.add_production(p)
            for p in result.dead_letters:
                out.add_production(p)
        return outcomes

    def summary(
        self, hold: int | None, next_lw: int | None, next_wall: int | None, keys: int
    ) -> pd.DataFrame:
        """The batch's output frame, closed by the interval's summary row."""
        step_ms = int((perf_counter() - self.started) * 1000)
        summary = IntervalSummary(
            self.interval,
            hold,
            next_lw,
            next_wall,
            keys,
            self.totals.as_dict(),
            self.low_watermark,
            self.now,
            step_ms,
        )
        self.out.add(SUMMARY_STREAM, None, 0, None, summary.encode())
        return self.out.frame(self.owner.keyer, self.owner.out_consumers, self.owner.out_fields)


def earliest(metas: Iterable[KeyMeta]) -> tuple[int | None, int | None, int | None]:
    """The interval's hold, earliest low-watermark timer and earliest wall timer, from its keys' :class:`KeyMeta`."""
    hold = nlw_min = nwall_min = None
    for h, t_lw, t_wall in metas:
        if h is not None and (hold is None or h < hold):
            hold = h
        if t_lw is not None and (nlw_min is None or t_lw < nlw_min):
            nlw_min = t_lw
        if t_wall is not None and (nwall_min is None or t_wall < nwall_min):
            nwall_min = t_wall
    return hold, nlw_min, nwall_min


class IntervalStep:
    """The ``applyInPandasWithState`` function of one computation: the interval-row layout.

    Picklable; builds its :class:`StepRunner` (and IdRegistry client) lazily, once per
    Python worker. The interval's GroupState row is ``(envs, meta)``: key -> envelope and
    key -> :class:`KeyMeta` (only keys that have one), msgpack.
    With a :class:`~millwheel.runtime._keying.Keyer`, its output rows carry the key columns
    of every consumer of its output streams (:meth:`out_schema`).
    """

    def __init__(
        self,
        spec: ComputationSpec,
        *,
        pipeline: str = "default",
        registry: Callable[[], Any] | None = None,
        keyer: Keyer | None = None,
        groups: Sequence[int] | None = None,
    ) -> None:
        self.spec = spec
        #: the Spark grouping value of each key interval (``_runtime.pin_groups``; ``None``: the interval number)
        self.groups = None if groups is None else list(groups)
        #: how many key intervals (for rows keyed in the step: :meth:`IntervalBatch._key_here`)
        self.intervals = None if groups is None else len(self.groups)
        self._interval_of = None if groups is None else {g: i for i, g in enumerate(groups)}
        self.pipeline = pipeline
        #: a picklable factory of the IdRegistry client that ``once_id`` productions commit to
        self.registry_factory = registry
        self.keyer = keyer
        #: the consumers its output rows are keyed for
        self.out_consumers = (
            [] if keyer is None else keyer.consumers_of([*spec.all_outputs, DEAD_LETTER_STREAM])
        )
        self.out_fields = (
            None if keyer is None else keyer.output_fields(spec.all_outputs)
        )  # its declared output stream
        self._runner: StepRunner | None = None
        self._registry: Any = None

    def out_schema(self) -> str:
        """The Spark schema of its output rows: :data:`OUT_SCHEMA` and the key columns."""
        extra = self.keyer.ddl(self.out_consumers) if self.keyer is not None else ""
        return output_schema(f"{OUT_SCHEMA}, {extra}" if extra else OUT_SCHEMA, self.out_fields)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "pipeline": self.pipeline,
            "registry": self.registry_factory,
            "keyer": self.keyer,
            "groups": self.groups,
        }

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__init__(
            d["spec"],
            pipeline=d["pipeline"],
            registry=d["registry"],
            keyer=d["keyer"],
            groups=d.get("groups"),
        )  # type: ignore[misc]

    def interval_of(self, group: int) -> int:
        """The key interval of Spark group ``group`` (negative: the heartbeat group)."""
        if group < 0 or self._interval_of is None:
            return group
        return self._interval_of[group]

    def retired(self, group: int) -> bool:
        """Is ``group`` a Spark group that is not one of this layout's key intervals (a group
        of the layout before a rescale: it only ever gets its :attr:`RowKind.RETIRE` row)?"""
        return group >= 0 and self._interval_of is not None and group not in self._interval_of

    def install(self, batch: IntervalBatch, envs: dict[bytes, Any], meta: dict[bytes, Any]) -> None:
        """A rescale's envelopes into this interval's (empty) maps, before any key runs (``_move.py``)."""
        install_envelopes(
            self.spec.name, batch.interval, self.intervals or 0, batch.installs, envs, meta, KeyMeta
        )

    def _retire(self, batch: IntervalBatch, state: Any) -> None:
        """Empty a group of the layout before a rescale, once its state is the one the rescale read (``_move.py``)."""
        retire_group(
            self.spec.name,
            self.intervals,
            batch.retire,
            bool(batch.per_key or batch.installs),
            state,
        )

    def registry(self) -> Any:
        if self._registry is None and self.registry_factory is not None:
            self._registry = self.registry_factory()
        return self._registry

    def runner(self) -> StepRunner:
        if self._runner is None:
            spec = self.spec
            # strong productions are checkpointed in the batch outbox, not in the envelope
            opts = dataclasses.replace(spec.options, strong_productions=False)
            self._runner = StepRunner(
                spec.instantiate(), name=spec.name, outputs=spec.all_outputs, options=opts
            )
        return self._runner

    def __call__(
        self, group: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        batch = IntervalBatch.of(
            self, group, frames, state.getCurrentWatermarkMs(), state.getCurrentProcessingTimeMs()
        )
        if batch is None:
            return
        if self.retired(int(group[0])):
            self._retire(batch, state)
            return
        if batch.retire is not None:
            msg = f"computation {self.spec.name!r}: a rescale retires Spark group {group[0]}, which is key interval {batch.interval} of this layout"
            raise RescaleMismatch(msg)
        if state.exists:
            envs_b, meta_b = state.get
            envs = _unpackb(envs_b, raw=False, strict_map_key=False)
            meta = unpack_meta(meta_b)
        else:
            envs, meta = {}, {}
        if batch.installs:
            self.install(batch, envs, meta)
        batch.add_due(meta.items())
        for kb, outcome in batch.run(envs.get).items():
            if outcome.envelope is None:
                envs.pop(kb, None)
            else:
                envs[kb] = outcome.envelope
            m = KeyMeta.of(outcome)
            if m is None:
                meta.pop(kb, None)
            else:
                meta[kb] = m
        hold, nlw_min, nwall_min = store_interval(state, envs, meta)
        yield batch.summary(hold, nlw_min, nwall_min, len(envs))


def store_interval(
    state: Any, envs: dict[bytes, Any], meta: dict[bytes, Any]
) -> tuple[int | None, int | None, int | None]:
    """Write an interval's maps into its ``GroupState`` row (or remove the row: no keys) with
    its event-time timeout at its earliest low-watermark timer; returns :func:`earliest`."""
    if envs:
        state.update((_packb(envs, use_bin_type=True), _packb(meta, use_bin_type=True)))
    elif state.exists:
        state.remove()
    hold, nlw_min, nwall_min = earliest(meta.values())
    if nlw_min is not None and envs:
        state.setTimeoutTimestamp(max(timer_timeout(nlw_min), state.getCurrentWatermarkMs()))
    return hold, nlw_min, nwall_min
