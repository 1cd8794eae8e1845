"""The heartbeats a computation's driver writes into its own query (§4.5, §7.2; ``docs/runtime.md``,
"Low watermarks and timers"): when one is worth a micro-batch, which key intervals it goes
to as rows of their own, the wall-time ticks it carries, and the files themselves.

:class:`HeartbeatWriter` is the part of :class:`~millwheel.runtime._query.ComputationQuery`
that writes them; the query keeps the state it reads (summaries, the plan, its batches).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from millwheel._record import MIN_TIMESTAMP
from millwheel.runtime._layout import mark_migration
from millwheel.runtime._wire import due_ticks, from_spark, passed_since_run, to_spark

if TYPE_CHECKING:
    from millwheel._topology import ComputationSpec
    from millwheel.runtime._consumed import ConsumedFiles
    from millwheel.runtime._context import DriverContext
    from millwheel.runtime._fs import Location
    from millwheel.runtime._wire import IntervalSummary
    from millwheel.runtime.plans import Plan

HB_SCHEMA = pa.schema([("interval", pa.int32()), ("wm", pa.int64()), ("now", pa.int64())])
#: a heartbeat file: :data:`HB_SCHEMA` and the batch its watermark counts (``_wire.HEARTBEAT_SCHEMA``)
HB_FILE_SCHEMA = pa.schema([*HB_SCHEMA, ("upto", pa.int64())])


class HeartbeatWriter:
    """Heartbeat files into a computation's own query, for :class:`~millwheel.runtime._query.ComputationQuery`."""

    rt: DriverContext
    spec: ComputationSpec
    name: str
    heartbeats: Location
    consumed: ConsumedFiles
    summaries: dict[int, IntervalSummary]
    intervals: int
    plan: Plan | None
    batches: int
    _migration: dict[str, Any] | None
    _hb_sent: int
    _hb_upto: int
    _hb_at: float
    _hb_seq: int
    #: the number of the newest heartbeat file shown
    _hb_shown: int
    _waiting_since: float | None
    _ticked: dict[int, int]
    _reached: dict[int, tuple[int, int]]
    query: Any
    listed_first: bool
    inputs: list[tuple[str, str]]
    upstream: list[str]

    def _no_data_batches(self, plan: Plan | None = None) -> bool:
        """Whether Spark runs a batch whenever only its watermark moved: for a class that
        handles timers on a plan whose timers wait for Spark's watermark
        (``Plan.timers_in_no_data_batches``). Not for a class without timers (nothing for
        such a batch to do), nor on a plan that takes heartbeats addressed to its key
        intervals, whose timers fire in the batch that reads the heartbeat (``docs/runtime.md``,
        "No-data batches", "Heartbeats in the batch that reads them"), nor on the Arrow
        mapping, which has no stateful operator: its due intervals run in the batch a
        heartbeat or a tick starts."""
        plan = plan or self.plan
        return self.spec.handles_timers and (plan is None or plan.timers_in_no_data_batches)

    def _prune_heartbeats(self, upto: int) -> None:
        """Delete the heartbeat files committed batches have read: only this query reads
        them, and a committed batch is never run again (its listing stays short).

        The newest file shown is kept: the next driver numbers its heartbeats after it, and
        a file source skips a name it has seen, so a number used again would be a
        heartbeat no batch reads (the query would wait for ever). A number staged and never
        shown (:meth:`_stage_heartbeat`) may be used again: no file source saw it."""
        names = self.consumed.heartbeat_names(upto)
        migration = self._migration
        if migration is not None and not migration.get("moved") and migration["file"] in names:
            # a committed, published batch read the state move: from now on run.json says so,
            # and starts stop looking for the file (``_check_migration``) — also when it is
            # the newest file, kept below (a drained run's last batch may be the move's)
            mark_migration(self.rt.root, self.name, "moved", True)
            migration["moved"] = True
        names.discard(f"{self._hb_shown:012d}.parquet")
        for name in names:
            self.heartbeats.child(name).delete()
        if names:
            self.consumed.forget(None, None, names)

    def _waited(self, waiting: int) -> int:
        """``waiting`` once input files have waited ``heartbeat_ms`` for a batch to plan them,
        else 0. A query between batches takes new files within milliseconds (Spark polls its
        sources), usually before the driver has read the newest batch: a heartbeat written
        for them then is read only after the data batch, in a stateful batch of its own that
        does nothing (docs/runtime.md, "Idle heartbeats"). Files still waiting after
        ``heartbeat_ms`` wait for a batch in flight, whose successor reads them with the
        heartbeat."""
        if not waiting:
            self._waiting_since = None
            return 0
        t = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = t
        return waiting if t - self._waiting_since >= self.rt.settings.heartbeat_ms / 1000 else 0

    def _heartbeat_needed(self, hb_lw: int, waiting: int, in_flight: bool) -> bool:
        """Whether moving the query's watermark to ``hb_lw`` has anything to do now: input a
        later batch reads, a timer it makes due, a batch in flight that may set timers, or an
        interval whose holds are not known yet. Otherwise the heartbeat would be a whole
        stateful batch that does nothing, and it waits until one of these holds (docs/runtime.md,
        "Idle heartbeats"): a lower watermark in the query is never wrong, only later."""
        if (
            waiting
            or len(self.summaries) < self.intervals
            or (in_flight and self.spec.handles_timers)
        ):
            return True
        return bool(self._due(hb_lw))

    def wakes_pending(self) -> bool:
        """Whether a key interval has a low-watermark wake-up that the watermark sent has
        passed since the interval last ran, which a tick will carry out (``_wire.due_ticks``):
        a key that keeps only dedup ids, woken to collect them (``_contract.dedup_collect_at``).
        It holds no watermark, so a drained run would stop before the batch that runs it.
        Not on a plan whose timers wait for Spark's no-data batches (no ticks there)."""
        watermark = self._tick_watermark()
        return watermark is not None and any(
            passed_since_run(s, watermark) for s in self.summaries.values()
        )

    def _tick_watermark(self) -> int | None:
        """The watermark :func:`~millwheel.runtime._wire.due_ticks` ticks low-watermark
        timers under: the one sent, unless Spark's no-data batches fire them."""
        return None if self._no_data_batches() else self._hb_sent

    def _due(self, hb_lw: int) -> frozenset[int]:
        """The key intervals whose earliest low-watermark timer (their last summary) ``hb_lw`` makes due."""
        return frozenset(
            i
            for i, s in self.summaries.items()
            if s.next_low_watermark_timer is not None and s.next_low_watermark_timer <= hb_lw
        )

    def _addressed(self, hb_lw: int, waiting: int, in_flight: bool) -> frozenset[int]:
        """The key intervals a heartbeat to ``hb_lw`` also goes to as rows of their own, on
        a plan that takes them (``Plan.addresses_heartbeats``), so that its watermark
        applies in the batch that reads it and the timers it makes due fire there, not in a
        no-data batch after it (``docs/runtime.md``, "Heartbeats in the batch that reads
        them"). Every interval when the driver cannot tell which will have timers due
        (input waiting, a batch in flight that may set timers, an interval not reported
        since the start); otherwise the intervals whose earliest low-watermark timer it
        makes due. None for a class that handles no timers."""
        plan = self.plan
        if plan is None or not plan.addresses_heartbeats or not self.spec.handles_timers:
            return frozenset()
        if waiting or in_flight or len(self.summaries) < self.intervals:
            return frozenset(range(self.intervals))
        return self._due(hb_lw)

    def _heartbeat(
        self,
        in_lw: int,
        now: int,
        needed: bool = True,
        to: frozenset[int] = frozenset(),
        upto: int = -1,
    ) -> None:
        ticks = [
            (i, now)
            for i in due_ticks(
                self.summaries,
                self._ticked,
                now,
                self._tick_watermark(),
                self.batches,
                self._unread(),
            )
        ]
        advance = (
            in_lw > self._hb_sent
            and to_spark(in_lw) > to_spark(self._hb_sent)
            and (needed or bool(ticks))
        )
        due = time.monotonic() - self._hb_at >= self.rt.settings.heartbeat_ms / 1000
        if ticks or (advance and due):
            if advance:
                self._write_heartbeat(to_spark(in_lw), ticks, to, upto)
                self._hb_sent, self._hb_upto = in_lw, upto
            else:
                self._write_heartbeat(None, ticks)

    def _unread(self) -> dict[int, int]:
        """The watermarks rows addressed to each key interval carried (``_reached``) while
        no batch can have read them yet: a file written while batch ``M`` runs is read by
        ``M + 1`` at the latest (Spark plans every heartbeat file present; a dropped planned
        batch is planned anew under the same number), so two batches published since it was
        written have read it. A row read and not applied (``IntervalBatch.take_ticks``: a
        batch that its watermark counted) leaves the timer to a tick (``_wire.due_ticks``)."""
        return {i: w for i, (w, b) in self._reached.items() if self.batches < b + 2}

    def _write_heartbeat(
        self,
        wm: int | None,
        ticks: list[tuple[int, int]],
        to: frozenset[int] = frozenset(),
        upto: int = -1,
    ) -> None:
        """One heartbeat file: the watermark ``wm`` (Spark's time) for Spark's watermark (the
        row of interval -1) and, as rows of their own, for the key intervals ``to``; a wall
        tick ``(interval, now)`` for each of ``ticks``. A row of a key interval carries
        ``wm`` if it is addressed, else the newest watermark sent before on a plan that
        takes addressed heartbeats: written after that heartbeat, it is read no earlier.
        Each such row says the newest batch whose files its watermark counts (``upto``: the
        step applies it only in a later batch, ``IntervalBatch.take_ticks``)."""
        show = self._stage_heartbeat(wm, ticks, to, upto)
        if show is not None:
            show()

    def _stage_heartbeat(
        self,
        wm: int | None,
        ticks: list[tuple[int, int]],
        to: frozenset[int] = frozenset(),
        upto: int = -1,
    ) -> Callable[[], None] | None:
        """:meth:`_write_heartbeat`'s file written under a hidden name (Spark's file source
        skips it), and the call that gives it its name, in sequence, and counts it as
        written; ``None`` if it has no row."""
        at = dict(ticks)
        sent = self._hb_sent
        known = (
            to_spark(sent)
            if sent > MIN_TIMESTAMP and self.plan is not None and self.plan.addresses_heartbeats
            else None
        )
        rows: list[tuple[int, int | None, int | None, int | None]] = (
            [(-1, wm, None, upto)] if wm is not None else []
        )
        for i in sorted(set(at) | to):
            if i in to:
                rows.append((i, wm, at.get(i), upto))
            else:
                rows.append((i, known, at.get(i), None if known is None else self._hb_upto))
        if not rows:
            return None
        table = pa.table(
            {
                "interval": pa.array([r[0] for r in rows], pa.int32()),
                "wm": pa.array([r[1] for r in rows], pa.int64()),
                "now": pa.array([r[2] for r in rows], pa.int64()),
                "upto": pa.array([r[3] for r in rows], pa.int64()),
            },
            schema=HB_FILE_SCHEMA,
        )
        seq = self._hb_seq
        name = f"{seq:012d}.parquet"
        self._hb_seq += 1
        tmp = self.heartbeats.child(f".{name}.tmp")
        pq.write_table(table, tmp.path, filesystem=tmp.fs)

        def show() -> None:
            tmp.move_to(self.heartbeats.child(name))
            self._hb_shown = max(self._hb_shown, seq)
            for i, w, _, _ in rows:
                if (
                    i >= 0
                    and w is not None
                    and from_spark(w) > self._reached.get(i, (MIN_TIMESTAMP, 0))[0]
                ):
                    self._reached[i] = (from_spark(w), self.batches)
            if wm is not None and from_spark(wm) > self._hb_sent:
                self._hb_sent, self._hb_upto = from_spark(wm), upto
            self._hb_at = time.monotonic()

        return show

    def stage_heartbeat(self, producer: str, watermark: int) -> Callable[[], None] | None:
        """A heartbeat that counts input ``producer`` is about to publish, written under a
        hidden name before it does, and the call that shows it once the producer's files
        are in place (``ComputationQuery._before_publish``): ``watermark`` is the producer's
        published low watermark once they are (§4.5). Spark lists this query's heartbeats
        before its inputs (:attr:`listed_first`), so a batch that reads the heartbeat reads
        those files too, and fires the timers it makes due after their records: the
        timers the new records set, in the batch that reads them, rather than in the one
        after, whose heartbeat is written while it runs (``docs/runtime.md``, "A heartbeat
        before its producer publishes"). ``None`` where that does not hold or nothing moves:
        no query running, no timers, a stream it writes itself among its inputs.
        """
        if (
            self.query is None
            or not self.listed_first
            or not self.spec.handles_timers
            or any(p == self.name for _, p in self.inputs)
        ):
            return None
        up = min(
            (watermark if u == producer else self.rt.watermark_of(u) for u in self.upstream),
            default=watermark,
        )
        if up <= self._hb_sent or to_spark(up) <= to_spark(self._hb_sent):
            return None
        # new input is on its way: every key interval may set a timer it makes due
        return self._stage_heartbeat(
            to_spark(up), [], self._addressed(up, 1, True), self.consumed.planned()
        )
