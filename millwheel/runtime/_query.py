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
from collections.abc import Callable
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
from millwheel.runtime._heartbeats import HB_SCHEMA, HeartbeatWriter
from millwheel.runtime._layout import finish_move, mark_migration, move_pending
from millwheel.runtime._lease import FencedError, Lease
from millwheel.runtime._outbox import Outbox
from millwheel.runtime._ownkeying import KEYING_STAGE_NEEDED
from millwheel.runtime._rewrite_pin import settle_rewrite
from millwheel.runtime._scan import ScannedInput
from millwheel.runtime._session import NO_DATA_BATCHES_OFF, start_query, wait_for_jobs
from millwheel.runtime._spark_internals import error_mentions, polling_delay_conf
from millwheel.runtime._state_files import (
    drop_uncommitted_state,
    release_state_stores,
)
from millwheel.runtime._state_load import bootstrap_at_start
from millwheel.runtime._streams import FileStreamLog
from millwheel.runtime._usercode import RestartPolicy
from millwheel.runtime._wire import IntervalSummary, interval_name
from millwheel.runtime.plans import Plan, plan_for
from millwheel.runtime.plans._inputs import query_inputs
from watermark_authority import ConflictError, StaleTokenError, UnknownNameError

#: a rescale's heartbeat file (``_rescale.py``): :data:`HB_SCHEMA` and the columns of its rows
HB_MOVE_SCHEMA = pa.schema(
    [
        *HB_SCHEMA,
        ("kind", pa.int32()),
        ("group", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)

#: how long a drained query waits for the batches that carry out the wake-ups its last
#: watermark made due (:meth:`ComputationQuery.drained`): a few ticks' batches; past it the
#: run stops, and those keys stay in its state until new input runs their interval
DRAIN_WAKE_S = 30.0


class ComputationQuery(HeartbeatWriter):
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
            before_publish=self._before_publish,
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
        self._hb_seq = self._hb_shown = 0
        self._ticked: dict[int, int] = {}
        #: since when a drained query waits for due wake-ups (``drained``); None: it does not
        self._drain_wait: float | None = None
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
        # an earlier run's state-store providers in this JVM (a restart after a failure or a
        # move): their maintenance writes now, before anything below changes the store
        release_state_stores(self.rt.spark, self.checkpoint.child("state"))
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
        names = self.heartbeats.list()
        nums = [int(n.split(".")[0]) for n in names if n.endswith(".parquet") and n[0].isdigit()]
        self._hb_shown = max(nums, default=-1)
        self._hb_seq = self._hb_shown + 1
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
        its timers need them (:meth:`_no_data_batches`), looking at its inputs again
        ``computation_poll_ms`` after a look found nothing (``RuntimeSettings``)."""
        poll = self.rt.settings.computation_poll_ms
        return start_query(
            writer,
            self.rt.spark,
            {
                **plan.state_store_conf,
                **({} if self._no_data_batches(plan) else NO_DATA_BATCHES_OFF),
                **(polling_delay_conf(poll) if poll is not None else {}),
            },
        )

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
        for i, lw in self._interval_watermarks(self.summaries, in_lw):
            name = interval_name(i)
            reports.append((name, self._tokens[name], lw))
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

    def _before_publish(
        self, batch: int, summaries: list[IntervalSummary]
    ) -> Callable[[], None] | None:
        """Before ``batch``'s files are published: the low watermark this computation
        publishes once they are, given to its consumers in this driver to stage a heartbeat
        each (:meth:`~millwheel.runtime._heartbeats.HeartbeatWriter.stage_heartbeat`);
        returns the call that shows them, made once the files are in place. ``None`` without
        such a consumer, or while an interval's holds are not known (§4.5: the watermark is
        the minimum over every interval, each bounded by the input files no published batch
        consumed)."""
        consumers = self.rt.heartbeat_consumers(self.name)
        holds = {**self.summaries, **{s.interval: s for s in summaries}}
        if not consumers or any(i not in holds for i in range(self.intervals)):
            return None
        (in_lw, *_), _ = read_input_watermarks(
            self.name, self.inputs, self.rt.streams, self.consumed, batch, self._upstream_watermark
        )
        wm = min(lw for _, lw in self._interval_watermarks(holds, in_lw))
        if wm <= self.low_watermark:
            return None
        shows = [s for c in consumers if (s := c.stage_heartbeat(self.name, wm)) is not None]

        def show_all() -> None:
            for show in shows:
                show()

        return show_all if shows else None

    def _interval_watermarks(
        self, summaries: dict[int, IntervalSummary], in_lw: int
    ) -> list[tuple[int, int]]:
        """Each key interval's low watermark (§4.5): its oldest pending work (the hold its
        last summary gives), bounded by the input low watermark ``in_lw``; a retired
        group's summary is not an interval's."""
        return [
            (i, low_watermark(s.hold, in_lw))
            for i, s in sorted(summaries.items())
            if 0 <= i < self.intervals
        ]

    def _upstream_watermark(self) -> int:
        """The minimum of the upstream's published low watermarks (+inf without any)."""
        return min(
            (self.rt.watermark_of(producer) for producer in self.upstream), default=MAX_TIMESTAMP
        )

    # ---- reading -----------------------------------------------------------------------------
    def drained(self) -> bool:
        # a state move waiting for its batch is work too: a run rescaled after it drained runs it
        done = (
            self.low_watermark >= MAX_TIMESTAMP
            and not self.outbox.loc.list()
            and not self.pending_inputs
            and not move_pending(self._migration)
        )
        if not done or not self.wakes_pending():
            self._drain_wait = None
            return done
        # the ticks of the wake-ups the last watermark made due (keys that keep only ids):
        # waited for, up to DRAIN_WAKE_S, so that a drained run forgets those keys too
        if self._drain_wait is None:
            self._drain_wait = time.monotonic()
        return time.monotonic() - self._drain_wait > DRAIN_WAKE_S

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
