"""``SparkSink``: a stream out through Spark, from committed output, in batches a writer can make idempotent (issue 25).

* the writer's batches: numbered, planned before they are written, written again with the
  same number and rows after a crash (a fake session: no Spark);
* a format (Parquet) and a ``foreach_batch`` function on local Spark, each equal to the
  batch answer;
* PostgreSQL through ``foreach_batch`` with an upsert on the production id: the driver is
  killed with SIGKILL inside the writer (the database has batch 1, the sink has not marked
  it done), then mid-run from outside, and resumed; the table holds every count exactly
  once (0 lost, 0 duplicated against the batch answer) and batch 1 was delivered twice.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from examples.sequence_source import events
from millwheel import Record, SparkSink, Topology, TopologyError
from millwheel.runtime._fs import Location
from millwheel.runtime._sparksink import SparkSinkWriter
from millwheel.runtime._streams import FileStreamLog

from ._procs import kill_group
from .pg import postgres, postgres_server, table  # noqa: F401 - the fixtures
from .spark_io_driver import SEQ


def _answer(rows):
    return Counter((r["key"], r["ts"] // 1000 * 1000) for r in rows if r["ts"] is not None)


def test_a_sink_is_a_format_or_a_function():
    with pytest.raises(TopologyError, match="either format="):
        SparkSink()
    with pytest.raises(TopologyError, match="either format="):
        SparkSink(format="parquet", foreach_batch=lambda df, n: None)
    t = Topology("x")
    t.injector("a")
    with pytest.raises(TopologyError, match="spark_sink must be a millwheel.SparkSink"):
        t.sink("a", spark_sink="kafka")
    with pytest.raises(TopologyError, match="not both"):
        t.sink("a", "out/a.jsonl", spark_sink=SparkSink(format="parquet"))
    assert (
        t.sink("a", spark_sink=SparkSink(format="parquet", options={"path": "/tmp/x"})).spark.format
        == "parquet"
    )


class _Frames:
    """A stand-in session: ``createDataFrame`` returns the Arrow table it is given."""

    version = "4.3.0"

    def createDataFrame(self, data, schema=None):  # noqa: N802 - Spark's name
        return data


def test_batches_are_planned_then_written_and_rewritten_the_same_after_a_crash(tmp_path):
    root = Location.of(str(tmp_path / "run"))
    streams = FileStreamLog(root)
    streams.ensure("out", "C")
    streams.append("out", "C", "b0", [Record("k", {"n": i}, 1_000 + i, f"id{i}") for i in range(3)])
    seen = []

    def crash_on_first(df, batch_id):
        seen.append((batch_id, df.column("id").to_pylist(), df.column("value").to_pylist()))
        if len(seen) == 1:
            raise KeyboardInterrupt  # the driver dies inside the writer: no done marker

    t = Topology("t")
    t.injector("C", stream="out")
    spec = t.sink("out", spark_sink=SparkSink(foreach_batch=crash_on_first))
    w = SparkSinkWriter(spec, streams, root, _Frames, log=lambda m: None)
    w.start()
    with pytest.raises(KeyboardInterrupt):
        w.poll()
    streams.append("out", "C", "b1", [Record("k", {"n": 9}, 2_000, "id9")])
    again = SparkSinkWriter(spec, streams, root, _Frames, log=lambda m: None)
    again.start()
    assert again.poll() == 1  # the planned batch 0, again; then batch 1
    assert seen[0] == seen[1] and seen[1][0] == 0
    assert seen[1][1] == ["id0", "id1", "id2"] and json.loads(seen[1][2][0]) == {"n": 0}
    assert [(b, ids) for b, ids, _ in seen[2:]] == [(1, ["id9"])]
    assert again.poll() == 0


class _Clock:
    """A monotonic clock the test moves (the writer's backoff waits on it)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _one_file(tmp_path):
    root = Location.of(str(tmp_path / "run"))
    streams = FileStreamLog(root)
    streams.ensure("out", "C")
    streams.append("out", "C", "b0", [Record("k", 1, 1_000, "a")])
    t = Topology("t")
    t.injector("C", stream="out")
    return root, streams, t


def test_a_writer_whose_database_restarts_waits_with_backoff_and_loses_nothing(tmp_path):
    # before: five failures in a row, one per driver round with no backoff (a database down for
    # ~2 s), and the run stopped
    from millwheel.waits import read_waits

    root, streams, t = _one_file(tmp_path)
    down = {"attempts": 0, "until": 1_030.0}
    written = []
    clock = _Clock()

    def database(df, batch_id):
        if clock.now < down["until"]:
            down["attempts"] += 1
            msg = "connection refused: the database is restarting"
            raise ConnectionError(msg)
        written.append((batch_id, df.column("id").to_pylist()))

    spec = t.sink("out", spark_sink=SparkSink(foreach_batch=database))
    logged = []
    w = SparkSinkWriter(spec, streams, root, _Frames, log=logged.append, clock=clock)
    w.start()
    assert not w.caught_up()  # a committed file not written yet: the run is not drained
    polls = 0
    while not written:
        if polls:
            assert not w.caught_up()  # waiting out the outage holds the run open
        assert w.poll() in (0, 1)
        polls += 1
        if down["attempts"] and not written:
            waits = read_waits(root.child("waits").path)
            assert (
                len(waits) == 1
                and "waiting on sink 'sink.out' of stream 'out'" in waits[0].text()
                and "restarting" in waits[0].text()
            )
        clock.now += 0.5
    assert (
        written == [(0, ["a"])] and 3 <= down["attempts"] < 20 < polls
    )  # backoff: far fewer attempts than driver rounds
    assert w.caught_up()
    assert read_waits(root.child("waits").path) == []
    assert any("writes again after" in m for m in logged)


def test_a_writer_failing_beyond_its_patience_stops_the_run_naming_the_sink(tmp_path):
    from millwheel import MillwheelError

    root, streams, t = _one_file(tmp_path)

    def broken(df, batch_id):
        msg = "database is down"
        raise ConnectionError(msg)

    spec = t.sink("out", spark_sink=SparkSink(foreach_batch=broken, patience_s=20))
    clock = _Clock()
    w = SparkSinkWriter(spec, streams, root, _Frames, log=lambda m: None, clock=clock)
    w.start()
    with pytest.raises(
        MillwheelError,
        match=r"sink 'sink.out' of stream 'out': its writer failed for 20s \(\d+ attempts since .*\) on batch 0 \(ConnectionError: database is down\)",
    ):
        for _ in range(1_000):
            w.poll()
            clock.now += 0.5
    with pytest.raises(TopologyError, match="patience_s"):
        SparkSink(foreach_batch=broken, patience_s=-1)


@pytest.mark.spark
def test_format_and_foreach_batch_sinks_equal_the_batch_answer(spark, tmp_path, second_counts):
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    from .test_spark_source import SEQ as SMALL
    from .test_spark_source import sequence_source

    got: dict[int, list] = {}
    t = second_counts(sequence_source())
    t.sink(
        "counts",
        spark_sink=SparkSink(
            foreach_batch=lambda df, n: got.setdefault(n, df.toArrow().to_pylist())
        ),
    )
    t.sink(
        "counts",
        name="counts.parquet",
        spark_sink=SparkSink(format="parquet", options={"path": str(tmp_path / "counts.parquet")}),
    )
    rt = SparkRuntime(t, str(tmp_path / "run"), RuntimeSettings(intervals=4), spark=spark)
    rt.run(timeout_s=400)
    expected = _answer(events(**SMALL))
    assert sorted(got) == list(range(len(got)))
    rows = [r for n in sorted(got) for r in got[n]]
    assert len({r["id"] for r in rows}) == len(rows)
    assert (
        Counter(
            {(v["key"], v["second"]): v["count"] for v in (json.loads(r["value"]) for r in rows)}
        )
        == expected
    )
    parquet = spark.read.parquet(str(tmp_path / "counts.parquet")).toArrow().to_pylist()
    assert sorted(r["id"] for r in parquet) == sorted(r["id"] for r in rows)


@pytest.mark.spark
def test_postgres_sink_is_exact_after_kill_9(tmp_path, postgres):  # noqa: F811 - the fixture
    import subprocess
    import sys
    from pathlib import Path

    driver = str(Path(__file__).with_name("spark_io_driver.py"))
    root, log = tmp_path / "run", tmp_path / "driver.log"

    def start(*extra):
        out = open(log, "ab")  # noqa: SIM115
        return subprocess.Popen(
            [sys.executable, driver, str(root), "sequence", "--dsn", postgres, *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    # first: killed inside the sink, after the database committed batch 1 and before the
    # sink marked it done — the resume writes batch 1 again, which the upsert absorbs
    proc = start("--kill-in-sink", "1")
    try:
        died = proc.wait(timeout=600)
    finally:
        kill_group(proc)
    assert died == -9, log.read_text()[-3000:]
    rows_after_sink_kill = table(postgres, "SELECT count(*) FROM counts")[0][0]
    # then: killed from outside, mid-run — while the sink holds batch 2 unwritten (the resume
    # wrote batch 1 again first), so the kill lands before the run can end
    proc = start("--hold-sink-at", "2")
    held = root / "sink-held"
    killed = False
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and not held.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is None and held.exists():
            kill_group(proc)
            killed = True
    finally:
        kill_group(proc)
    rows_at_kill = table(postgres, "SELECT count(*) FROM counts")[0][0]
    final = start()
    try:
        rc = final.wait(timeout=900)
    finally:
        kill_group(final)
    assert rc == 0, log.read_text()[-4000:]
    rows = table(postgres, "SELECT id, key, second, count FROM counts")
    expected = _answer(events(**SEQ))
    got = Counter({(k, s): c for _, k, s, c in rows})
    per_window = Counter((k, s) for _, k, s, _ in rows)
    duplicated = sum(n - 1 for n in per_window.values())
    lost = sum((expected - got).values()) + len(set(expected) - set(got))
    deliveries = table(
        postgres, "SELECT id, count(*), count(DISTINCT value) FROM deliveries GROUP BY id"
    )
    redelivered = sum(n - 1 for _, n, _ in deliveries)
    print(
        f"killed in the sink with {rows_after_sink_kill} rows written; killed: {killed}, rows at the kill: {rows_at_kill}; rows {len(rows)}, expected {len(expected)}; lost {lost}, duplicated {duplicated}; re-deliveries absorbed by the upsert: {redelivered}"
    )
    assert killed and 0 < rows_after_sink_kill <= rows_at_kill < len(expected)
    assert redelivered >= 1  # batch 1 was written twice
    assert duplicated == 0 and lost == 0
    assert got == expected
    assert all(
        values == 1 for _, _, values in deliveries
    )  # a re-delivered id always carried the same value


@pytest.mark.spark
def test_postgres_restarted_in_the_middle_of_a_run_loses_nothing_and_stops_nothing(
    tmp_path,
    postgres_server,  # noqa: F811 - the fixture
):
    """PostgreSQL stopped (a fast shutdown: connections cut) once the table has rows, and started again
    on its data 20 s later, while the driver runs: the sink's writer waits with backoff, the run goes
    on and ends on its own, and the table holds every count exactly once. Before: five failures in
    a row, one per driver round (~2 s), stopped the run."""
    import subprocess
    import sys
    from pathlib import Path

    dsn = postgres_server.dsn
    driver = str(Path(__file__).with_name("spark_io_driver.py"))
    root, log = tmp_path / "run", tmp_path / "driver.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, driver, str(root), "sequence", "--dsn", dsn],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    restarted = False
    try:
        deadline = time.monotonic() + 600
        while (
            proc.poll() is None
            and time.monotonic() < deadline
            and not table(dsn, "SELECT count(*) FROM counts")[0][0]
        ):
            time.sleep(0.2)
        if proc.poll() is None:
            rows_before = table(dsn, "SELECT count(*) FROM counts")[0][0]
            postgres_server.restart(down_s=20.0)
            restarted = True
        rc = proc.wait(timeout=900)
    finally:
        kill_group(proc)
    text = log.read_text()
    assert restarted and rc == 0, text[-4000:]
    rows = table(dsn, "SELECT id, key, second, count FROM counts")
    expected = _answer(events(**SEQ))
    assert Counter({(k, sec): c for _, k, sec, c in rows}) == expected
    assert len({(k, sec) for _, k, sec, _ in rows}) == len(rows)  # no window twice
    assert rows_before < len(expected)  # the restart was in the middle of the run
    assert (
        "its writer failed on batch" in text and "writes again after" in text
    )  # it did wait, and it came back


@pytest.mark.spark
def test_kafka_sink_without_its_connector_names_the_package(spark, tmp_path):
    from millwheel import MillwheelError

    root = Location.of(str(tmp_path / "run"))
    streams = FileStreamLog(root)
    streams.ensure("out", "C")
    streams.append("out", "C", "b0", [Record("k", {"n": 1}, 1_000, "a")])
    t = Topology("t")
    t.injector("C", stream="out")
    sink = SparkSink(
        format="kafka", options={"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "counts"}
    )
    w = SparkSinkWriter(
        t.sink("out", spark_sink=sink), streams, root, lambda: spark, log=lambda m: None
    )
    w.start()
    with pytest.raises(MillwheelError) as err:
        w.poll()
    assert "sink 'sink.out' of stream 'out': Spark has no 'kafka' data source" in str(err.value)
    assert f"--packages org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version}" in str(
        err.value
    )
