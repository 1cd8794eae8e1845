"""One Spark Structured Streaming query per computation (docs/runtime.md, docs/architecture.md).

::

    heartbeats/<C>/*.parquet ──────┐  (input low watermark, ticks)
    streams/<S>/<producer>/*.parquet ┤  (plans/_inputs.py: keyed rows, or markers of the scan)
        union ─► withWatermark ─► the computation's plan (plans/: interval rows, key rows,
              columnar, Arrow) ─► foreachBatch(its sink: the Outbox) ──(after commit)──► streams/<out>/<C>/

The query asks its plan (``plans/``) for everything that differs between them — which
plan (``plans.plan_for``, every refusal included), its state store's configuration, its
frame and its sink — and keeps what every computation has: its lease, outbox,
heartbeats, restarts, and what the driver needs for the low watermark (§4.5, §7.2):
which input files the committed batches consumed (from the query's file-source logs in
its checkpoint), and each key interval's summary (oldest pending low-watermark timer,
next timers) from the last published batch.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from millwheel._counters import StepMetrics
from millwheel._delivery import low_watermark
from millwheel._errors import MillwheelError
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP
from millwheel._topology import ComputationSpec
from millwheel.runtime._consumed import ConsumedFiles, read_input_watermarks
from millwheel.runtime._context import DriverContext
from millwheel.runtime._layout import finish_move, mark_migration, move_pending
from millwheel.runtime._lease import FencedError, Lease
from millwheel.runtime._outbox import Outbox
from millwheel.runtime._ownkeying import KEYING_STAGE_NEEDED
from millwheel.runtime._rewrite_pin import settle_rewrite
from millwheel.runtime._scan import ScannedInput
from millwheel.runtime._session import NO_DATA_BATCHES_OFF, start_query, wait_for_jobs
from millwheel.runtime._spark_internals import drop_uncommitted_state, error_mentions
from millwheel.runtime._state_load import bootstrap_at_start
from millwheel.runtime._streams import FileStreamLog
from millwheel.runtime._usercode import RestartPolicy
from millwheel.runtime._wire import IntervalSummary, due_ticks, from_spark, interval_name, to_spark
from millwheel.runtime.plans import Plan, plan_for
from millwheel.runtime.plans._inputs import query_inputs
from watermark_authority import ConflictError, StaleTokenError, UnknownNameError

_HB_SCHEMA = pa.schema([("interval", pa.int32()), ("wm", pa.int64()), ("now", pa.int64())])
#: a heartbeat file: :data:`_HB_SCHEMA` and the batch its watermark counts (``_wire.HEARTBEAT_SCHEMA``)
_HB_FILE_SCHEMA = pa.schema([*_HB_SCHEMA, ("upto", pa.int64())])
#: a rescale's heartbeat file (``_rescale.py``): :data:`_HB_SCHEMA` and the columns of its rows
HB_MOVE_SCHEMA = pa.schema(
    [
        *_HB_SCHEMA,
        ("kind", pa.int32()),
        ("group", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)


class ComputationQuery:
    """The Spark query of one computation and the driver's bookkeeping for it."""

    def __init__(self, rt: DriverContext, spec: ComputationSpec) -> None:
        self.rt = rt
        self.spec = spec
        self.name = spec.name
        #: its key intervals and their Spark groups (``_layout.py``), read again at each start
        self.intervals = rt.keyer.intervals_of(self.name)
        self.groups: list[int] = []
        self.checkpoint = rt.root.child("checkpoints", self.name)
        self.heartbeats = rt.root.child("heartbeats", self.name)
        self.inputs = [(s, p) for s in spec.inputs for p in rt.producers(s)]
        #: whose low watermarks bound this one's: not itself nor the other dead-letter readers
        self.upstream = rt.upstream(self.name)
        self.outbox = Outbox(
            self.name,
            rt.root.child("outbox", self.name),
            self.checkpoint,
            rt.streams,
            strong=spec.options.strong_productions,
            on_summary=self._on_summary,
            tally=rt.root.child("tallies", f"{self.name}.json"),
            lease=Lease(rt.root.child("leases", self.name), f"computation {self.name!r}"),
            writer=rt.settings.outbox_writer,
        )
        self.consumed = ConsumedFiles(self.checkpoint)
        #: key interval -> its last summary; absent = not reported yet
        self.summaries: dict[int, IntervalSummary] = {}
        self.applied_watermark = MIN_TIMESTAMP
        self.input_watermark = MIN_TIMESTAMP
        self.low_watermark = MIN_TIMESTAMP
        self.pending_inputs = 0
        self._hb_sent = MIN_TIMESTAMP
        #: the newest micro-batch whose files :attr:`_hb_sent` counts as consumed
        self._hb_upto = -1
        self._hb_at = 0.0
        #: since when input files have waited for a batch to plan them (``_waited``); None: none waits
        self._waiting_since: float | None = None
        self._hb_seq = 0
        self._ticked: dict[int, int] = {}
        #: key interval -> the newest watermark a heartbeat row addressed to it carried
        #: (``_write_heartbeat``) and how many batches were published when it was written
        self._reached: dict[int, tuple[int, int]] = {}
        self._tokens: dict[str, int] = {}
        #: the state move of the rescale that made its layout (``_layout.py``), until a start sees it done
        self._migration: dict[str, Any] | None = None
        #: where its envelopes live (``_layout.Layout.state_layout``), read again at each start
        self.state_layout = rt.settings.state_layout
        self.query: Any = None
        self.restart_policy = RestartPolicy(f"computation {self.name!r}", rt.settings.max_restarts)
        self.batches = 0
        #: whether the query has its keying stage (decided at each start: :meth:`_unkeyed_input`)
        self.keying_stage = False
        #: a row not keyed for it met a query without the stage: the stage stays for this driver
        self._keying_forced = False
        #: input files known to carry this computation's key columns (files never change)
        self._keyed_files: set[tuple[str, str, str]] = set()
        #: the inputs whose records the step reads from its batch's files (``_scan.py``)
        self.scanned: tuple[ScannedInput, ...] = ()
        self.listed_first = False  # Spark lists heartbeats before inputs (``QueryInputs``)
        #: its physical plan (``plans/``), chosen at each start: the layout may have changed
        self.plan: Plan | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self.heartbeats.mkdirs()
        lease = self.outbox.lease
        if lease is not None and lease.epoch:
            lease.check()  # a restart after a failure: only if no other driver took over
        else:
            lease.acquire(self.rt.driver_epoch.get())  # type: ignore[union-attr]
        layout = self.rt.layout(self.name)
        self.intervals, self.groups = layout.intervals, list(layout.groups)
        self.state_layout = layout.state_layout
        self._migration = layout.migration
        # its plan (``plans/``): a combination the runtime cannot run is refused here
        self.plan = plan = plan_for(self, layout)
        if layout.migration is not None:
            self._check_migration(layout.migration)
        # an offline rewrite (``_rewrite_pin.py``): its swap finished, or forgotten once committed
        settle_rewrite(self.rt.root, self.name, self.checkpoint, self.rt.log)
        bootstrap_at_start(self)  # an initial state, before the first batch (``_state_load.py``)
        # a killed attempt's files: its replay is their only writer
        dropped = drop_uncommitted_state(self.checkpoint)
        if dropped:
            self.rt.log(
                f"computation {self.name!r}: deleted {len(dropped)} state-store files of a batch that never committed; its replay writes them again"
            )
        self.outbox.recover()
        self.summaries.clear()
        self._tokens = self._acquire(layout)
        nums = [
            int(n.split(".")[0])
            for n in self.heartbeats.list()
            if n.endswith(".parquet") and n[0].isdigit()
        ]
        self._hb_seq = max(nums, default=-1) + 1
        # every interval reports its summary once, so the low watermark knows all holds
        now = int(time.time() * 1000)
        self._write_heartbeat(None, [(s, now) for s in range(self.intervals)])
        self.keying_stage = self._keying_forced or self._unkeyed_input()
        self.query = self._start(self._build(plan), plan)

    def _check_migration(self, migration: dict[str, Any]) -> None:
        """A rescaled computation's state moves into its new groups with the heartbeat file
        its rescale wrote (``_rescale.py``): it must be waiting for the query (renamed into
        view here if a kill -9 stopped the rescale just before: ``_layout.finish_move``), or
        read by it already (in its file source's log). Without it, the new layout would
        start from empty groups: refused, never run."""
        # a layout change (``_relayout.py``): its state is in place once it says "done"
        if "relayout" in migration:
            if migration["relayout"] != "done":
                msg = (
                    f"computation {self.name!r}: run.json gives it the {self.state_layout!r} state layout from a `millwheel rescale --layout` that was interrupted "
                    f"before its state was in place. Run `millwheel rescale {self.rt.root.uri} --computation {self.name} --layout {self.state_layout}` again to finish it"
                )
                raise MillwheelError(msg)
            return
        name = migration["file"]
        if not migration.get("moved") and finish_move(self.heartbeats, name):
            self.rt.log(
                f"computation {self.name!r}: finished the rescale to {self.intervals} key intervals a kill had interrupted ({name})"
            )
        if migration.get("moved") or self.heartbeats.child(name).exists():
            return
        self.consumed.refresh()
        if name in self.consumed.heartbeat_files:
            return
        msg = (
            f"computation {self.name!r}: run.json gives it {self.intervals} key intervals from a rescale whose state move "
            f"({self.heartbeats.child(name).uri}) is neither waiting nor read by its query: the rescale was interrupted. "
            f"Run `millwheel rescale {self.rt.root.uri} --computation {self.name} --intervals {self.intervals}` again to finish it"
        )
        raise MillwheelError(msg)

    def _acquire(self, layout: Any) -> dict[str, int]:
        """Own this computation's key intervals at the watermark authority (fresh tokens).

        After a rescale (``layout.migration``), the intervals of the old layout are merged
        into ``interval-0`` and that split into the new ones (§7.1): the old tokens are
        retired, so a zombie reporting for an old interval is fenced, and every new interval
        starts at the minimum of the old ones' values, so the published watermark neither
        goes back nor passes the moved keys' timers before the new intervals report. An
        authority that does not know the old intervals (an in-process one, or the move was
        made already) just has them acquired: a new interval holds the watermark at its
        start until it reports. Either way no old interval is left to hold it for ever.
        """
        wm = self.rt.watermarks
        names = [interval_name(i) for i in range(self.intervals)]
        migration = layout.migration
        if migration is not None and migration.get("authority") == "pending":
            old = [interval_name(i) for i in range(int(migration["from_intervals"]))]
            try:
                wm.merge(self.name, old, old[0])
                tokens = wm.split(self.name, old[0], names)
            except (UnknownNameError, ConflictError):
                tokens = None
            mark_migration(self.rt.root, self.name, "authority", "done")
            if tokens is not None:
                return tokens
        return wm.acquire_many(self.name, names)

    def _unkeyed_input(self) -> bool:
        """Whether a live input file lacks this computation's ``interval:C`` column (written
        before it read the stream, by an older millwheel or by a writer without a keyer):
        then its query needs the keying stage. Each file's footer is read once per driver."""
        _, icol = self.rt.keyer.columns(self.name)
        known, self._keyed_files = self._keyed_files, set()  # only live files are remembered
        for stream, producer in self.inputs:
            loc = self.rt.streams.location(stream, producer)
            for name in self.rt.streams.files(stream, producer, live_only=True):
                entry = (stream, producer, name)
                if entry not in known:
                    f = loc.child(name)
                    try:
                        names = pq.read_schema(f.path, filesystem=f.fs).names
                    except FileNotFoundError:
                        continue  # pruned meanwhile: consumed by every reader
                    if icol not in names:
                        self._keyed_files |= known
                        return True
                self._keyed_files.add(entry)
        return False

    def _start(self, writer: Any, plan: Plan) -> Any:
        """Start the query with its plan's state store (``_session.start_query``: the
        checkpoint pins the provider from its first start), without no-data batches unless
        its timers need them (:meth:`_no_data_batches`)."""
        return start_query(
            writer,
            self.rt.spark,
            {
                **plan.state_store_conf,
                **({} if self._no_data_batches(plan) else NO_DATA_BATCHES_OFF),
            },
        )

    def _no_data_batches(self, plan: Plan | None = None) -> bool:
        """Whether Spark runs a batch whenever only its watermark moved: for a class that
        handles timers on a plan whose timers wait for Spark's watermark. Not for a class
        without timers (nothing for such a batch to do), nor on a plan that takes
        heartbeats addressed to its key intervals, whose timers fire in the batch that reads
        the heartbeat (``docs/runtime.md``, "No-data batches", "Heartbeats in the batch
        that reads them")."""
        plan = plan or self.plan
        return self.spec.handles_timers and not (plan is not None and plan.addresses_heartbeats)

    def _build(self, plan: Plan) -> Any:
        """The query's streaming writer: its plan's frame over the inputs (``plans/``), into its sink."""
        inputs = query_inputs(self, plan)
        self.scanned = inputs.scanned
        self.listed_first = inputs.listed_first
        built = plan.build(inputs)
        writer = (
            built.out.writeStream.queryName(f"millwheel.{self.name}")
            .foreachBatch(built.sink)
            .option("checkpointLocation", self.checkpoint.uri)
        )
        if self.rt.settings.trigger_ms > 0:
            writer = writer.trigger(processingTime=f"{self.rt.settings.trigger_ms} milliseconds")
        return writer

    def check(self) -> None:
        """Restart the query from its checkpoint if it died (e.g. a Python worker was killed).
        First, :class:`~millwheel.runtime._lease.FencedError` if another driver took this
        query over: a fenced driver stops, and never restarts a query (``_lease.py``)."""
        self.outbox.fence()
        q = self.query
        if q is None or q.isActive:
            return
        exc = q.exception()
        if exc is None:
            return
        if not self.keying_stage and error_mentions(exc, KEYING_STAGE_NEEDED):
            # not a failure of the code: input not keyed for it arrived after it started
            self.rt.log(
                f"computation {self.name!r}: a record its producer did not key for it arrived; restarting its query with the keying stage"
            )
            self._keying_forced = True
        else:
            self.rt.log(self.restart_policy.failed(exc))
        wait_for_jobs(
            self.rt.spark, str(q.runId)
        )  # no task of the failed batch writes state after the start's cleanup
        self.start()

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None

    # ---- summaries ------------------------------------------------------------------------
    @property
    def metrics(self) -> Counter[str]:
        """The step counters of every published batch, over every driver of this run."""
        return self.outbox.metrics

    def _on_summary(self, batch: int, summaries: list[IntervalSummary]) -> None:
        self.batches += 1
        for summary in summaries:
            self.summaries[summary.interval] = summary
            self.applied_watermark = max(self.applied_watermark, summary.low_watermark)
        if summaries:
            fired = sum(s.metrics.get("timers_fired", 0) for s in summaries)
            lw = max(s.low_watermark for s in summaries)
            self.rt.audit.batch(
                self.name, batch, lw, fired, self.outbox.lease.epoch if self.outbox.lease else 0
            )

    # ---- low watermark (§4.5) --------------------------------------------------------------
    def update_watermark(self, now: int) -> int:
        """Recompute this computation's input and output low watermarks; send heartbeats."""
        self.outbox.publish_committed()
        wm = self.rt.watermarks
        upto = self.outbox.published
        # the upstream before the listing, the planned batch after it (``read_input_watermarks``): the
        # heartbeat may count the files of the batch Spark planned already (``_consumed.py``)
        (in_lw, hb_lw, pending, waiting), planned = read_input_watermarks(
            self.name,
            self.inputs,
            self.rt.streams,
            self.consumed,
            upto,
            self._upstream_watermark,
            listed_first=self.listed_first,
        )
        #: input files published and not consumed yet: a computation is drained only without any
        #: (a file sent under a finished watermark, a re-injection, holds no watermark)
        self.pending_inputs = pending
        self.input_watermark = max(self.input_watermark, in_lw)
        reports = []
        for i, summary in sorted(self.summaries.items()):
            if 0 <= i < self.intervals:  # (a retired group's summary is not an interval's)
                name = interval_name(i)
                reports.append((name, self._tokens[name], low_watermark(summary.hold, in_lw)))
        if reports:
            try:
                wm.report_batch(self.name, reports)
            except StaleTokenError as exc:
                msg = f"computation {self.name!r}: the watermark authority refused this driver's report, another driver owns its key intervals now ({exc}); this driver stops"
                raise FencedError(msg) from exc
        self.low_watermark = self.rt.watermark_of(self.name, fresh=True)
        waited, in_flight = self._waited(waiting), planned > upto
        self._heartbeat(
            hb_lw,
            now,
            self._heartbeat_needed(hb_lw, waited, in_flight),
            self._addressed(hb_lw, waited, in_flight),
            planned,
        )
        self._prune_heartbeats(upto)
        return self.low_watermark

    def _upstream_watermark(self) -> int:
        """The minimum of the upstream's published low watermarks (+inf without any)."""
        return min(
            (self.rt.watermark_of(producer) for producer in self.upstream), default=MAX_TIMESTAMP
        )

    def _prune_heartbeats(self, upto: int) -> None:
        """Delete the heartbeat files committed batches have read: only this query reads
        them, and a committed batch is never run again (its listing stays short).

        The newest file is kept: the next driver numbers its heartbeats after it, and a
        file source skips a name it has seen, so a number used again would be a
        heartbeat no batch reads (the query would wait for ever)."""
        names = self.consumed.heartbeat_names(upto)
        migration = self._migration
        if migration is not None and not migration.get("moved") and migration["file"] in names:
            # a committed, published batch read the state move: from now on run.json says so,
            # and starts stop looking for the file (``_check_migration``) — also when it is
            # the newest file, kept below (a drained run's last batch may be the move's)
            mark_migration(self.rt.root, self.name, "moved", True)
            migration["moved"] = True
        names.discard(f"{self._hb_seq - 1:012d}.parquet")
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
                None if self._no_data_batches() else self._hb_sent,
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
            return
        for i, w, _, _ in rows:
            if (
                i >= 0
                and w is not None
                and from_spark(w) > self._reached.get(i, (MIN_TIMESTAMP, 0))[0]
            ):
                self._reached[i] = (from_spark(w), self.batches)
        table = pa.table(
            {
                "interval": pa.array([r[0] for r in rows], pa.int32()),
                "wm": pa.array([r[1] for r in rows], pa.int64()),
                "now": pa.array([r[2] for r in rows], pa.int64()),
                "upto": pa.array([r[3] for r in rows], pa.int64()),
            },
            schema=_HB_FILE_SCHEMA,
        )
        name = f"{self._hb_seq:012d}.parquet"
        self._hb_seq += 1
        tmp = self.heartbeats.child(f".{name}.tmp")
        pq.write_table(table, tmp.path, filesystem=tmp.fs)
        tmp.move_to(self.heartbeats.child(name))
        self._hb_at = time.monotonic()

    # ---- reading -----------------------------------------------------------------------------
    def drained(self) -> bool:
        # a state move waiting for its batch is work too: a run rescaled after it drained runs it
        return (
            self.low_watermark >= MAX_TIMESTAMP
            and not self.outbox.loc.list()
            and not self.pending_inputs
            and not move_pending(self._migration)
        )

    def status(self) -> dict[str, Any]:
        return {
            "records_in": self.metrics["records_in"],
            "productions": self.metrics["productions"],
            "dead_letters": self.metrics["dead_letters"],
            "duplicates": self.metrics["duplicates"],
            "late": self.metrics["late"],
            "timers_fired": self.metrics["timers_fired"],
            "counters": StepMetrics.of(self.metrics).as_dict(),
            "low_watermark": self.low_watermark,
            "batches": self.batches,
        }


def prune_streams(queries: list[ComputationQuery], streams: FileStreamLog) -> int:
    """Move stream files that every consumer among ``queries`` has consumed in a published
    batch into their directory's ``_done/`` (``_streams.py``, "Pruning"); returns how many."""
    consumers: dict[tuple[str, str], list[ComputationQuery]] = {}
    for q in queries:
        for pair in q.inputs:
            consumers.setdefault(pair, []).append(q)
    moved = 0
    for (stream, producer), qs in consumers.items():
        done = set(streams.files(stream, producer, live_only=True))
        for q in qs:
            done &= q.consumed.names(stream, producer, q.outbox.published)
            if not done:
                break
        if done:
            moved += streams.prune(stream, producer, sorted(done))
            for q in qs:
                q.consumed.forget(stream, producer, done)
    return moved
