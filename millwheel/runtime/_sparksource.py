"""The injector of a :class:`~millwheel.SparkSource`: any streaming DataFrame into a stream log.

One streaming query per injector (``millwheel.injector.<name>``), like the log-file
injector's (``_injectors.LogFileInjector``): the user's DataFrame, with Spark's event-time
watermark on its timestamp (``withWatermark``, the declared delay) unless the source keeps
its own in its offsets, into ``foreachBatch``. There each micro-batch is turned into
stream-log rows on the executors (``mapInArrow``: id, timestamp, value, the sender
watermark, each row keyed for the stream's consumers, dead letters for rows that are no
record) and handed to the same outbox as every query (``_outbox.py``): staged before
Spark's commit, published after it.

**Exactly once on replay.** Spark's offset log is the injector's checkpoint: a batch
replayed after a crash reads the same offsets, so it yields the same rows; ids come from
the rows (or from their position in the batch: batch id, partition, content and
occurrence), and the sender watermark from the offset log, so the replay writes the same
records, which only its committed version publishes.

**The injector low watermark** (§5.2), read from the offset log as batches are published:

* ``offset_watermark="lw"``: the source's own, the field of its offsets (the end offsets
  of the last published batch), ``MAX_TIMESTAMP`` when it is finished;
* otherwise Spark's event-time watermark, ``batchWatermarkMs`` in the offset-log entry of
  the batch after the last published one (Spark writes it before running that batch; it
  is the newest event time of the published batches minus the declared delay).

Rows of batch N are sent under the watermark in force before it (a record behind it is
late, as a record behind Spark's own watermark is). ``end_ms``: once the low watermark
reaches it the injector is finished (+inf) and its query stops.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._delivery import invalid_record
from millwheel._errors import MillwheelError
from millwheel._fields import FIELDS_COLUMN
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, Record, encode_key
from millwheel._sparkio import SparkSource, kafka_package
from millwheel._topology import InjectorSpec
from millwheel.runtime._context import DriverContext
from millwheel.runtime._injectors import QueryInjector
from millwheel.runtime._logfiles import log_schema, value_columns
from millwheel.runtime._outbox import _numbers
from millwheel.runtime._session import start_query
from millwheel.runtime._spark_internals import (
    offset_log_entries,
    offset_log_metadata,
    planned_batches,
)
from millwheel.runtime._wire import OUT_SCHEMA, SUMMARY_STREAM, IntervalSummary

#: the column the injector adds for Spark's event-time watermark
TS_COLUMN = "__millwheel_ts"


def missing_connector(exc: BaseException, spark_version: str, where: str) -> MillwheelError | None:
    """The clear error for a Spark data source that is not on the classpath (Kafka's
    connector, most often), naming the fix; ``None`` for any other error.

    >>> class AnalysisException(Exception): ...
    >>> e = AnalysisException("[DATA_SOURCE_NOT_FOUND] Failed to find the data source: kafka. Make sure ...")
    >>> print(missing_connector(e, "4.3.0", "injector 'clicks'"))  # doctest: +ELLIPSIS
    injector 'clicks': Spark has no 'kafka' data source on its classpath. Spark's Kafka connector is a package: run with --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0 ...
    """
    text = str(exc)
    if "DATA_SOURCE_NOT_FOUND" not in text and "Failed to find data source" not in text:
        return None
    fmt = "?"
    for marker in ("Failed to find the data source: ", "Failed to find data source: "):
        if marker in text:
            fmt = text.split(marker, 1)[1].split(".", 1)[0].split()[0].strip("'\"")
            break
    if fmt.lower() == "kafka":
        pkg = kafka_package(spark_version)
        fix = (
            f"Spark's Kafka connector is a package: run with --packages {pkg} "
            f"(millwheel run and spark-submit), or Topology(..., spark_conf={{'spark.jars.packages': '{pkg}'}}); "
            "without network access, --jars with the connector's jar and its kafka-clients jar"
        )
    else:
        fix = f"put the jar that provides it on the classpath (--packages GROUP:ARTIFACT:VERSION or --jars FILE.jar), or register a Python data source named {fmt!r}"
    return MillwheelError(f"{where}: Spark has no {fmt!r} data source on its classpath. {fix}")


def _offset_lines(loc: Any) -> tuple[dict[str, Any], list[Any]] | None:
    """An offset-log entry: its metadata and its sources' offsets (``None`` for none)."""
    text = loc.read_text()
    meta = offset_log_metadata(text) if text else None
    if meta is None:
        return None
    return meta, offset_log_entries(text)


def convert_batch(
    source: SparkSource,
    injector: str,
    stream: str,
    batch_id: int,
    sender_wm: int,
    keyer_blob: str | None,
    consumers: list[str],
) -> Any:
    """The ``mapInArrow`` function of micro-batch ``batch_id``: rows -> stream-log rows."""

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import base64
        import pickle

        import xxhash
        from pyspark import TaskContext

        keyer = pickle.loads(base64.b64decode(keyer_blob)) if keyer_blob else None
        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        seen: dict[str, int] = {}
        index = 0
        newest = MIN_TIMESTAMP
        counts = {"records": 0, "dead_letters": 0, "beyond_end": 0}
        names = ["stream", "id", "ts", "key", "value", "wm"]
        if keyer is not None:
            names += [f.name for f in keyer.arrow_fields(consumers)]
        declared = None if keyer is None else keyer.fields.get(stream)
        if declared is not None:
            names.append(FIELDS_COLUMN)
        for batch in batches:
            out: list[tuple[str, Record, int | None]] = []
            for row in batch.to_pylist():
                position: tuple[Any, ...] = (batch_id, part, index)
                if source.id_columns is None:  # the row's place: same offsets, same rows, same ids
                    content = xxhash.xxh3_64_hexdigest(repr(sorted(row.items())).encode())
                    n = seen.get(content, 0)
                    seen[content] = n + 1
                    position = ("spark", batch_id, part, content, n)
                rec, problem = source.record_of(row, position)
                if problem is not None:
                    out.append(
                        (
                            DEAD_LETTER_STREAM,
                            invalid_record(injector, stream, rec, problem, (batch_id, part, index)),
                            None,
                        )
                    )
                    counts["dead_letters"] += 1
                elif source.end_ms is not None and rec.timestamp >= source.end_ms:  # type: ignore[union-attr]
                    counts["beyond_end"] += 1
                else:
                    out.append((stream, rec, sender_wm))
                    counts["records"] += 1
                    newest = max(newest, rec.timestamp)  # type: ignore[union-attr]
                index += 1
            if out:
                values, fields = value_columns(
                    keyer, stream, [s for s, _, _ in out], [r.value for _, r, _ in out]
                )
                arrays = [
                    pa.array([s for s, _, _ in out], pa.string()),
                    pa.array([r.id for _, r, _ in out], pa.string()),
                    pa.array([r.timestamp for _, r, _ in out], pa.int64()),
                    pa.array(
                        [None if r.key is None else encode_key(r.key) for _, r, _ in out],
                        pa.binary(),
                    ),
                    values,
                    pa.array([w for _, _, w in out], pa.int64()),
                ]
                if keyer is not None:
                    arrays += keyer.arrays([(s, r) for s, r, _ in out], consumers)
                if fields is not None:
                    arrays.append(fields)
                yield pa.RecordBatch.from_arrays(arrays, names=names)
        # one summary row per partition: its counts and newest event time (the status's "head")
        summary = IntervalSummary(
            interval=part,
            hold=None,
            next_low_watermark_timer=None,
            next_wall_timer=None,
            keys=0,
            metrics=counts,
            low_watermark=newest,
        )
        arrays = [
            pa.array([SUMMARY_STREAM]),
            pa.array([f"{batch_id}-{part}"]),
            pa.array([0], pa.int64()),
            pa.array([None], pa.binary()),
            pa.array([summary.encode()], pa.binary()),
            pa.array([None], pa.int64()),
        ]
        if keyer is not None:
            arrays += [pa.nulls(1, f.type) for f in keyer.arrow_fields(consumers)]
        if declared is not None:
            arrays.append(pa.nulls(1, declared.arrow_type()))
        yield pa.RecordBatch.from_arrays(arrays, names=names)

    return convert


class SparkSourceInjector(QueryInjector):
    """Runs a :class:`~millwheel.SparkSource` as a streaming query; see the module docstring."""

    def __init__(self, rt: DriverContext, spec: InjectorSpec) -> None:
        self.source: SparkSource = spec.source  # type: ignore[assignment]
        super().__init__(rt, spec)
        self.newest: int | None = None
        self._keyer: tuple[str | None, list[str]] = (None, [])
        #: with ``RuntimeSettings.drain``: since when the query has had nothing to read
        self._idle_since: float | None = None
        #: what the executors get: the declaration without the stream function, data sources and rows
        self._shipped = copy.copy(self.source)
        self._shipped.stream, self._shipped.data_sources, self._shipped._rows = None, (), None

    @property
    def finished(self) -> bool:
        return self.low_watermark >= MAX_TIMESTAMP

    # ---- the watermark, from the offset log -------------------------------------------------
    def _source_watermark(self, n: int) -> int | None:
        """The source's own low watermark after batch ``n`` (``offset_watermark``)."""
        entry = _offset_lines(self.checkpoint.child("offsets", str(n)))
        if entry is None:
            return None
        offsets = [x for x in entry[1] if x is not None]
        field = self.source.offset_watermark
        values = [o.get(field) for o in offsets if isinstance(o, dict)]
        if not values or any(v is None for v in values):
            msg = f"injector {self.name!r}: offset_watermark={field!r}, but the offsets of batch {n} have no such field: {entry[1]}"
            raise MillwheelError(msg)
        return min(int(v) for v in values if v is not None)

    def _spark_watermark(self, n: int) -> int | None:
        """Spark's event-time watermark in force for batch ``n`` (``None``: not planned)."""
        entry = _offset_lines(self.checkpoint.child("offsets", str(n)))
        if entry is None:
            return None
        wm = int(entry[0].get("batchWatermarkMs", 0))
        return wm if wm > 0 else MIN_TIMESTAMP

    def sender_watermark(self, n: int) -> int:
        """The injector low watermark that batch ``n``'s records are sent under."""
        if self.source.offset_watermark is not None:
            before = self._source_watermark(n - 1) if n > 0 else None
            return MIN_TIMESTAMP if before is None else before
        wm = self._spark_watermark(n)
        return MIN_TIMESTAMP if wm is None else wm

    def _published(self, n: int) -> None:
        if self.source.offset_watermark is not None:
            lw = self._source_watermark(n)
        else:
            lw = max(
                w
                for w in (self._spark_watermark(n), self._spark_watermark(n + 1), MIN_TIMESTAMP)
                if w is not None
            )
        if lw is None:
            return
        end = self.source.end_ms
        if end is not None and lw >= end:
            lw = MAX_TIMESTAMP
        self.low_watermark = max(self.low_watermark, lw)

    def _summary(self, _n: int, summaries: list[IntervalSummary]) -> None:
        heads = [s.low_watermark for s in summaries if s.low_watermark > MIN_TIMESTAMP]
        if heads:
            self.newest = max([*heads, *([self.newest] if self.newest is not None else [])])

    # ---- the query ------------------------------------------------------------------------
    def start(self) -> None:
        from millwheel.runtime._logfiles import keyer_options

        self._recover()
        self.rt.watermarks.expect_injector_processes(self.name, ["spark"])
        self.rt.watermarks.report_injector(self.name, "spark", self.low_watermark)
        if self.finished:
            return  # finished before this start: nothing to read
        opts = keyer_options(self.rt.keyer, self.stream)
        self._keyer = (opts.get("keyer"), json.loads(opts.get("keyed_for", "[]")))
        spark = self.rt.spark
        where = f"injector {self.name!r}"
        try:
            for ds in self.source.data_sources:
                spark.dataSource.register(ds)
            df = self.source.stream(spark)  # type: ignore[misc]
        except Exception as exc:
            err = missing_connector(exc, spark.version, where)
            if err is not None:
                raise err from None
            msg = f"{where}: its stream function failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:500]}"
            raise MillwheelError(msg) from exc
        df = self._checked(df)
        writer = (
            df.writeStream.queryName(f"millwheel.injector.{self.name}")
            .foreachBatch(self._batch)
            .option("checkpointLocation", self.checkpoint.uri)
        )
        if self.rt.settings.trigger_ms > 0:
            writer = writer.trigger(processingTime=f"{self.rt.settings.trigger_ms} milliseconds")
        try:
            self.query = start_query(
                writer, spark, {}
            )  # not while a computation's start has the session's settings changed
        except Exception as exc:
            err = missing_connector(exc, spark.version, where)
            if err is not None:
                raise err from None
            raise

    def _checked(self, df: Any) -> Any:
        """The user's DataFrame checked against the declaration, with the watermark column."""
        from pyspark.sql import functions as F  # noqa: N812
        from pyspark.sql import types as T  # noqa: N812

        where = f"injector {self.name!r}"
        if not getattr(df, "isStreaming", False):
            msg = f"{where}: its stream function must return a streaming DataFrame (spark.readStream...load()), got {type(df).__name__}"
            raise MillwheelError(msg)
        fields = {f.name: f.dataType for f in df.schema.fields}
        wanted = [self.source.timestamp, *(self.source.id_columns or ())]
        if isinstance(self.source.value, str):
            wanted.append(self.source.value)
        elif isinstance(self.source.value, tuple):
            wanted += list(self.source.value)
        missing = [c for c in wanted if c not in fields]
        if missing:
            msg = f"{where}: the stream has no column {', '.join(map(repr, missing))}; its columns: {', '.join(fields)}"
            raise MillwheelError(msg)
        ts_type = fields[self.source.timestamp]
        if isinstance(ts_type, (T.TimestampType, T.TimestampNTZType)):
            ts = F.col(self.source.timestamp)
        elif isinstance(ts_type, (T.LongType, T.IntegerType, T.ShortType)):
            ts = F.timestamp_millis(F.col(self.source.timestamp))
        else:
            msg = f"{where}: timestamp column {self.source.timestamp!r} is {ts_type.simpleString()}; it must be a timestamp or integer ms (convert it in the stream function)"
            raise MillwheelError(msg)
        if self.source.offset_watermark is not None:
            return df
        return df.withColumn(TS_COLUMN, ts).withWatermark(
            TS_COLUMN, f"{self.source.watermark_delay_ms} milliseconds"
        )

    def _batch(self, df: Any, batch_id: int) -> None:
        """``foreachBatch``: convert on the executors, stage through the outbox."""
        blob, consumers = self._keyer
        # the key columns as the driver's keyer names them (a rescaled consumer's ``interval:C@N``)
        schema = log_schema(OUT_SCHEMA, self.rt.keyer, consumers, self.stream)
        if TS_COLUMN in df.columns:
            df = df.drop(TS_COLUMN)
        fn = convert_batch(
            self._shipped,
            self.name,
            self.stream,
            batch_id,
            self.sender_watermark(batch_id),
            blob,
            consumers,
        )
        self.outbox.sink(df.mapInArrow(fn, schema), batch_id)

    # ---- the driver loop ----------------------------------------------------------------------
    def poll(self) -> None:
        self.outbox.publish_committed()
        if (
            self.source.offset_watermark is None
            and self.outbox.published >= 0
            and not self.finished
        ):
            # Spark plans the next batch (and writes its watermark) after the last one was
            # published: take it as soon as it is there, not at the next publication
            self._published(self.outbox.published)
        if self.rt.settings.drain and not self.finished:
            self._drain()
        self.rt.watermarks.report_injector(self.name, "spark", self.low_watermark)
        if self.finished and self.query is not None:
            self.stop()

    def _drain(self) -> None:
        """``--until-drained``: the input is complete once the query has had nothing to read
        for a second with every batch it planned committed and published — a table read to
        its end, a Kafka topic to its latest offsets. The injector is then finished."""
        q = self.query
        planned = planned_batches(self.checkpoint)
        idle = (
            q is not None
            and q.lastProgress is not None
            and not q.status.get("isDataAvailable", True)
            and not q.status.get("isTriggerActive", True)
            and bool(planned)
            and planned[-1] in self.outbox.committed()
            and planned[-1] <= self.outbox.published
        )
        if not idle:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.monotonic()
        elif time.monotonic() - self._idle_since >= 1.0:
            self.low_watermark = MAX_TIMESTAMP

    def drained(self) -> bool:
        """Finished and every committed batch published."""
        if not self.finished:
            return False
        committed = self.outbox.committed()
        return not any(
            n in committed and n > self.outbox.published for n in _numbers(self.outbox.loc)
        )

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "records_out": self.records_out,
            "dead_letters": self.dead_letters,
            "low_watermark": self.low_watermark,
            "newest_event_ms": self.newest,
        }
        beyond = self.outbox.metrics.get("beyond_end", 0)
        if beyond:
            out["beyond_end"] = beyond
        return out
