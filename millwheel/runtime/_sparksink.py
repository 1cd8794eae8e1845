"""Sinks through Spark (``Topology.sink(stream, spark_sink=SparkSink(...))``): Kafka, tables, ``foreachBatch`` writers.

The writer follows the sink's stream log, where a file appears only once the batch that
made it has committed (the outbox, ``_outbox.py``): what it sends out is committed output
only. It sends it in numbered batches, each planned before it is written and marked done
after, in ``RUN/sinks/<sink>/``:

* ``<k>.plan`` — batch ``k``'s stream-log files, written (atomically) before the writer runs;
* ``<k>.done`` — written once the writer returned.

A driver killed while batch ``k`` is being written leaves a plan without ``done``; the next
start writes batch ``k`` again, with the same number and the same rows (the same files,
whose production ids are fixed by the committed per-key sequence, §6.1.2). The target
sees every batch at least once and never a different version of it: a writer that upserts
on the production id (or skips batch numbers it has) makes it exactly once — the
PostgreSQL test does (``tests/runtime/test_spark_sink.py``).

Rows: ``id string, ts long, key string, value string`` (a ``str`` key as is, other keys
and every value as JSON text: ``_sinks.row_of``). ``format="kafka"`` gets Kafka's columns:
``key`` and ``value`` as the text above, the production id in the ``millwheel-id`` header.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from millwheel._errors import MillwheelError
from millwheel._sparkio import SparkSink
from millwheel._topology import SinkSpec
from millwheel.runtime._fs import Location
from millwheel.runtime._sinks import ROW_SCHEMA, _flat, row_of
from millwheel.runtime._streams import FileStreamLog, read_log, table_records

#: consecutive failures of a sink's writer before the run stops (the batch stays planned: a resume writes it)
MAX_FAILURES = 5


def _base(name: str) -> str:
    """A stream-log file's name whether it is live or pruned (``_done/<name>``)."""
    return name.rsplit("/", 1)[-1]


class SparkSinkWriter:
    """Writes one sink's committed stream-log files through Spark, batch by batch."""

    def __init__(self, spec: SinkSpec, streams: FileStreamLog, run_dir: Location, spark: Any, log: Any = print) -> None:
        self.spec = spec
        self.sink: SparkSink = spec.spark
        self.streams = streams
        self.state = run_dir.child("sinks", spec.name)
        self._spark = spark  # a zero-argument function: the runtime's session, made when first needed
        self._log = log
        self.written = 0
        self.batches = 0
        #: stream-log files (producer, name) planned in some batch
        self.planned: set[tuple[str, str]] = set()
        self.pending: list[int] = []
        self.next_batch = 0
        self.failures = 0

    def start(self) -> None:
        self.state.mkdirs()
        names = self.state.list()
        plans = sorted(int(n[: -len(".plan")]) for n in names if n.endswith(".plan") and n[: -len(".plan")].isdigit())
        done = {int(n[: -len(".done")]) for n in names if n.endswith(".done") and n[: -len(".done")].isdigit()}
        for k in plans:
            for producer, name in self._plan(k):
                self.planned.add((producer, name))
        self.pending = [k for k in plans if k not in done]
        self.next_batch = (max(plans) + 1) if plans else 0
        self.batches = len(done)

    def _plan(self, k: int) -> list[tuple[str, str]]:
        return [tuple(x) for x in json.loads(self.state.child(f"{k}.plan").read_text() or "[]")]  # type: ignore[misc]

    def poll(self) -> int:
        """Write the pending batch (after a crash), then the files not planned yet as the next batch."""
        while self.pending:
            if not self._write(self.pending[0]):
                return 0
            self.pending.pop(0)
        new: list[tuple[str, str]] = []
        for producer in self.streams.producers(self.spec.stream):
            for name in sorted(self.streams.files(self.spec.stream, producer)):
                if (producer, _base(name)) not in self.planned:
                    new.append((producer, _base(name)))
        if not new:
            return 0
        k = self.next_batch
        self.state.child(f"{k}.plan").write_text(json.dumps(new))
        self.planned.update(new)
        self.next_batch = k + 1
        self.pending.append(k)
        if self._write(k):
            self.pending.pop(0)
            return 1
        return 0

    def _table(self, files: list[tuple[str, str]]) -> pa.Table:
        rows: list[dict[str, Any]] = []
        for producer, name in files:
            loc = self.streams.location(self.spec.stream, producer)
            path = loc.child(name) if loc.child(name).exists() else loc.child("_done", name)
            rows += [_flat(row_of(r)) for r in table_records(read_log(path))]
        return pa.Table.from_pylist(rows, schema=ROW_SCHEMA)

    def _write(self, k: int) -> bool:
        """Write batch ``k``; ``False`` if the writer failed (it is tried again at the next poll)."""
        table = self._table(self._plan(k))
        try:
            spark = self._spark()
            df = spark.createDataFrame(table) if table.num_rows else spark.createDataFrame([], "id string, ts long, key string, value string")
            if self.sink.foreach_batch is not None:
                self.sink.foreach_batch(df, k)
            else:
                if self.sink.format == "kafka":
                    df = df.selectExpr("key", "value", "array(named_struct('key', 'millwheel-id', 'value', CAST(id AS BINARY))) AS headers")
                df.write.format(self.sink.format).options(**dict(self.sink.options)).mode(self.sink.mode).save()
        except Exception as exc:
            from millwheel.runtime._sparksource import missing_connector

            where = f"sink {self.spec.name!r} of stream {self.spec.stream!r}"
            err = missing_connector(exc, self._spark().version, where)
            if err is not None:
                raise err from None
            self.failures += 1
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            if self.failures >= MAX_FAILURES:
                msg = f"{where}: its writer failed {self.failures} times in a row on batch {k} ({type(exc).__name__}: {first}); the batch stays planned and a resume writes it again"
                raise MillwheelError(msg) from exc
            self._log(f"{where}: its writer failed on batch {k} ({type(exc).__name__}: {first}); trying again")
            return False
        self.state.child(f"{k}.done").write_text("")
        self.failures = 0
        self.written += table.num_rows
        self.batches += 1
        return True


def spark_sink_writers(topology: Any, streams: FileStreamLog, run_dir: Location, spark: Any, log: Any) -> list[SparkSinkWriter]:
    return [SparkSinkWriter(s, streams, run_dir, spark, log) for s in topology.sinks.values() if s.spark is not None]
