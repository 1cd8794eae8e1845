"""``SparkSource``: any streaming DataFrame as an injector (issue 25).

Spark's built-in ``rate`` source and the shipped Python Data Source
(``examples/sequence_source.py``, real offsets with the source's own low watermark) feed a
per-key count per second; each output equals the plain batch answer computed from the
data itself. The same declaration on the harness reads ``rows=``. A ``kafka`` source
without Spark's connector fails with the message naming the package.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from examples.sequence_source import FORMAT, SequenceDataSource, events
from millwheel import MAX_TIMESTAMP, MillwheelError, SparkSource, Topology
from millwheel.testing import Harness

T0 = 1_700_000_000_000
SEQ = {
    "count": 3000,
    "rows_per_batch": 600,
    "partitions": 2,
    "disorder_ms": 40,
    "keys": 7,
    "bad_every": 500,
    "step_ms": 7,
}


def _answer(rows):
    """The plain batch answer: distinct events per (key, second)."""
    return Counter((r["key"], r["ts"] // 1000 * 1000) for r in rows if r["ts"] is not None)


def _rate_stream(spark):
    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 500)
        .option("numPartitions", 2)
        .load()
        .selectExpr(
            "value",
            f"timestamp_millis({T0} + value * 10) AS ts",
            "concat('k', CAST(value % 7 AS STRING)) AS key",
        )
    )


def _sequence_stream(spark):
    reader = spark.readStream.format(FORMAT)
    for k, v in SEQ.items():
        reader = reader.option(k, str(v))
    return reader.load()


def sequence_source(**extra):
    return SparkSource(
        _sequence_stream,
        data_sources=[SequenceDataSource],
        id="seq",
        timestamp="ts",
        offset_watermark="lw",
        **extra,
    )


def test_harness_reads_the_rows_of_the_same_declaration(second_counts):
    rows = events(**SEQ)
    h = Harness(second_counts(sequence_source(rows=rows)))
    h.run_sources()
    assert second_counts.answer(h.output("counts")) == _answer(rows)
    dead = h.dead_letters()
    assert len(dead) == 6
    assert {d.value.reason for d in dead} == {"row has no timestamp (column ts is null)"}


def test_harness_rows_as_a_table_and_bad_ids():
    import pyarrow as pa

    table = pa.Table.from_pylist([{"k": "a", "ts": 5, "n": 1}, {"k": None, "ts": 6, "n": 2}])
    src = SparkSource(rows=table, id="k", timestamp="ts", value="n")
    (batch,) = list(src.batches("t", "t"))
    assert [(r.id, r.value) for r in batch.records] == [("a", 1)]
    assert batch.dead_letters[0].value.reason == "row has no id (column k is null or missing)"


def test_value_function_failure_is_a_dead_letter():
    src = SparkSource(
        rows=[{"line": "{}", "ts": 1}, {"line": "oops", "ts": 2}],
        timestamp="ts",
        value=lambda r: __import__("json").loads(r["line"]),
    )
    (batch,) = list(src.batches("j", "j"))
    assert [r.value for r in batch.records] == [{}]
    assert "JSONDecodeError" in batch.dead_letters[0].value.reason


@pytest.mark.spark
def test_rate_source_equals_the_batch_answer(spark, run_dir, second_counts):
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    n = 1000
    src = SparkSource(_rate_stream, id="value", timestamp="ts", end_ms=T0 + n * 10)
    rt = SparkRuntime(second_counts(src), run_dir, RuntimeSettings(intervals=4), spark=spark)
    rt.run(timeout_s=400)
    expected = Counter((f"k{v % 7}", (T0 + v * 10) // 1000 * 1000) for v in range(n))
    assert second_counts.answer(rt.output("counts")) == expected
    injected = rt.output("events")
    assert sorted(int(r.id) for r in injected) == list(
        range(n)
    )  # each value once, none past the end
    st = rt.status()["logs"]
    assert st["low_watermark"] == MAX_TIMESTAMP and st["records_out"] == n
    assert st["beyond_end"] >= 0


@pytest.mark.spark
def test_python_data_source_equals_the_batch_answer(spark, run_dir, second_counts):
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    rt = SparkRuntime(
        second_counts(sequence_source()), run_dir, RuntimeSettings(intervals=4), spark=spark
    )
    rt.run(timeout_s=400)
    rows = events(**SEQ)
    assert second_counts.answer(rt.output("counts")) == _answer(rows)
    dead = rt.dead_letters()
    assert len(dead) == 6 and {d.value.reason for d in dead} == {
        "row has no timestamp (column ts is null)"
    }
    status = rt.status()["logs"]
    assert status["records_out"] == len(rows) - 6 and status["dead_letters"] == 6
    assert status["low_watermark"] == MAX_TIMESTAMP


@pytest.mark.spark
def test_kafka_without_its_connector_names_the_package(spark, run_dir):
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    src = SparkSource(
        lambda s: (
            s.readStream.format("kafka")
            .option("kafka.bootstrap.servers", "127.0.0.1:9")
            .option("subscribe", "clicks")
            .load()
        ),
        id=("topic", "partition", "offset"),
        timestamp="timestamp",
        value="value",
    )
    t = Topology("kafka-in")
    t.injector("clicks", src)
    rt = SparkRuntime(t, run_dir, RuntimeSettings(intervals=2), spark=spark)
    with pytest.raises(MillwheelError) as err:
        try:
            rt.start()
        finally:
            rt.stop()
    text = str(err.value)
    assert "injector 'clicks': Spark has no 'kafka' data source" in text
    assert f"--packages org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version}" in text


@pytest.mark.spark
@pytest.mark.parametrize("declared", [False, True])
def test_a_parquet_table_is_read_to_its_end_with_drain(spark, tmp_path, second_counts, declared):
    """A table (a directory of Parquet files) as a stream, read file by file; ``drain``
    finishes the injector once the query has nothing left to read. With the stream's
    fields declared, the injector writes its values as columns (``millwheel/_fields.py``)
    and everything reads the same."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    from millwheel.runtime import RuntimeSettings, SparkRuntime

    table_dir = tmp_path / "events"
    table_dir.mkdir()
    rows = []
    for f in range(4):
        part = [
            {
                "event_id": f"e{f}-{i}",
                "at": dt.datetime.fromtimestamp((T0 + f * 1000 + i * 4) / 1000, dt.timezone.utc),
                "key": f"k{i % 5}",
            }
            for i in range(250)
        ]
        pq.write_table(
            pa.Table.from_pylist(
                part,
                schema=pa.schema(
                    [
                        ("event_id", pa.string()),
                        ("at", pa.timestamp("ms", tz="UTC")),
                        ("key", pa.string()),
                    ]
                ),
            ),
            table_dir / f"part-{f}.parquet",
        )
        # a table written file by file, a second apart: Spark's file source takes files in
        # modification-time order, and files written in the same millisecond come in listing
        # order (once part-2 before part-1: its whole second was late and dropped, rightly)
        os.utime(table_dir / f"part-{f}.parquet", (1_700_000_000 + f, 1_700_000_000 + f))
        rows += part
    src = SparkSource(
        lambda s: (
            s.readStream.schema("event_id string, at timestamp, key string")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(table_dir))
        ),
        id="event_id",
        timestamp="at",
        value=["key"],
    )
    topology = second_counts(src)
    if declared:
        topology.stream("events", fields={"key": str})
    rt = SparkRuntime(
        topology, str(tmp_path / "run"), RuntimeSettings(intervals=4, drain=True), spark=spark
    )
    rt.run(timeout_s=400)
    expected = Counter((r["key"], int(r["at"].timestamp() * 1000) // 1000 * 1000) for r in rows)
    assert second_counts.answer(rt.output("counts")) == expected
    assert sorted((r.id, r.value["key"]) for r in rt.output("events")) == sorted(
        (r["event_id"], r["key"]) for r in rows
    )
    if declared:
        from millwheel.runtime.rundir import FileStreamLog

        log = FileStreamLog.at(str(tmp_path / "run"))
        ((producer, name), *_) = [
            (p, n) for p in log.producers("events") for n in log.files("events", p)
        ]
        t = pq.read_table(
            log.location("events", producer).child(name).path, columns=["value", "fields"]
        )
        assert t.column("value").null_count == t.num_rows and t.column("fields").null_count == 0


@pytest.mark.spark
def test_a_source_without_ids_gets_them_from_the_rows_place(spark, run_dir, second_counts):
    """No id column: each record's id comes from its place in Spark's micro-batch (batch id,
    partition, content, occurrence) — distinct for every row, equal rows included."""
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    def stream(spark):  # every event twice: equal rows in one batch are two records
        return _sequence_stream(spark).drop("seq").unionByName(_sequence_stream(spark).drop("seq"))

    src = SparkSource(
        stream, data_sources=[SequenceDataSource], timestamp="ts", offset_watermark="lw"
    )
    rt = SparkRuntime(second_counts(src), run_dir, RuntimeSettings(intervals=4), spark=spark)
    rt.run(timeout_s=400)
    rows = events(**SEQ)
    expected = Counter({k: 2 * n for k, n in _answer(rows).items()})
    assert second_counts.answer(rt.output("counts")) == expected
    injected = rt.output("events")
    assert len({r.id for r in injected}) == len(injected) == 2 * (len(rows) - 6)


@pytest.mark.spark
def test_the_harness_reads_a_static_spark_dataframe(spark, second_counts):
    rows = events(**SEQ)
    static = spark.createDataFrame(rows, "seq long, ts long, key string, partition int")
    h = Harness(
        second_counts(SparkSource(rows=static, id="seq", timestamp="ts", offset_watermark="lw"))
    )
    h.run_sources()
    assert second_counts.answer(h.output("counts")) == _answer(rows)
    assert len(h.dead_letters()) == 6
