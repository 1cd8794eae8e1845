"""The Spark reader of :class:`~millwheel.LogFileSource`: a Python streaming data source.

It plans and parses with the same code as the in-memory source (``millwheel/_logfile.py``:
``plan_offset``, ``plan_ranges``, ``read_range``), so both backends cut the input into the
same batches, send each record under the same watermark and make the same dead letters.

Offsets are ``{"files": {name: FileProgress as a dict}, "lw": injector low watermark}``
(each file's named read state, :class:`~millwheel._logfile.FileProgress`): Spark keeps them in the query's offset log, so the byte offset reached in
each file is in the checkpoint and a replayed batch reads exactly the same bytes
(deterministic output, safe to republish). The driver reads ``lw`` from the committed
offsets to publish the injector low watermark (MillWheel §5.2, Fig. 10).

**Partitions.** A batch's byte ranges are dealt into at most ``partitions`` Spark
partitions (the option; the injector passes the session's default parallelism), each a
run of consecutive ranges in send order with about the same number of bytes: every
partition costs a task and a Python worker's round trip, so a drained sample read in one
batch of 241 files took 241 tasks and 22 s on ``local[2]`` where two partitions take
a few seconds (docs/performance.md, "The main job"). Each row keeps its own range's
sender watermark, so how ranges are grouped never changes what is late.

Rows are stream-log rows plus ``stream``: records go to the injector's stream, malformed
lines to ``dead_letters`` with reason, file and byte offset; each row is keyed for the
consumers of its stream (``_keying.py``: the ``keyer`` option, a pickled
:class:`~millwheel.runtime._keying.Keyer`, names them).
"""

from __future__ import annotations

import base64
import gc
import json
import pickle
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle  # the one ``ship_user_code`` registers by-value modules with
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from millwheel._codec import encode_value
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._fields import FIELDS_COLUMN, StreamFields
from millwheel._logfile import (
    ByteRange,
    LogFileSource,
    initial_offset,
    plan_offset,
    plan_ranges,
    read_range,
)
from millwheel._record import Record, encode_key
from millwheel.runtime._keying import Keyer
from millwheel.runtime._wire import OUT_SCHEMA, SUMMARY_STREAM, IntervalSummary

FORMAT = "millwheel_logfiles"
_TAIL = 1 << 16


class _Ranges(InputPartition):
    """Consecutive byte ranges of one batch, read by one task in order."""

    def __init__(self, ranges: list[ByteRange]) -> None:
        super().__init__(
            tuple(
                (r.name, r.begin, r.end, r.sender_watermark, r.file_time, r.lo, r.hi)
                for r in ranges
            )
        )


def deal_ranges(ranges: list[ByteRange], partitions: int) -> list[list[ByteRange]]:
    """Cut ``ranges`` (in send order) into at most ``partitions`` runs of consecutive ranges
    with about the same number of bytes each; ``partitions < 1``: one range per run.

    >>> rs = [ByteRange(f"f{i}", 0, n, 0, 0) for i, n in enumerate([10, 10, 10, 70])]
    >>> [[r.name for r in run] for run in deal_ranges(rs, 2)]
    [['f0', 'f1', 'f2'], ['f3']]
    >>> [len(run) for run in deal_ranges(rs, 0)], deal_ranges([], 2)
    ([1, 1, 1, 1], [])
    """
    if partitions < 1 or len(ranges) <= partitions:
        return [[r] for r in ranges]
    total = max(1, sum(r.end - r.begin for r in ranges))
    runs: list[list[ByteRange]] = [[] for _ in range(partitions)]
    done = 0
    for r in ranges:  # each range goes to the run its middle byte falls in
        size = r.end - r.begin
        runs[min(partitions - 1, int(partitions * (done + size / 2) / total))].append(r)
        done += size
    return [run for run in runs if run]


class LogFileStreamReader(DataSourceStreamReader):
    """Plans batches with :func:`~millwheel._logfile.plan_offset` / ``plan_ranges`` and reads
    them with ``read_range``: the code the in-memory source runs."""

    def __init__(self, options: dict[str, str]) -> None:
        self.opts = LogFileSource.read_options_from(options)
        self.injector = options.get("injector", "injector")
        self.stream = options.get("stream", "records")
        self.keyer, self.consumers = keyer_of(options)
        self.max_partitions = int(options.get("partitions", "0"))

    def initialOffset(self) -> dict[str, Any]:
        return initial_offset()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:  # noqa: ARG002
        return plan_offset(start or initial_offset(), self.opts, int(time.time() * 1000))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return [
            _Ranges(run)
            for run in deal_ranges(
                plan_ranges(start, end, self.opts.lateness_ms), self.max_partitions
            )
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from self.read_ranges(
            ByteRange(*fields)
            for fields in partition.value  # type: ignore[attr-defined]
        )

    def read_ranges(self, ranges: Iterable[ByteRange]) -> Iterator[pa.RecordBatch]:
        """The rows of ``ranges``, in order: a Spark task's partition, or a part of a batch
        the driver's reader stages itself (``_logreader.py``)."""
        for byte_range in ranges:
            yield from self._read_range(byte_range)

    def _read_range(self, byte_range: ByteRange) -> Iterator[pa.RecordBatch]:
        """The range's records, then its dead letters: one Arrow batch each (either may be absent).

        Built column by column with the garbage collector paused (the rows are acyclic;
        its collections would only re-walk the batch's new objects): the range's records
        all carry its sender watermark and no key (``parse_chunk`` makes them so)."""
        chunk = read_range(self.opts, byte_range, self.injector, self.stream)
        batches: list[pa.RecordBatch] = []
        paused = gc.isenabled()
        gc.disable()
        try:
            if chunk.records:
                batches.append(self._batch(self.stream, chunk.records, byte_range.sender_watermark))
            if chunk.dead_letters:
                batches.append(self._batch(DEAD_LETTER_STREAM, chunk.dead_letters, None))
            if (
                chunk.positional
            ):  # counted by the outbox once the batch is published (the run's summary)
                batches.append(self._counts(byte_range, {"positional_ids": chunk.positional}))
        finally:
            if paused:
                gc.enable()
        yield from batches  # the collector runs again while Spark takes them

    def _counts(self, byte_range: ByteRange, counts: dict[str, int]) -> pa.RecordBatch:
        """A summary row (``SUMMARY_STREAM``, never published) carrying what the range counted."""
        summary = IntervalSummary(
            interval=-1,
            hold=None,
            next_low_watermark_timer=None,
            next_wall_timer=None,
            keys=0,
            metrics=counts,
        )
        arrays = [
            pa.array([SUMMARY_STREAM]),
            pa.array([f"{byte_range.name}@{byte_range.begin}"]),
            pa.array([0], pa.int64()),
            pa.nulls(1, pa.binary()),
            pa.array([summary.encode()], pa.binary()),
            pa.nulls(1, pa.int64()),
        ]
        names = ["stream", "id", "ts", "key", "value", "wm"]
        if self.keyer is not None:
            arrays += [pa.nulls(1, f.type) for f in self.keyer.arrow_fields(self.consumers)]
            names += [f.name for f in self.keyer.arrow_fields(self.consumers)]
            declared = self.keyer.fields.get(self.stream)
            if declared is not None:
                arrays.append(pa.nulls(1, declared.arrow_type()))
                names.append(FIELDS_COLUMN)
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def _batch(self, stream: str, records: list[Record], wm: int | None) -> pa.RecordBatch:
        """Stream-log rows of ``records`` of ``stream`` (the injector's, or dead letters)."""
        n = len(records)
        values = [r.value for r in records]
        if stream == self.stream and self.keyer is not None and stream in self.keyer.fields:
            value, declared = declared_columns(self.keyer.fields[stream], values)
        else:
            value, declared = value_columns(self.keyer, self.stream, stream, values)
        keys = (
            [None if r.key is None else encode_key(r.key) for r in records]
            if stream != self.stream
            else None
        )
        arrays = [
            pa.repeat(pa.scalar(stream, pa.string()), n),
            pa.array([r.id for r in records], pa.string()),
            pa.array([r.timestamp for r in records], pa.int64()),
            pa.nulls(n, pa.binary()) if keys is None else pa.array(keys, pa.binary()),
            value,
            pa.nulls(n, pa.int64()) if wm is None else pa.repeat(pa.scalar(wm, pa.int64()), n),
        ]
        names = ["stream", "id", "ts", "key", "value", "wm"]
        if self.keyer is not None:
            arrays += self.keyer.arrays([(stream, r) for r in records], self.consumers)
            names += [f.name for f in self.keyer.arrow_fields(self.consumers)]
        if declared is not None:
            arrays.append(declared)
            names.append(FIELDS_COLUMN)
        return pa.RecordBatch.from_arrays(arrays, names=names)


class LogFileDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        keyer, consumers = keyer_of(dict(self.options))
        return log_schema(OUT_SCHEMA, keyer, consumers, self.options.get("stream", "records"))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: ARG002
        return LogFileStreamReader(dict(self.options))


def keyer_options(keyer: Keyer, stream: str) -> dict[str, str]:
    """The reader options that make it key its rows for the consumers of ``stream`` and of dead letters."""
    streams = [stream, DEAD_LETTER_STREAM]
    consumers = keyer.consumers_of(streams)
    if not consumers and stream not in keyer.fields:
        return {}
    # only the extractors of what the reader writes; they may be lambdas or live in a
    # topology file (``_usercode.py``)
    mine = keyer.restricted(streams)
    blob = cloudpickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL)
    return {"keyer": base64.b64encode(blob).decode(), "keyed_for": json.dumps(consumers)}


def keyer_of(options: dict[str, str]) -> tuple[Keyer | None, list[str]]:
    """The keyer and consumers :func:`keyer_options` put in the options (``(None, [])``: none)."""
    if "keyer" not in options:
        return None, []
    keyer: Keyer = pickle.loads(base64.b64decode(options["keyer"]))
    return keyer, list(json.loads(options["keyed_for"]))


def value_columns(
    keyer: Keyer | None, stream: str, streams: list[str] | str, values: list[Any]
) -> tuple[pa.Array, pa.Array | None]:
    """The ``value`` column of an injector's rows (its stream's records and dead letters),
    and the ``fields`` column when its stream declares fields (``Keyer.value_columns``)."""
    if keyer is None:
        return pa.array([encode_value(v) for v in values], pa.binary()), None
    return keyer.value_columns(stream, streams, values)


def declared_columns(fields: StreamFields, values: list[Any]) -> tuple[pa.Array, pa.StructArray]:
    """``value`` and ``fields`` columns of values of a stream that declares ``fields``: what
    :meth:`StreamFields.split <millwheel._fields.StreamFields.split>` gives, built by columns
    when every value conforms (a log's lines mostly do), else by ``split`` itself.

    All conform when each is a ``dict`` with exactly the declared keys in order and each
    column holds only ``None`` and the declared type (an ``int`` column: within int64,
    which Arrow's conversion checks).

    >>> from millwheel._fields import StreamFields, rebuild_values
    >>> f = StreamFields.of({"q": str, "n": int})
    >>> [rebuild_values(v.to_pylist(), a) for v, a in (declared_columns(f, [{"q": "a", "n": 1}]), declared_columns(f, [{"q": "a", "n": True}]))]
    [[{'q': 'a', 'n': 1}], [{'q': 'a', 'n': True}]]
    """
    names, n = fields.names, len(values)
    if n and all(type(v) is dict and tuple(v) == names for v in values):
        struct = fields.arrow_type()
        columns = list(zip(*[v.values() for v in values], strict=True))
        arrays = []
        for column, typ, field in zip(columns, fields.types, struct, strict=True):
            kinds = set(map(type, column))
            kinds.discard(type(None))
            if kinds - {typ}:
                break
            try:
                arrays.append(pa.array(column, field.type))
            except (
                OverflowError,
                UnicodeEncodeError,
                pa.ArrowException,
            ):  # an int beyond int64, a str with a lone surrogate: that value does not conform
                break
        else:
            return pa.nulls(n, pa.binary()), pa.StructArray.from_arrays(arrays, fields=list(struct))
    fields_column, encoded = fields.split(values)
    return pa.array(encoded, pa.binary()), fields_column


def log_schema(base: str, keyer: Keyer | None, consumers: list[str], stream: str) -> str:
    """An injector query's output schema: ``base``, the consumers' key columns and the
    ``fields`` column of a stream that declares its fields."""
    parts = [base]
    if keyer is not None and consumers:
        parts.append(keyer.ddl(consumers))
    declared = None if keyer is None else keyer.fields.get(stream)
    if declared is not None:
        parts.append(f"{FIELDS_COLUMN} {declared.spark_ddl()}")
    return ", ".join(parts)
