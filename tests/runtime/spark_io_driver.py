"""A driver process for the kill -9 tests of ``SparkSource`` and ``SparkSink`` (issue 25).

    python tests/runtime/spark_io_driver.py ROOT {rate|sequence} [--dsn DSN [--kill-in-sink N | --hold-sink-at N]]

``rate``: Spark's ``rate`` source (event time from the value, ``end_ms`` after 3000
values); ``sequence``: the shipped Python Data Source (``examples/sequence_source.py``,
its own low watermark in its offsets). Either feeds ``SecondCounts`` (per key and
second); with ``--dsn`` its counts also go to PostgreSQL through a ``SparkSink``
(``foreach_batch``: an idempotent upsert on the production id, ``tests/runtime/pg.py``);
``--kill-in-sink N`` kills this process with SIGKILL right after the writer committed sink
batch ``N`` to the database and before the sink marked it done (once: a marker file in ROOT);
``--hold-sink-at N`` stops the sink before it writes batch ``N`` (once) and writes the marker
``sink-held`` in ROOT, so a test kills the process from outside at a point it chose rather than
racing the run's end.
Paced (small batches, a trigger) so a kill lands mid-run; runs until drained.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.sequence_source import FORMAT, SequenceDataSource  # noqa: E402
from millwheel import Computation, ComputationOptions, LatePolicy, SparkSink, SparkSource, Topology  # noqa: E402
from millwheel.runtime import RuntimeSettings, SparkRuntime  # noqa: E402

T0 = 1_700_000_000_000
RATE_N = 3000
SEQ = {
    "count": 6000,
    "rows_per_batch": 400,
    "partitions": 2,
    "disorder_ms": 30,
    "keys": 9,
    "bad_every": 1000,
    "step_ms": 5,
}


class SecondCounts(Computation):
    options = ComputationOptions(late=LatePolicy.drop())

    def process_record(self, record):
        second = record.timestamp // 1_000 * 1_000
        counts = self.state.get({})
        counts[second] = counts.get(second, 0) + 1
        self.state.set(counts)
        self.set_timer(str(second), second + 999)

    def process_timer(self, timer):
        counts = self.state.get({})
        second = timer.timestamp - 999
        self.produce("counts", {"key": self.key, "second": second, "count": counts.pop(second)})
        self.state.set(counts or None)


def rate_stream(spark):
    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 400)
        .option("numPartitions", 2)
        .load()
        .selectExpr(
            "value",
            f"timestamp_millis({T0} + value * 10) AS ts",
            "concat('k', CAST(value % 9 AS STRING)) AS key",
        )
    )


def sequence_stream(spark):
    reader = spark.readStream.format(FORMAT)
    for k, v in SEQ.items():
        reader = reader.option(k, str(v))
    return reader.load()


def killing_after(write, batch: int, marker: str):
    """``write``, then SIGKILL of this process after sink batch ``batch`` (the first time only)."""

    def write_then_die(df, batch_id):
        write(df, batch_id)
        if batch_id == batch and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    return write_then_die


def holding_at(write, batch: int, marker: str):
    """``write``, except that sink batch ``batch`` (the first time only) waits, unwritten, for
    an outside kill; ``marker`` says it is waiting."""

    def hold_then_write(df, batch_id):
        if batch_id == batch and not os.path.exists(marker):
            open(marker, "w").close()
            while True:
                time.sleep(1)
        write(df, batch_id)

    return hold_then_write


def build(
    kind: str,
    dsn: str | None,
    kill_in_sink: int | None = None,
    root: str = ".",
    hold_sink_at: int | None = None,
) -> Topology:
    if kind == "rate":
        src = SparkSource(rate_stream, id="value", timestamp="ts", end_ms=T0 + RATE_N * 10)
    else:
        src = SparkSource(
            sequence_stream,
            data_sources=[SequenceDataSource],
            id="seq",
            timestamp="ts",
            offset_watermark="lw",
        )
    t = Topology(f"io-{kind}")
    t.injector("logs", src, stream="events")
    t.computation(SecondCounts, inputs={"events": lambda r: r.value["key"]}, outputs=["counts"])
    if dsn is not None:
        from tests.runtime.pg import upsert_counts

        write = upsert_counts(dsn)
        if kill_in_sink is not None:
            write = killing_after(write, kill_in_sink, os.path.join(root, "killed-in-sink"))
        if hold_sink_at is not None:
            write = holding_at(write, hold_sink_at, os.path.join(root, "sink-held"))
        t.sink("counts", spark_sink=SparkSink(foreach_batch=write))
    return t


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("kind", choices=["rate", "sequence"])
    p.add_argument("--dsn", default=None)
    p.add_argument("--kill-in-sink", type=int, default=None)
    p.add_argument("--hold-sink-at", type=int, default=None)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    settings = RuntimeSettings(intervals=4, master="local[2]", trigger_ms=500)
    os.makedirs(args.root, exist_ok=True)
    rt = SparkRuntime(
        build(args.kind, args.dsn, args.kill_in_sink, args.root, args.hold_sink_at),
        args.root,
        settings,
        log=lambda m: print(m, flush=True),
    )
    rt.run(timeout_s=args.timeout)
    print("DRAINED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
