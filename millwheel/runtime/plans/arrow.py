"""Columnar computations on the opt-in Arrow mapping (``ComputationOptions(mapping="arrow")``;
``docs/runtime.md``, "Plans", "The Arrow mapping").

::

    union of the inputs (those the tasks read from the batch's files: their file sources,
    no row read, ``marks_in_tasks``; or rows) and heartbeats (``_query.py``, as for the
    default mapping)
        ─► select(the task's columns) ─► repartition(N, group) ─► mapInArrow(IntervalTask)
              (all three in the query's own plan, built once per query start)
        ─► foreachBatch(ArrowMapping.sink):
              plan the batch (driver): last committed manifest, low watermark, wall ticks,
              due intervals; the plan set as a local property of the stream's thread
              (``PLAN_PROPERTY``)
              ─► Outbox.sink (staged, crash points, weak publication: as the default
                 mapping) of that frame, or of ``ArrowMapping.rowless`` when the batch needs
                 none of its rows (``ArrowMapping.tasks``), whose job runs the tasks, one
                 per partition: each reads the plan from its task context, then each key
                 interval of the partition that has rows, records in the batch's files
                 (``_scan.batch_intervals``), a tick or a timer due: its store from its
                 file (or the worker's cache of it), its
                 records from the batch's files, run by ColumnarIntervalStep.run_interval,
                 its new store written to a file of its own (held ids to segment files,
                 ``_colsegments.py``);
                 productions + summary rows out
              ─► the batch's manifest (``_colfiles.py``), before Spark's commit

The default mapping keeps each key interval's columnar store in ``applyInPandasWithState``'s
GroupState row: pickled from Python to the JVM and back and written whole by the state
store on every batch that touches the interval. Here the store never enters the JVM: a
task reads the file the last committed manifest names, a Python worker keeps what it
wrote (a later task of the same interval on the same worker skips the read and the
decode), and only the new version is written. Spark's role shrinks to the offset/commit
logs, scheduling the tasks and, for inputs read as rows, reading them and one hash shuffle.

**One task function per query.** The tasks' function and their columns are part of the
query's plan, so Spark plans them with the batch and the driver builds no DataFrame per
batch: built in the sink, each batch cost ~160 Py4J calls and a new ``pandas_udf`` (its
function pickled and registered anew), 80-185 ms before its job (``bench/results/HISTORY.md``,
2026-11-30). What changes per batch, the :class:`BatchPlan`, reaches the tasks as a local
property of the thread that runs the sink (Spark sends a job's local properties with each of
its tasks, as it does the batch id): each task checks that the plan is its batch's.

**Time.** Without a stateful operator Spark runs no batch when only its watermark moves, so
the low watermark is the driver's: batch ``B`` runs under the larger of batch ``B - 1``'s
(from its manifest) and the heartbeats ``B`` reads (found through the query's offset log
and the heartbeat source's log: the same for a replay). Wall time is the batch's
``batchTimestampMs`` from the offset log, raised by ticks, as on the default mapping.
Intervals with a timer due run even without input: each task also runs the due intervals
its partition owns (``pmod(hash(group), N)``, Spark's hash partitioning,
:func:`~millwheel.runtime._wire.spark_hash_int`).

The commit protocol (versions, replays, zombie tasks, why speculation must be off) is in
``docs/runtime.md``, "The Arrow mapping".
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from millwheel._colstore import ColumnarStore
from millwheel._errors import RunError
from millwheel._fields import FIELDS_COLUMN
from millwheel._options import LateAction
from millwheel._record import MIN_TIMESTAMP
from millwheel.runtime._colfiles import STATE_DIR, ColumnarFiles, Manifest, store_name
from millwheel.runtime._columnar import ColumnarIntervalStep, send_order
from millwheel.runtime._fieldcols import CARRY_PREFIX
from millwheel.runtime._heartbeats import HB_FILE_SCHEMA
from millwheel.runtime._outbox import crash_point, staged_version
from millwheel.runtime._scan import SCAN_COLUMN, batch_intervals
from millwheel.runtime._spark_internals import (
    OFFSETS,
    committed_batches,
    offset_log_metadata,
    task_batch_id,
    task_property,
)
from millwheel.runtime._wire import (
    SUMMARY_STREAM,
    IntervalSummary,
    RowKind,
    from_spark,
    spark_hash_int,
)
from millwheel.runtime.plans._base import Built, QueryInputs
from millwheel.runtime.plans._choice import PlanKind

__all__ = ["ArrowMapping", "ArrowPlan", "BatchPlan", "IntervalTask", "out_arrow_schema"]

#: a heartbeat file of watermarks and ticks only (``_heartbeats.HB_FILE_SCHEMA``): a batch whose
#: files are all such needs none of its rows in its tasks (:meth:`ArrowMapping.tasks`)
_TICK_FILE_COLUMNS = frozenset(HB_FILE_SCHEMA.names)
#: what the driver reads of a batch's heartbeat files (:meth:`ArrowMapping._heartbeats`)
_HB_READ = ("interval", "wm", "now")

#: the union's columns a task reads (``wm_ts`` only moves Spark's watermark, which this mapping does not use)
_TASK_COLUMNS = ("group", "kind", "key", "id", "ts", "value", "wm", "stream", "src", "row", "now")


def out_arrow_schema(step: ColumnarIntervalStep) -> pa.Schema:
    """The Arrow schema of a task's output: ``OUT_SCHEMA`` and the consumers' key columns."""
    fields = [
        pa.field("stream", pa.string()),
        pa.field("id", pa.string()),
        pa.field("ts", pa.int64()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("wm", pa.int64()),
    ]
    if step.keyer is not None:
        fields += step.keyer.arrow_fields(step.out_consumers)
    if step.out_fields is not None:  # its declared output stream: ``_fieldcols.production_fields``
        fields.append(pa.field(FIELDS_COLUMN, step.out_fields[1].arrow_type()))
    return pa.schema(fields)


@dataclass(frozen=True)
class BatchPlan:
    """What the driver tells every task of one batch."""

    batch: int
    #: unique to this run of the batch: its store files are named with it
    token: str
    low_watermark: int
    now: int
    #: the watermark before the batch's heartbeats: a production of the computation's
    #: upstream arrived under it (``IntervalBatch.arrival``)
    arrival: int
    partitions: int
    #: key interval -> the store file the last committed manifest names
    read: dict[int, str]
    #: intervals with a timer due (they run without input)
    due: tuple[int, ...]
    #: where the store files are (``Location.uri``)
    root: str
    #: key interval -> the wall time of a tick the batch's heartbeat files carry for it: the
    #: interval runs, at that time if it is later than ``now`` (``IntervalBatch.take_ticks``)
    ticks: dict[int, int] = dataclasses.field(default_factory=dict)

    def encode(self) -> str:
        """The plan as the text of :data:`PLAN_PROPERTY`."""
        d = dataclasses.asdict(self)
        d["read"] = [[i, n] for i, n in self.read.items()]
        d["ticks"] = [[i, t] for i, t in self.ticks.items()]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> BatchPlan:
        d = json.loads(text)
        d["read"] = {int(i): n for i, n in d["read"]}
        d["due"] = tuple(d["due"])
        d["ticks"] = {int(i): int(t) for i, t in d["ticks"]}
        return cls(**d)

    @classmethod
    def of_task(cls) -> BatchPlan:
        """The plan of the batch the running Spark task belongs to (its job's local
        property, set by :meth:`ArrowMapping.sink`)."""
        text = task_property(PLAN_PROPERTY)
        batch = task_batch_id()
        if text is None or batch is None:
            what = "no batch plan" if text is None else "no micro-batch id"
            msg = (
                f"an Arrow-mapping task of micro-batch {batch} found {what} in its task "
                f"context (local properties {PLAN_PROPERTY!r}, 'streaming.sql.batchId'): its "
                "job was not started by the query's foreachBatch sink on the stream's thread "
                "(PySpark's pinned threads, the default, are off: PYSPARK_PIN_THREAD=false?)"
            )
            raise RunError(msg)
        plan = cls.decode(text)
        if plan.batch != batch:
            msg = f"an Arrow-mapping task of micro-batch {batch} was given the plan of batch {plan.batch}"
            raise RunError(msg)
        return plan


#: the local property that carries a batch's :class:`BatchPlan` to its tasks
PLAN_PROPERTY = "millwheel.arrow.plan"

#: per Python worker: (store directory, interval) -> (file name, the store decoded); a task
#: that reads the very file this worker wrote uses the object instead
_CACHE: dict[tuple[str, int], tuple[str, ColumnarStore]] = {}


class IntervalTask:
    """The ``mapInArrow`` function of a query: runs the key intervals of its partition, by
    its batch's :class:`BatchPlan` (given, in process; otherwise read from the task's context:
    :meth:`BatchPlan.of_task`). ``rowless``: the task of :attr:`ArrowMapping.rowless`, whose
    one input row per partition carries nothing."""

    def __init__(
        self, step: ColumnarIntervalStep, plan: BatchPlan | None = None, *, rowless: bool = False
    ) -> None:
        self.step = step
        self.plan = plan
        self.rowless = rowless

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from millwheel.runtime._fs import Location

        ctx = TaskContext.get()
        partition, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (0, 0)
        plan = self.plan if self.plan is not None else BatchPlan.of_task()
        step = self.step
        files = ColumnarFiles(Location.of(plan.root))
        if self.rowless:
            for _ in batches:  # the partition's placeholder row
                pass
            frames: dict[int, pa.Table | None] = {}
        else:
            frames = _by_interval(step, [b for b in batches if b.num_rows])
        groups = step.groups or []

        def owned(intervals: Iterable[int]) -> set[int]:
            """Those of ``intervals`` whose group this partition holds (Spark's hash partitioning)."""
            return {
                i for i in intervals if spark_hash_int(groups[i]) % plan.partitions == partition
            }

        # the intervals with records in the batch's files, which Spark did not scan
        # (``ArrowPlan.marks_in_tasks``): the task reads them as a marker row would say
        marked = (
            set()
            if step.scan is None
            else owned(_in_layout(step, batch_intervals(step.scan, plan.batch)))
        )
        for i in marked | owned(plan.due) | owned(plan.ticks):
            frames.setdefault(i, None)
        schema = out_arrow_schema(step)
        for interval in sorted(frames):
            name = plan.read.get(interval)
            store: bytes | ColumnarStore | None = None
            if name is not None:
                cached = _CACHE.pop((plan.root, interval), None)
                store = (
                    cached[1]
                    if cached is not None and cached[0] == name
                    else files.read_store(interval, name)
                )
            res, cols, tail = step.run_interval(
                interval,
                frames[interval],
                store,
                plan.low_watermark,
                max(plan.now, plan.ticks.get(interval, plan.now)),
                plan.batch,
                plan.arrival,
                marked=interval in marked,
            )
            written = None
            if res.store is not None:
                written = store_name(plan.batch, plan.token, partition, attempt)
                files.write_store(interval, written, res.store)
                if res.decoded is not None:
                    _CACHE[(plan.root, interval)] = (written, res.decoded)
            # the summary row names the store file: the driver's manifest takes it from there
            tail.loc[tail["stream"] == SUMMARY_STREAM, "id"] = written
            yield out_batch(schema, cols, tail)


def _in_layout(step: ColumnarIntervalStep, intervals: set[int]) -> set[int]:
    """``intervals``, each a key interval of ``step``'s layout; a record keyed by its producer
    for another count of intervals fails the batch (as a row of no group does on a plan that
    scans its inputs in Spark)."""
    n = len(step.groups or [])
    bad = sorted(i for i in intervals if not 0 <= i < n)
    if bad:
        msg = (
            f"computation {step.spec.name!r}: the micro-batch's files hold records keyed for key "
            f"intervals {bad[:5]}, outside this run's {n}: were they written for another run?"
        )
        raise RunError(msg)
    return intervals


def _by_interval(
    step: ColumnarIntervalStep, rows: list[pa.RecordBatch]
) -> dict[int, pa.Table | None]:
    """A task's input rows per key interval, each interval's in send order (one sort of the
    task's rows by group then :func:`send_order`, one take, zero-copy slices)."""
    if not rows:
        return {}
    table = pa.Table.from_batches(rows)
    g = table.column("group").to_numpy()
    order = send_order(table, g)
    g = g[order]
    if not (order[1:] > order[:-1]).all():
        table = table.take(pa.array(order))
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]).tolist()
    out: dict[int, pa.Table | None] = {}
    for a, b in zip(starts, [*starts[1:], len(g)], strict=True):
        if int(g[a]) >= 0:  # the heartbeat group: the driver read its watermark already
            out[step.interval_of(int(g[a]))] = table.slice(a, b - a)
    return out


def out_batch(schema: pa.Schema, cols: dict[str, Any] | None, tail: pd.DataFrame) -> pa.RecordBatch:
    """A task's output rows for one interval: the productions' columns (lists, built without
    pandas) then the frame of dead letters and the summary row."""
    arrays = []
    for f in schema:
        part = (
            pa.Array.from_pandas(tail[f.name], type=f.type)
            if f.name in tail.columns
            else pa.nulls(len(tail), f.type)
        )
        if cols:
            v = cols.get(f.name)
            if v is None:
                head = pa.nulls(len(cols["id"]), f.type)
            elif isinstance(v, (pd.Series, pd.api.extensions.ExtensionArray)):
                head = pa.Array.from_pandas(v, type=f.type)
            else:
                head = pa.array(v, type=f.type)
            part = pa.concat_arrays([head, part])
        arrays.append(part)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class ArrowMapping:
    """The driver side of one computation's query on the Arrow mapping."""

    def __init__(
        self, query: Any, step: ColumnarIntervalStep, partitions: int, consumed: Any
    ) -> None:
        self.query = query
        self.name = query.name
        self.step = step
        self.partitions = partitions
        self.outbox = query.outbox
        self.checkpoint = query.checkpoint
        self.heartbeats = query.heartbeats
        self.files = ColumnarFiles(query.rt.root.child(STATE_DIR, query.name))
        #: a ``ConsumedFiles`` of the query's checkpoint, for this sink's thread only
        self.consumed = consumed
        #: do tasks need the records' values: the computation reads them or fields of them, or sends late records to a stream
        runner = step.columnar()
        late = runner.options.late.action is LateAction.TO_STREAM
        self.values = "value" in runner.record_columns or late or bool(runner.value_fields)
        #: the tasks of a batch whose rows they do not need (:meth:`tasks`): built once
        self.rowless: Any = None

    def tasks(self, union: Any, rows: bool = True) -> Any:
        """The query's frame: ``union``'s task columns, shuffled by group, run by :class:`IntervalTask`.

        Unless an input reaches the query as rows (``rows``), the union holds only the
        heartbeat source's rows, which the driver reads itself (:meth:`plan`): then a batch
        whose heartbeat files carry only watermarks and ticks runs :attr:`rowless` instead,
        one task per partition and no row of the micro-batch (Spark plans the batch's frame,
        for its offsets, and never runs it): one Spark stage, no scan, no shuffle."""
        from pyspark.sql import functions as F

        if not rows:
            n = self.partitions
            self.rowless = union.sparkSession.range(0, n, 1, n).mapInArrow(
                IntervalTask(self.step, rowless=True), self.step.out_schema()
            )

        cols = [F.col(c) for c in _TASK_COLUMNS] + [
            F.col(f"`{c}`") for c in union.columns if c.startswith(CARRY_PREFIX) or c == SCAN_COLUMN
        ]
        if not self.values:
            # the computation reads no values: only rows that are not records (dead letters of
            # keying, rows to key in the task) keep theirs through the shuffle
            record = F.lit(int(RowKind.RECORD))
            cols[_TASK_COLUMNS.index("value")] = F.when(
                F.col("kind") != record, F.col("value")
            ).alias("value")
        out = union.select(*cols).repartition(self.partitions, F.col("group"))
        return out.mapInArrow(IntervalTask(self.step), self.step.out_schema())

    def sink(self, df: Any, batch_id: int) -> None:
        """``foreachBatch`` of :meth:`tasks`' frame: plan the batch, run its tasks and stage
        their output, write the manifest."""
        prev, plan, rows = self.plan(batch_id)
        sc = df.sparkSession.sparkContext
        # the stream's thread: its jobs' tasks carry the plan (``BatchPlan.of_task``)
        sc.setLocalProperty(PLAN_PROPERTY, plan.encode())
        try:
            self.outbox.sink(df if rows or self.rowless is None else self.rowless, batch_id)
        finally:
            sc.setLocalProperty(PLAN_PROPERTY, None)
        reports = self._reports(batch_id)
        epoch = self.outbox.lease.epoch if self.outbox.lease is not None else 0
        self.files.write_manifest(prev.after(batch_id, plan.low_watermark, reports, epoch))
        # test hook (``_outbox.crash_point``): the manifest of a batch Spark has not committed
        crash_point(self.name, "after_manifest", batch_id, any(r[1] for r in reports))

    def plan(self, batch: int) -> tuple[Manifest, BatchPlan, bool]:
        """The last committed manifest before ``batch``, the batch's plan, and whether its
        tasks need the batch's rows (its heartbeat files carry rows other than watermarks and
        ticks: a state load's; the same files on a replay, so the same answer)."""
        prev = self.files.manifest_before(batch, set(committed_batches(self.checkpoint)))
        self.files.collect(prev, self.query.intervals)
        meta = (
            offset_log_metadata(self.checkpoint.child(OFFSETS, str(batch)).read_text() or "") or {}
        )
        now = int(meta.get("batchTimestampMs", 0))
        hb_wm, ticks, rows = self._heartbeats(batch)
        lw = max(prev.low_watermark, hb_wm)
        plan = BatchPlan(
            batch,
            uuid.uuid4().hex[:10],
            lw,
            now,
            prev.low_watermark,
            self.partitions,
            dict(prev.files),
            tuple(prev.due(lw, now)),
            self.files.loc.uri,
            ticks,
        )
        return prev, plan, rows

    def _heartbeats(self, batch: int) -> tuple[int, dict[int, int], bool]:
        """What the heartbeat files batch ``batch`` reads say: the newest input low watermark,
        each key interval's newest tick, and whether a file holds other rows (a state load's:
        only the rows path hands them to the tasks). A tick for an interval the layout lacks
        wakes nothing, as the query's heartbeat source drops it (``plans/_inputs.py``)."""
        c = self.consumed
        c.refresh()
        upto, before = c.log_offsets(batch), c.log_offsets(batch - 1)
        wm, rows = MIN_TIMESTAMP, False
        ticks: dict[int, int] = {}
        old = set()
        for name, (i, b) in c.heartbeat_files.items():
            if b <= before.get(i, -1):
                old.add(name)
            elif b <= upto.get(i, -1):
                f = self.heartbeats.child(name)
                try:
                    with f.fs.open_input_file(f.path) as s:
                        pf = pq.ParquetFile(s)
                        names = pf.schema_arrow.names
                        t = pf.read(columns=[n for n in _HB_READ if n in names])
                except FileNotFoundError:
                    continue  # pruned: a batch that read it was published, so this is a late zombie call
                rows = rows or not set(names) <= _TICK_FILE_COLUMNS
                cols = (
                    t.column(n).to_pylist() if n in names else [None] * t.num_rows for n in _HB_READ
                )
                for interval, w, at in zip(*cols, strict=True):
                    if interval is None:
                        continue
                    if interval < 0:
                        if w is not None:
                            wm = max(wm, from_spark(w))
                    elif w is not None:
                        rows = True  # a watermark addressed to an interval: its step applies it
                    elif at is not None and interval < self.query.intervals:
                        ticks[interval] = max(ticks.get(interval, at), at)
        if old:
            c.forget(None, None, old)
        return wm, ticks, rows

    def _reports(self, batch: int) -> list[tuple[int, str | None, int | None, int | None]]:
        """Each interval the batch ran: its store file and next timers, from the staged summary rows."""
        staged = staged_version(self.outbox.loc.child(str(batch)))
        d = staged.child(f"stream={SUMMARY_STREAM}") if staged is not None else None
        out = []
        for part in sorted(d.list()) if d is not None else []:
            if part.endswith(".parquet") and not part.startswith((".", "_")):
                loc = d.child(part)  # type: ignore[union-attr]
                with loc.fs.open_input_file(loc.path) as f:
                    t = pq.read_table(f, columns=["id", "value"])
                for name, value in zip(
                    t.column("id").to_pylist(), t.column("value").to_pylist(), strict=True
                ):
                    s = IntervalSummary.decode(value)
                    out.append((s.interval, name, s.next_low_watermark_timer, s.next_wall_timer))
        return out


class ArrowPlan:
    """:attr:`PlanKind.ARROW`: a columnar computation's state in versioned files, not in Spark."""

    kind: ClassVar[PlanKind] = PlanKind.ARROW
    #: no stateful operator: Spark's state store is not used
    state_store_conf: ClassVar[dict[str, str]] = {}
    takes_markers: ClassVar[bool] = True
    #: its tasks select their columns themselves (``_TASK_COLUMNS``)
    narrows_to_markers: ClassVar[bool] = False
    #: every task runs, rows or none: each finds its own marked intervals (``IntervalTask``)
    marks_in_tasks: ClassVar[bool] = True
    #: the driver reads the heartbeats a batch reads itself (``BatchPlan``); no stateful operator, no no-data batch
    addresses_heartbeats: ClassVar[bool] = False
    #: a due interval runs in any batch (``BatchPlan.due``), which a heartbeat or a tick starts
    timers_in_no_data_batches: ClassVar[bool] = False

    def __init__(self, query: Any, pin: dict[str, Any]) -> None:
        self.query = query
        #: the partition count ``run.json`` pinned at its first start (``_colfiles.pin_mapping``)
        self.partitions = int(pin["partitions"])

    def build(self, inputs: QueryInputs) -> Built:
        from millwheel.runtime._consumed import ConsumedFiles

        query, rt = self.query, self.query.rt
        step = ColumnarIntervalStep(
            query.spec,
            pipeline=rt.pipeline_id,
            registry=rt.settings.registry,
            keyer=rt.keyer,
            groups=query.groups,
        )
        step.scan = inputs.scan
        mapping = ArrowMapping(query, step, self.partitions, ConsumedFiles(query.checkpoint))
        # the held ids beside the stores, not in them (``_colsegments.py``): a store file is
        # written whole every batch that runs its interval, the ids only once
        step.ids_beside(mapping.files.loc.child("ids").uri, rt.spark)
        return Built(mapping.tasks(inputs.union, inputs.rows), mapping.sink)
