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
import random
import time
from typing import Any

import pyarrow as pa

from millwheel._errors import MillwheelError
from millwheel._sparkio import SparkSink
from millwheel._topology import SinkSpec
from millwheel._waits import WAITS, WaitBoard
from millwheel.runtime._fs import Location
from millwheel.runtime._sinks import ROW_SCHEMA, _flat, row_of
from millwheel.runtime._streams import FileStreamLog, read_log, table_records
from servicekit.client import backoff_delay

#: the first wait after a writer failed, and the longest (seconds): doubling, jittered, in between
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
#: a writer still failing says so in the log at most this often (seconds)
LOG_EVERY_S = 30.0


def _base(name: str) -> str:
    """A stream-log file's name whether it is live or pruned (``_done/<name>``)."""
    return name.rsplit("/", 1)[-1]


class SparkSinkWriter:
    """Writes one sink's committed stream-log files through Spark, batch by batch."""

    def __init__(
        self,
        spec: SinkSpec,
        streams: FileStreamLog,
        run_dir: Location,
        spark: Any,
        log: Any = print,
        *,
        clock: Any = time.monotonic,
    ) -> None:
        self.spec = spec
        self.sink: SparkSink = spec.spark
        self.streams = streams
        self.state = run_dir.child("sinks", spec.name)
        self._spark = (
            spark  # a zero-argument function: the runtime's session, made when first needed
        )
        self._log = log
        self.written = 0
        self.batches = 0
        #: stream-log files (producer, name) planned in some batch
        self.planned: set[tuple[str, str]] = set()
        self.pending: list[int] = []
        self.next_batch = 0
        #: failed attempts since the writer last succeeded, when the first was, when to try next
        self.failures = 0
        self._failing_since: float | None = None
        self._failing_since_ms = 0
        self._next_try = 0.0
        self._logged = 0.0
        self._clock = clock
        self._random = random.Random()
        self.where = f"sink {spec.name!r} of stream {spec.stream!r}"
        #: the run's wait board (``millwheel/_waits.py``): the live status shows a failing writer
        self.board = WaitBoard(run_dir.child(WAITS).path) if run_dir.local else None

    def start(self) -> None:
        self.state.mkdirs()
        names = self.state.list()
        plans = sorted(
            int(n[: -len(".plan")])
            for n in names
            if n.endswith(".plan") and n[: -len(".plan")].isdigit()
        )
        done = {
            int(n[: -len(".done")])
            for n in names
            if n.endswith(".done") and n[: -len(".done")].isdigit()
        }
        for k in plans:
            for producer, name in self._plan(k):
                self.planned.add((producer, name))
        self.pending = [k for k in plans if k not in done]
        self.next_batch = (max(plans) + 1) if plans else 0
        self.batches = len(done)

    def caught_up(self) -> bool:
        """Every committed stream-log file of the sink is written (a run is not drained before: a
        writer waiting out its target's outage holds the run open, it does not let it end)."""
        if self.pending:
            return False
        return all(
            (producer, _base(name)) in self.planned
            for producer in self.streams.producers(self.spec.stream)
            for name in self.streams.files(self.spec.stream, producer)
        )

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
        """Write batch ``k``; ``False`` if the writer failed or waits before trying again (a later poll does)."""
        if self._failing_since is not None and self._clock() < self._next_try:
            return False  # backing off: the driver's other work goes on meanwhile
        table = self._table(self._plan(k))
        try:
            spark = self._spark()
            df = (
                spark.createDataFrame(table)
                if table.num_rows
                else spark.createDataFrame([], "id string, ts long, key string, value string")
            )
            if self.sink.foreach_batch is not None:
                self.sink.foreach_batch(df, k)
            else:
                if self.sink.format == "kafka":
                    df = df.selectExpr(
                        "key",
                        "value",
                        "array(named_struct('key', 'millwheel-id', 'value', CAST(id AS BINARY))) AS headers",
                    )
                df.write.format(self.sink.format).options(**dict(self.sink.options)).mode(
                    self.sink.mode
                ).save()
        except Exception as exc:
            from millwheel.runtime._sparksource import missing_connector

            where = self.where
            err = missing_connector(exc, self._spark().version, where)
            if err is not None:
                raise err from None
            self._failed(k, exc)
            return False
        self.state.child(f"{k}.done").write_text("")
        if self._failing_since is not None:
            self._log(
                f"{self.where}: its writer writes again after {self._clock() - self._failing_since:.0f}s ({self.failures} failed attempts)"
            )
            if self.board is not None:
                self.board.done(self.where)
        self.failures, self._failing_since = 0, None
        self.written += table.num_rows
        self.batches += 1
        return True

    def _failed(self, k: int, exc: BaseException) -> None:
        """A failed attempt: wait (capped exponential backoff, jittered) and try again, for the sink's
        ``patience_s`` from the first failure; then stop the run naming the sink (the batch stays
        planned: a resume writes it)."""
        now = self._clock()
        self.failures += 1
        if self._failing_since is None:
            self._failing_since, self._failing_since_ms = now, int(time.time() * 1000)
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        last = f"{type(exc).__name__}: {first}"
        waited = now - self._failing_since
        if waited >= self.sink.patience_s:
            since = time.strftime("%H:%M:%S UTC", time.gmtime(self._failing_since_ms / 1000))
            msg = (
                f"{self.where}: its writer failed for {self.sink.patience_s:g}s ({self.failures} attempts since {since}) on batch {k} "
                f"({last}); the batch stays planned and a resume writes it again. Bring the sink's target back "
                "(or give SparkSink(patience_s=...) more time) and run again with the same run directory"
            )
            if self.board is not None:
                self.board.done(self.where)
            raise MillwheelError(msg) from exc
        delay = backoff_delay(FIRST_BACKOFF_S, self.failures - 1, MAX_BACKOFF_S, self._random)
        self._next_try = now + delay
        if self.board is not None:
            self.board.waiting(
                self.where, since_ms=self._failing_since_ms, attempts=self.failures, last_error=last
            )
        if self.failures == 1 or now - self._logged >= LOG_EVERY_S:
            self._logged = now
            self._log(
                f"{self.where}: its writer failed on batch {k} ({last}); trying again in {delay:.1f}s (for up to {self.sink.patience_s:g}s)"
            )


def spark_sink_writers(
    topology: Any, streams: FileStreamLog, run_dir: Location, spark: Any, log: Any
) -> list[SparkSinkWriter]:
    return [
        SparkSinkWriter(s, streams, run_dir, spark, log)
        for s in topology.sinks.values()
        if s.spark is not None
    ]
