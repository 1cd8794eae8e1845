"""The per-batch core of every interval plan: one key interval's share of a micro-batch (MillWheel §7.1).

This module is Arrow/pandas plumbing around the delivery core (``millwheel/_delivery.py``:
keying, step planning, due timers) and the per-key step (``millwheel/_step.py``), the same
calls the in-memory harness makes.

Spark groups a computation's input by *key interval* (a hash range of the consumer's
encoded key), not by raw key: each Spark group costs a pandas frame in and out, so one
group per key is two orders of magnitude slower (``docs/performance.md``).
:class:`IntervalBatch` is one interval's share of a micro-batch, whatever the plan keeps
its state in: rows grouped by key in one pass, each key's records in send order, each value
decoded once, the step run per key, productions written with the bytes ``produce()``
made. Where envelopes live is the plan's (``plans/intervals.py``: the interval's
``GroupState`` row; ``plans/keys.py``: one state-store row per key); rows the producer did
not key are keyed here with ``_ownkeying.key_row``. Either way, state, timers and dedup
ids of every key commit atomically with Spark's state store at the end of the micro-batch
(§6.2).

Time (§4.5, §4.6, §7.2):

* the **low watermark** is Spark's event-time watermark, which the driver drives with
  heartbeat rows carrying the framework's input low watermark (``withWatermark(..., "0
  seconds")``). It is recorded in Spark's offset log, so a replayed batch sees the same
  value. A heartbeat row addressed to the interval raises it from the batch that reads it
  (:meth:`IntervalBatch.take_ticks`; the same files on a replay): that is how low-watermark
  timers fire. The operator runs without Spark's timeouts, except over state a query with
  Spark's single ``EventTimeTimeout`` per group wrote (``plans/intervals.py``): there the
  group's timeout is also set at the earliest pending timer of the interval.
* **wall time** is the batch's processing time (also fixed per batch and replay); wall
  timers fire when a batch runs for the interval, and the driver sends a tick row to an
  interval whose earliest wall timer is due.

Productions are not kept pending in the envelope here: the runtime checkpoints them in the
batch's outbox, which commits with the state (see ``_query.py`` and ``docs/runtime.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from time import perf_counter
from typing import Any, NamedTuple

import msgpack
import pandas as pd

from millwheel._codec import decode_value, encode_value
from millwheel._contract import judged_watermark, late_watermark
from millwheel._counters import StepMetrics
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._delivery import (
    KeyOutcome,
    commit_once,
    count_keying,
    run_key,
    timers_due,
)
from millwheel._fields import decode_cell
from millwheel._record import MIN_TIMESTAMP, Production, Record, decode_key, encode_key
from millwheel.runtime._fieldcols import production_fields, with_values
from millwheel.runtime._groupstate import MemoryGroupState  # noqa: F401 - re-exported: tests and benches run steps with it
from millwheel.runtime._keying import Keyer, wants_dead_letters
from millwheel.runtime._life import task_life
from millwheel.runtime._move import RescaleMismatch  # noqa: F401 - re-exported: the per-key plan raises it
from millwheel.runtime._ownkeying import KEYING_STAGE_NEEDED, KeyingStageNeeded, key_row
from millwheel.runtime._ownkeying import make_keying as make_keying  # re-exported: tests, benches
from millwheel.runtime._spark_internals import task_batch_id
from millwheel.runtime._wire import (
    SUMMARY_STREAM,
    IntervalSummary,
    RowKind,
    from_spark,
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
    def of(cls, outcome: KeyOutcome) -> KeyMeta | int | None:
        """``None``: the key has nothing to schedule (no entry); see :meth:`make`."""
        if outcome.envelope is None or outcome.keeps_nothing_to_schedule:
            return None
        return cls.make(outcome.hold, outcome.next_low_watermark_timer, outcome.next_wall_timer)

    @classmethod
    def make(cls, hold: int | None, nlw: int | None, nwall: int | None) -> KeyMeta | int:
        """The entry of a key with these: a :class:`KeyMeta`, or for a key whose only
        entry is a low-watermark wake-up that holds nothing (its ids' collection,
        ``_contract.dedup_collect_at``; a low-watermark timer always holds) that time
        alone, an int: msgpack reads it without a Python call, and an interval may keep
        one for each key it saw in the last ``slack_ms``."""
        if hold is None and nwall is None and nlw is not None:
            return nlw
        return cls(hold, nlw, nwall)


def unpack_meta(data: bytes) -> Any:
    """A msgpack map (or list holding one) whose lists are :class:`KeyMeta` (and whose
    ints are wake-ups: :meth:`KeyMeta.make`)."""
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
    (``plans/keys.py``) — feed it the interval's input frames, tell it which stored keys
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
        "judged",
        "per_key",
        "out",
        "totals",
        "installs",
        "retire",
        "started",
        "life",
        "batch_id",
        "arrival",
    )

    def __init__(
        self,
        owner: Any,  # plans.intervals.IntervalStep (or the columnar step)
        interval: int,
        low_watermark: int,
        now: int,
        batch_id: int | None = None,
        arrival: int | None = None,
    ) -> None:
        self.owner = owner
        #: the micro-batch (the running task's if not given; ``None``: outside a streaming query)
        self.batch_id = task_batch_id() if batch_id is None else batch_id
        self.life = task_life(self.batch_id)  # of the micro-batch, ``_life.py``
        self.interval = interval
        self.low_watermark = low_watermark
        #: the watermark before this batch's heartbeats (default: ``low_watermark``): a record
        #: whose sender watermark is unknown (a computation's production) arrived under it,
        #: since a heartbeat the batch reads may count the very files it reads
        #: (``_consumed.input_watermarks``), and is judged late against it
        self.arrival = low_watermark if arrival is None else arrival
        self.now = now
        #: the oldest watermark a stepped record was judged against, if older than
        #: ``low_watermark`` (``IntervalSummary.judged``)
        self.judged: int | None = None
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
        owner: Any,  # plans.intervals.IntervalStep (or the columnar step)
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

    def take_ticks(self, pdf: pd.DataFrame) -> pd.DataFrame:
        """``pdf`` without the driver's rows of this interval (no ``kind``): a tick raises the
        batch's wall time to its ``now`` (a wall timer of the interval is due); a heartbeat
        addressed to the interval raises its low watermark to its ``wm`` (Spark's time) from
        this batch on (``docs/runtime.md``, "Heartbeats in the batch that reads them") if
        this batch is later than every batch whose files that watermark counts as consumed
        (``upto``). Not otherwise: a rescale drops a planned batch and plans it anew, with
        heartbeat files written meanwhile that count it; Spark's watermark applies them
        from the next batch, as it does every heartbeat."""
        ticks = pdf["kind"].isna()
        if not ticks.any():
            return pdf
        rows = pdf[ticks]
        now = rows["now"].dropna()
        if len(now):
            self.now = max(self.now, int(now.max()))
        if "wm" in rows.columns and "upto" in rows.columns and self.batch_id is not None:
            carried = rows[rows["wm"].notna() & rows["upto"].notna()]
            wm = carried["wm"][carried["upto"] < self.batch_id]
            if len(wm):
                self.low_watermark = max(self.low_watermark, from_spark(int(wm.max())))
        return pdf[~ticks]

    def add_frame(self, pdf: pd.DataFrame) -> None:
        """The rows of one input frame: records, keying dead letters, wall-time ticks."""
        n = len(pdf)
        if n == 0:
            return
        pdf = self.take_ticks(with_values(pdf))  # values stored as columns: ``_fieldcols.py``
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
            if kb in per_key:
                continue
            if m <= lw if isinstance(m, int) else timers_due(m[1], m[2], lw, now):
                per_key[kb] = []

    def run(self, envelopes: Callable[[bytes], bytes | None]) -> dict[bytes, KeyOutcome]:
        """Step every key with input or due timers (:func:`~millwheel._delivery.run_key`);
        return what each key keeps."""
        owner = self.owner
        runner = owner.runner()
        lw, now, totals, out = self.low_watermark, self.now, self.totals, self.out
        once: list[tuple[Any, Production]] = []
        outcomes: dict[bytes, KeyOutcome] = {}
        oldest = lw
        for kb, rows in self.per_key.items():
            key = decode_key(kb)
            for r in rows:  # the watermarks ``plan_steps`` judges the key's records against
                oldest = min(oldest, late_watermark(r.stream, r.sent, self.arrival))
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
                arrival=self.arrival,
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
        judged = judged_watermark(lw, oldest)
        if judged < lw:
            self.judged = judged
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
            self.judged,
        )
        self.out.add(SUMMARY_STREAM, None, 0, None, summary.encode())
        return self.out.frame(self.owner.keyer, self.owner.out_consumers, self.owner.out_fields)


def earliest(metas: Iterable[KeyMeta | int]) -> tuple[int | None, int | None, int | None]:
    """The interval's hold, earliest low-watermark timer and earliest wall timer, from its
    keys' entries (:meth:`KeyMeta.make`)."""
    hold = nlw_min = nwall_min = None
    for m in metas:
        if isinstance(m, int):
            if nlw_min is None or m < nlw_min:
                nlw_min = m
            continue
        h, t_lw, t_wall = m
        if h is not None and (hold is None or h < hold):
            hold = h
        if t_lw is not None and (nlw_min is None or t_lw < nlw_min):
            nlw_min = t_lw
        if t_wall is not None and (nwall_min is None or t_wall < nwall_min):
            nwall_min = t_wall
    return hold, nlw_min, nwall_min
