"""Any Spark streaming source in, any Spark sink out: the declarations (no pyspark here).

:class:`SparkSource` is an injector (MillWheel §5.2) whose records come from a streaming
DataFrame the user builds — Kafka, a Delta or Parquet table, a socket, the ``rate``
source, a Python Data Source of their own — with the columns that make a record:

* ``id`` — the record id exactly-once deduplicates on (§6.1.1): a column, or several
  (Kafka's ``("topic", "partition", "offset")``: the record's position in its source),
  joined with ``/``. Without one, the id is derived from the record's position in Spark's
  micro-batch — ``(batch id, partition, content, occurrence)`` — which Spark's offset log
  makes the same when a batch is replayed after a crash.
* ``timestamp`` — its event time: a timestamp column or integer milliseconds.
* ``value`` — one column, a list of columns (a dict of them), ``None`` (a dict of every
  column) or a function of the row's dict (a parser: what it raises makes a dead letter).

A row without a usable id or timestamp, or whose ``value`` function raises, becomes a dead
letter with the reason (``invalid_record``), never a silent drop.

The injector low watermark (§4.5) is, by default, Spark's event-time watermark
(``withWatermark(timestamp, watermark_delay_ms)``: the newest event time read minus the
declared delay), read from the query's offset log; with ``offset_watermark="lw"`` it is
the low watermark the source itself keeps in its offsets (a source that knows its
progress, like the shipped ``examples/sequence_source.py``), ``MAX_TIMESTAMP`` meaning the
source is finished. ``end_ms`` bounds a replay of an endless stream: once the watermark
reaches it the injector is finished, and records at or after it are not part of the input.
With ``RuntimeSettings(drain=True)`` (``millwheel run --until-drained``) a source is
finished once its query has nothing left to read (a table read to its end).

On the harness the same declaration reads ``rows`` (a list of dicts, a pyarrow Table, a
pandas or a Spark DataFrame): no Spark needed for a list.

:class:`SparkSink` sends a stream to anything Spark writes — a format with options
(``"kafka"``, ``"parquet"``, ``"delta"``, ``"jdbc"``) or a ``foreach_batch(df, batch_id)``
function — from committed output only, in numbered batches whose ids and rows are the same
when a batch is written again after a crash, so an idempotent writer (an upsert on the
production id) makes the target exact.

>>> src = SparkSource(rows=[{"n": 2, "ts": 1_000}, {"n": 3, "ts": None}], id="n", timestamp="ts")
>>> [(len(b.records), len(b.dead_letters), b.low_watermark) for b in src.batches("nums", "nums")]
[(1, 1, 9223372036854775807)]
>>> src.records()[0].id, src.records()[0].value
('2', {'n': 2, 'ts': 1000})
>>> list(src.batches("nums", "nums"))[0].dead_letters[0].value.reason
'row has no timestamp (column ts is null)'
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from millwheel._deadletter import reason_of
from millwheel._delivery import invalid_record, record_problem
from millwheel._errors import TopologyError
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, Record
from millwheel._sources import Source, SourceBatch

__all__ = ["KAFKA_PACKAGE", "SparkSink", "SparkSource", "kafka_package"]

#: Spark's Kafka connector (Scala 2.13 builds, as pip's pyspark 4 is); ``%s`` is Spark's version
KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:%s"


def kafka_package(spark_version: str) -> str:
    """The ``--packages`` coordinate of Spark's Kafka connector for ``spark_version``.

    >>> kafka_package("4.3.0")
    'org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0'
    """
    return KAFKA_PACKAGE % spark_version


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _epoch_ms(v: Any) -> int | None:
    """A timestamp column's value as integer ms since the epoch (``None`` if it has none)."""
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.timezone.utc)
        return (v - _EPOCH) // dt.timedelta(milliseconds=1)
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    item = getattr(v, "item", None)  # numpy / pandas scalars
    if callable(item):
        return _epoch_ms(item())
    return None


def _id_text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


class SparkSource(Source):
    """An injector reading a streaming DataFrame; see the module docstring.

    ``stream`` — ``lambda spark: spark.readStream.format(...)...load()`` (called by the
    Spark runtime with its session). ``data_sources`` — Python Data Source classes to
    register with the session before ``stream`` is called. ``rows`` — what the harness
    reads instead (a list of dicts, or a table with ``to_pylist``/``toArrow``/``to_dict``).
    """

    def __init__(
        self,
        stream: Callable[[Any], Any] | None = None,
        *,
        id: str | Sequence[str] | None = None,  # noqa: A002 - the column that holds the record id
        timestamp: str = "timestamp",
        value: str | Sequence[str] | Callable[[dict[str, Any]], Any] | None = None,
        watermark_delay_ms: int = 0,
        offset_watermark: str | None = None,
        end_ms: int | None = None,
        data_sources: Sequence[type] = (),
        rows: Any = None,
        batch_size: int = 1_000,
    ) -> None:
        if stream is None and rows is None:
            msg = "SparkSource needs stream=lambda spark: spark.readStream...load() (Spark) or rows=[...] (the harness)"
            raise TopologyError(msg)
        if stream is not None and not callable(stream):
            msg = f"SparkSource: stream must be a function of the Spark session returning a streaming DataFrame, got {stream!r}"
            raise TopologyError(msg)
        if not isinstance(timestamp, str) or not timestamp:
            msg = f"SparkSource: timestamp must name a column (a timestamp or integer ms), got {timestamp!r}"
            raise TopologyError(msg)
        ids = None if id is None else ((id,) if isinstance(id, str) else tuple(id))
        if ids is not None and (not ids or not all(isinstance(c, str) and c for c in ids)):
            msg = f"SparkSource: id must name a column or a list of columns (e.g. ('topic', 'partition', 'offset')), got {id!r}"
            raise TopologyError(msg)
        if value is not None and not (
            isinstance(value, str)
            or callable(value)
            or (isinstance(value, Sequence) and all(isinstance(c, str) for c in value))
        ):
            msg = f"SparkSource: value must be a column, a list of columns, a function of the row or None, got {value!r}"
            raise TopologyError(msg)
        if watermark_delay_ms < 0 or batch_size < 1:
            msg = f"SparkSource: watermark_delay_ms must be >= 0 and batch_size >= 1, got {watermark_delay_ms}, {batch_size}"
            raise TopologyError(msg)
        self.stream = stream
        self.id_columns = ids
        self.timestamp = timestamp
        self.value = (
            value if isinstance(value, str) or callable(value) or value is None else tuple(value)
        )
        self.watermark_delay_ms = int(watermark_delay_ms)
        self.offset_watermark = offset_watermark
        self.end_ms = end_ms
        self.data_sources = tuple(data_sources)
        self._rows = rows
        self._batch_size = batch_size
        #: what the latest :meth:`batches` read: ``beyond_end``, the rows at or after ``end_ms`` left out
        self.counts: dict[str, int] = {}

    # ---- one row -> a record, the same on both backends ------------------------------------
    def record_of(
        self, row: Mapping[str, Any], position: Sequence[Any]
    ) -> tuple[Record, str | None]:
        """The record of one row and ``None``, or what could be made of it and why it is no record.

        ``position`` identifies the row where it has no id column (Spark: batch id,
        partition, content and occurrence; the harness: its index).
        """
        ts = _epoch_ms(row.get(self.timestamp))
        value: Any = None
        problem: str | None = None
        if self.timestamp not in row:
            problem = f"row has no column {self.timestamp!r} for the timestamp (columns: {', '.join(row)})"
        elif ts is None:
            raw = row.get(self.timestamp)
            problem = (
                f"row has no timestamp (column {self.timestamp} is null)"
                if raw is None
                else f"timestamp column {self.timestamp} holds {type(raw).__name__} {raw!r}, not a timestamp or integer ms"
            )
        if self.id_columns is None:
            rid: str | None = xxhash.xxh3_128_hexdigest("\x00".join(map(repr, position)).encode())
        else:
            missing = [c for c in self.id_columns if row.get(c) is None]
            if missing:
                rid = None
                problem = (
                    problem or f"row has no id (column {', '.join(missing)} is null or missing)"
                )
            else:
                rid = "/".join(_id_text(row[c]) for c in self.id_columns)
        try:
            if self.value is None:
                value = dict(row)
            elif isinstance(self.value, str):
                value = row.get(self.value)
            elif callable(self.value):
                value = self.value(dict(row))
            else:
                value = {c: row.get(c) for c in self.value}
        except Exception as exc:  # noqa: BLE001 - the user's parser: its failure is the row's dead letter
            problem = (
                problem
                or f"value function {getattr(self.value, '__name__', 'value')} raised {reason_of(exc)}"
            )
            value = dict(row)
        rec = Record(None, value, ts if ts is not None else MIN_TIMESTAMP, rid or "")  # type: ignore[arg-type]
        if problem is None:
            problem = record_problem(rec)
        return rec, problem

    # ---- the harness ------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """The rows the harness reads (``rows=``, as a list of dicts)."""
        rows = self._rows
        if rows is None:
            msg = "SparkSource: this source reads a Spark stream; give it rows=[...] to run it on the harness"
            raise TopologyError(msg)
        if hasattr(rows, "toArrow"):  # a Spark DataFrame (static)
            rows = rows.toArrow()
        if hasattr(rows, "to_pylist"):  # a pyarrow Table
            return list(rows.to_pylist())
        if hasattr(rows, "to_dict"):  # pandas
            return list(rows.to_dict("records"))
        return [dict(r) for r in rows]

    def records(self) -> list[Record]:
        """The records of :meth:`rows` (dead letters left out)."""
        out: list[Record] = []
        for i, row in enumerate(self.rows()):
            rec, problem = self.record_of(row, ("row", i))
            if problem is None and (self.end_ms is None or rec.timestamp < self.end_ms):
                out.append(rec)
        return out

    def batches(self, injector: str = "injector", stream: str = "records") -> Iterator[SourceBatch]:
        """``rows`` in batches of ``batch_size``. Each batch ends under the event-time
        watermark the rows so far set (newest timestamp minus ``watermark_delay_ms``), as on
        Spark; a source that keeps its own (``offset_watermark``) knows what is still to
        come: the oldest timestamp of the rows after the batch."""
        rows = self.rows()
        made = [self.record_of(row, ("row", i)) for i, row in enumerate(rows)]
        keep = [p is None and (self.end_ms is None or r.timestamp < self.end_ms) for r, p in made]
        self.counts = {
            "beyond_end": sum(p is None and not k for (_, p), k in zip(made, keep, strict=True))
        }
        suffix = [MAX_TIMESTAMP] * (len(made) + 1)
        for i in range(len(made) - 1, -1, -1):
            suffix[i] = min(made[i][0].timestamp, suffix[i + 1]) if keep[i] else suffix[i + 1]
        newest = MIN_TIMESTAMP
        for start in range(0, max(len(rows), 1), self._batch_size):
            end = min(len(rows), start + self._batch_size)
            good: list[Record] = []
            dead: list[Record] = []
            for i in range(start, end):
                rec, problem = made[i]
                if problem is not None:
                    dead.append(invalid_record(injector, stream, rec, problem, i))
                elif keep[i]:
                    good.append(rec)
                    newest = max(newest, rec.timestamp)
            if end >= len(rows):
                wm = MAX_TIMESTAMP
            elif self.offset_watermark is not None:
                wm = suffix[end]
            else:
                wm = newest - self.watermark_delay_ms if newest > MIN_TIMESTAMP else MIN_TIMESTAMP
            yield SourceBatch(good, wm, dead)


@dataclass(frozen=True)
class SparkSink:
    """Where a :meth:`~millwheel.Topology.sink` sends its stream through Spark.

    Either ``format`` (``"kafka"``, ``"parquet"``, ``"delta"``, ``"jdbc"``, ...) with
    ``options`` and ``mode``, written with ``df.write.format(format).options(**options)
    .mode(mode).save()``, or ``foreach_batch(df, batch_id)``, a function of the batch's
    DataFrame (``id string, ts long, key string, value string``: the production id, its
    timestamp, key and value as JSON text) and its batch number. A batch is the committed
    stream-log files the sink had not written yet; it is planned (its files and number
    recorded) before it is written and marked done after, so a batch written again after a
    crash has the same number and the same rows. Use the production id (or the batch
    number) to make the writer idempotent.

    A writer that fails (its database restarting, a broker failing over) is tried again
    with capped exponential backoff and jitter for ``patience_s`` seconds from its first
    failure, the batch still planned, before the run stops naming the sink.
    """

    format: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    mode: str = "append"
    foreach_batch: Callable[[Any, int], None] | None = None
    #: how long a failing writer is tried again before the run stops (seconds)
    patience_s: float = 600.0

    def __post_init__(self) -> None:
        if (self.format is None) == (self.foreach_batch is None):
            msg = "SparkSink: give either format='kafka'|'parquet'|... (with options=...) or foreach_batch=function(df, batch_id)"
            raise TopologyError(msg)
        if self.foreach_batch is not None and not callable(self.foreach_batch):
            msg = f"SparkSink: foreach_batch must be a function (df, batch_id), got {self.foreach_batch!r}"
            raise TopologyError(msg)
        if self.format is not None and (not isinstance(self.format, str) or not self.format):
            msg = f"SparkSink: format must name a Spark data source, got {self.format!r}"
            raise TopologyError(msg)
        if not isinstance(self.patience_s, (int, float)) or not self.patience_s >= 0:
            msg = f"SparkSink: patience_s is how long a failing writer is tried again, in seconds (>= 0), got {self.patience_s!r}"
            raise TopologyError(msg)
