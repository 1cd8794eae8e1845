"""Contract tests: one per Spark internal millwheel depends on (``millwheel/runtime/_spark_internals.py``).

Each test runs the real thing on local Spark and checks what millwheel assumes of it, so a
PySpark upgrade that changes one fails here, in the test named after it, rather than
somewhere in a run.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from millwheel import (
    MAX_TIMESTAMP,
    ComputationOptions,
    DedupOptions,
    MillwheelError,
    Record,
    SampleSource,
    Topology,
)
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._fs import Location
from millwheel.runtime._spark_internals import (
    SUPPORTED_PYSPARK,
    check_pyspark_version,
    committed_batches,
    compact_interruption,
    error_mentions,
    file_source_offsets,
    has_started,
    interval_state_timeouts,
    is_transient,
    offset_log_entries,
    offset_log_metadata,
    planned_batches,
    polling_delay_conf,
    python_error,
    read_envelopes,
    root_log_level,
    silence_loggers,
    source_log_files,
    sources_asked_in_plan_order,
    task_batch_id,
    task_property,
    task_query_id,
)
from millwheel.runtime._state_files import release_state_stores

from ._chain import Double, Sum, by_n
from .stray_snapshot_driver import count

pytestmark = pytest.mark.spark


def test_contract_pyspark_version_is_in_the_supported_range():
    import pyspark

    assert check_pyspark_version() == pyspark.__version__
    with pytest.raises(
        MillwheelError, match=r"PySpark 3\.5\.1 is not supported: .* checked on >=4\.3\.0,<4\.4\.0"
    ):
        check_pyspark_version("3.5.1")
    with pytest.raises(MillwheelError, match=f"PySpark {SUPPORTED_PYSPARK[1]} is not supported"):
        check_pyspark_version(SUPPORTED_PYSPARK[1])


def test_contract_state_server_protocol_and_state_data_sources(spark, tmp_path):
    """``MapStatePipeline`` (the state server's socket protocol, per-key layout) writes and
    reads envelopes; ``read_envelopes`` reads both layouts back through the state data sources."""
    records = [Record(None, {"n": n}, 1_000 + n, f"r{n}") for n in range(30)]
    for layout in ("keys", "intervals"):
        run = tmp_path / layout
        # ``chain``, but Double keeps its ids for ever: it keeps no state, so with the default
        # slack a drained run forgets its keys once the watermark passes their ids
        # (``DedupOptions``); kept here, to read three keys back
        t = Topology(f"contract_{layout}")
        t.injector("in", SampleSource(records, batch_size=10))
        t.computation(
            Double,
            inputs={"in": by_n},
            outputs=["doubled"],
            options=ComputationOptions(dedup=DedupOptions(slack_ms=MAX_TIMESTAMP)),
        )
        t.computation(Sum, inputs={"doubled": lambda r: "all"}, outputs=["sums"])
        rt = SparkRuntime(
            t,
            str(run),
            RuntimeSettings(drain=True, intervals=2, state_layout=layout),
            spark=spark,
        )
        rt.run(timeout_s=300)
        envs = read_envelopes(spark, str(run / "checkpoints" / "Sum"))
        assert len(envs) == 1, layout  # the one key "all", whatever the layout
        assert rt.states("Sum") == {"all": sum(2 * n for n in range(30))}, layout
        per_key = read_envelopes(spark, str(run / "checkpoints" / "Double"))
        assert len(per_key) == 3, layout  # keys 0, 1, 2


def test_contract_checkpoint_file_formats(spark, tmp_path):
    """A file source's query: ``commits/<n>``, ``offsets/<n>`` and ``sources/<i>/<n>`` read as millwheel reads them."""
    data = tmp_path / "in"
    data.mkdir()
    pd.DataFrame({"x": [1, 2]}).to_parquet(data / "a.parquet")
    pd.DataFrame({"x": [3]}).to_parquet(data / "b.parquet")
    checkpoint = tmp_path / "checkpoint"
    out = tmp_path / "out"
    df = spark.readStream.schema("x long").parquet(str(data))
    q = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .option("path", str(out))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    loc = Location.of(str(checkpoint))
    assert has_started(loc)
    assert committed_batches(loc) == [0]
    offsets = (checkpoint / "offsets" / "0").read_text()
    assert len(offset_log_entries(offsets)) == 1
    assert planned_batches(loc) == [0]
    meta = offset_log_metadata(offsets)
    assert meta is not None and "batchWatermarkMs" in meta and "batchTimestampMs" in meta
    assert file_source_offsets(offsets) == {0: 0}
    files = source_log_files((checkpoint / "sources" / "0" / "0").read_text())
    assert files is not None
    assert sorted(path[-1] for path, _ in files) == ["a.parquet", "b.parquet"]
    assert {batch for _, batch in files} == {0}
    assert not has_started(Location.of(str(tmp_path / "nothing")))


def test_contract_task_batch_id(spark, tmp_path):
    """A task of a micro-batch's job knows its batch (``task_batch_id``), in the stateful
    stage of a ``foreachBatch`` sink's job, where the columnar scan plan reads it."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    data = tmp_path / "in"
    data.mkdir()
    pd.DataFrame({"g": [1, 2, 1]}).to_parquet(data / "a.parquet")
    seen: list[int] = []

    def step(key, frames, state):
        for _ in frames:
            pass
        yield pd.DataFrame({"g": [int(key[0])], "batch": [task_batch_id()]})

    df = spark.readStream.schema("g long").parquet(str(data))
    out = df.groupBy("g").applyInPandasWithState(
        step, "g long, batch long", "n long", "append", GroupStateTimeout.NoTimeout
    )
    q = (
        out.writeStream.foreachBatch(lambda b, bid: seen.extend(r.batch - bid for r in b.collect()))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert seen == [0, 0]  # each group's task saw the batch its sink was called for
    assert task_batch_id() is None  # not in a task


@pytest.mark.parametrize("timeout", ["EventTimeTimeout", "NoTimeout"])
def test_contract_interval_state_timeouts(spark, tmp_path, timeout):
    """The interval-row operator's schema file says whether its rows carry Spark's timeout
    column (``interval_state_timeouts``), and Spark refuses the other setting over them,
    which is why a query keeps the one its state was written with (``plans/intervals.py``)."""
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    data = tmp_path / "in"
    data.mkdir()
    pd.DataFrame({"g": [1, 2, 1], "t": [1, 2, 3]}).to_parquet(data / "a.parquet")
    checkpoint = Location.of(str(tmp_path / "cp"))

    def step(key, frames, state):
        n = sum(len(f) for f in frames)
        state.update((n,))
        yield pd.DataFrame({"g": [int(key[0])], "n": [n]})

    def run(conf: str) -> None:
        df = (
            spark.readStream.schema("g long, t long")
            .parquet(str(data))
            .withColumn("ts", F.timestamp_millis("t"))
            .withWatermark("ts", "0 seconds")
        )
        out = df.groupBy("g").applyInPandasWithState(
            step, "g long, n long", "n long", "append", getattr(GroupStateTimeout, conf)
        )
        q = (
            out.writeStream.foreachBatch(lambda b, bid: b.collect())
            .option("checkpointLocation", checkpoint.uri)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        if q.exception() is not None:
            raise q.exception()

    assert interval_state_timeouts(checkpoint) is None
    run(timeout)
    assert interval_state_timeouts(checkpoint) is (timeout == "EventTimeTimeout")
    pd.DataFrame({"g": [3], "t": [4]}).to_parquet(data / "b.parquet")
    other = "NoTimeout" if timeout == "EventTimeTimeout" else "EventTimeTimeout"
    with pytest.raises(StreamingQueryException):
        run(other)


def test_contract_task_query_id(spark, tmp_path):
    """A task of a micro-batch's job knows its query (``task_query_id``): the id Spark keeps
    in the checkpoint, the same after a restart on it and another on a new checkpoint — in
    the stateful stage and in a ``foreachBatch`` function's own job (the Arrow mapping's
    tasks), with the batch numbering going on across the restart (``runtime/_life.py``)."""
    import pyarrow as pa
    from pyspark.sql.streaming.state import GroupStateTimeout

    data = tmp_path / "in"
    data.mkdir()
    seen: list[tuple[str, str, int, int]] = []  # (query id, where, batch, task's batch)

    def step(key, frames, state):
        for _ in frames:
            pass
        yield pd.DataFrame({"q": [task_query_id()], "batch": [task_batch_id()]})

    def own_job(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"q": [task_query_id()], "batch": [task_batch_id()]})

    def sink(b, bid):
        seen.extend((r.q, "stateful", bid, r.batch) for r in b.collect())
        seen.extend(
            (r.q, "foreachBatch", bid, r.batch)
            for r in b.mapInArrow(own_job, "q string, batch long").collect()
        )

    def run(checkpoint, file):
        pd.DataFrame({"g": [1, 2]}).to_parquet(data / file)
        df = spark.readStream.schema("g long").parquet(str(data))
        out = df.groupBy("g").applyInPandasWithState(
            step, "q string, batch long", "n long", "append", GroupStateTimeout.NoTimeout
        )
        q = (
            out.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        return str(q.id)

    first, again, other = run("cp", "a.parquet"), run("cp", "b.parquet"), run("cp2", "c.parquet")
    assert first == again != other
    assert {(q, where, bid) for q, where, bid, _ in seen} == {
        (first, "stateful", 0),
        (first, "foreachBatch", 0),
        (first, "stateful", 1),
        (first, "foreachBatch", 1),
        (other, "stateful", 0),
        (other, "foreachBatch", 0),
    }
    assert all(bid == batch for _, _, bid, batch in seen)
    assert task_query_id() is None  # not in a task


def test_contract_a_property_set_in_foreach_batch_reaches_the_querys_own_tasks(spark, tmp_path):
    """A local property the ``foreachBatch`` function sets (on the stream's thread: PySpark
    pins a Py4J callback to the JVM thread that made it) reaches the tasks of the query's own
    plan, which run in that function's job, as the batch id does (``task_property``): the
    Arrow mapping's tasks read their batch's plan this way (``plans/arrow.py``). Unset after the
    job, a later job on the thread sees none."""
    import pyarrow as pa

    data = tmp_path / "in"
    data.mkdir()
    pd.DataFrame({"g": [1, 2, 3]}).to_parquet(data / "a.parquet")
    seen: list[tuple[int, int, str | None]] = []  # (sink's batch, task's batch, property)

    def task(batches):
        rows = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pydict(
            {"n": [rows], "batch": [task_batch_id()], "p": [task_property("millwheel.test")]}
        )

    def sink(b, bid):
        sc = b.sparkSession.sparkContext
        sc.setLocalProperty("millwheel.test", f"plan-{bid}")
        try:
            seen.extend((bid, r.batch, r.p) for r in b.collect() if r.n)
        finally:
            sc.setLocalProperty("millwheel.test", None)
        seen.extend((bid, r.batch, r.p) for r in b.collect() if r.n)

    def run(file):
        pd.DataFrame({"g": [4, 5]}).to_parquet(data / file)
        df = spark.readStream.schema("g long").parquet(str(data))
        out = df.repartition(2, "g").mapInArrow(task, "n long, batch long, p string")
        q = (
            out.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)

    run("b.parquet")
    run("c.parquet")
    with_plan = {(bid, batch, p) for bid, batch, p in seen if p is not None}
    assert with_plan == {(0, 0, "plan-0"), (1, 1, "plan-1")}
    assert {(bid, batch) for bid, batch, p in seen if p is None} == {(0, 0), (1, 1)}


def test_contract_python_errors_reach_the_driver_as_text(spark):
    """A worker's exception: its traceback and our markers are in the driver's error text."""
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("long")
    def fails(s: pd.Series) -> pd.Series:
        msg = "millwheel-contract-marker on purpose"
        raise ValueError(msg)

    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark's own exception types vary by version: the text is the contract
        spark.range(3).select(fails("id")).collect()
    assert error_mentions(info.value, "millwheel-contract-marker")
    assert python_error(info.value).endswith("ValueError: millwheel-contract-marker on purpose")
    assert python_error(info.value).startswith("Traceback (most recent call last):")
    assert not is_transient(info.value)


def test_contract_a_lost_worker_reads_as_transient(spark):
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("long")
    def dies(s: pd.Series) -> pd.Series:
        os._exit(1)

    with pytest.raises(Exception) as info:  # noqa: PT011 - the text is the contract
        spark.range(3).select(dies("id")).collect()
    assert is_transient(info.value), str(info.value)[:2000]


def test_contract_a_cancelled_job_reads_as_an_interruption(spark):
    sc = spark.sparkContext
    failure: list[BaseException] = []

    def long_job() -> None:
        sc.setJobGroup("millwheel-contract", "a job to cancel", interruptOnCancel=True)
        try:
            spark.range(0, 10**13, numPartitions=2).selectExpr("sum(id % 7)").collect()
        except BaseException as exc:  # noqa: BLE001 - kept to look at
            failure.append(exc)

    t = threading.Thread(target=long_job)
    t.start()
    time.sleep(3)
    sc.cancelJobGroup("millwheel-contract")
    t.join(120)
    assert failure, "the job was not cancelled"
    short = compact_interruption(failure[0])
    assert short is not None, str(failure[0])[:2000]
    assert "InterruptedException (the query is stopping)" in str(short)


def test_contract_the_jvm_log4j_is_reachable(spark):
    assert root_log_level(spark) in {
        "OFF",
        "FATAL",
        "ERROR",
        "WARN",
        "INFO",
        "DEBUG",
        "TRACE",
        "ALL",
    }
    assert silence_loggers(spark, ["org.apache.hadoop.util.NativeCodeLoader"])


def _idle_gaps(spark, directory, conf):
    """Gaps (s) between an idle query's polls: with no data progress interval, each idle poll reports."""
    from datetime import datetime

    from millwheel.runtime._session import start_query

    writer = spark.readStream.schema("a int").parquet(str(directory)).writeStream.format("noop")
    q = start_query(
        writer, spark, {"spark.sql.streaming.noDataProgressEventInterval": "0ms", **conf}
    )
    try:
        time.sleep(2.5)
        stamps = [
            datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            for p in q.recentProgress
        ]
    finally:
        q.stop()
    return sorted(b - a for a, b in zip(stamps[1:], stamps[2:], strict=False))


def test_contract_polling_delay_spaces_an_idle_querys_polls(spark, tmp_path):
    """``polling_delay_conf`` given at a query's start spaces its idle polls (an internal
    setting: ``LogFileInjector`` starts its query with it, ``RuntimeSettings.injector_poll_ms``)."""
    (tmp_path / "empty").mkdir()
    slow = _idle_gaps(spark, tmp_path / "empty", polling_delay_conf(400))
    fast = _idle_gaps(spark, tmp_path / "empty", {})
    assert len(slow) >= 2, slow
    assert slow[len(slow) // 2] >= 0.35, (
        slow
    )  # the median gap: Spark sleeps 400 ms after an idle poll
    assert len(fast) > 2 * len(slow) and fast[len(fast) // 2] < 0.2, (
        fast,
        slow,
    )  # its default, 10 ms


def _probe_source(log: str) -> type:
    """A Python streaming source that appends its ``tag`` to ``log`` each time Spark asks it
    for its latest offset, and always has a new one."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def __init__(self, tag: str) -> None:
            self.tag, self.n = tag, 0

        def initialOffset(self) -> dict:
            return {"n": 0}

        def latestOffset(self) -> dict:
            with open(log, "a") as f:
                f.write(self.tag + "\n")
            self.n += 1
            return {"n": self.n}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(0)]

        def read(self, partition: Any) -> Any:
            yield (1,)

    class Probe(DataSource):
        @classmethod
        def name(cls) -> str:
            return "mw_order_probe"

        def schema(self) -> str:
            return "v long"

        def streamReader(self, schema: Any) -> Reader:
            return Reader(self.options["tag"])

    return Probe


def test_contract_sources_asked_in_plan_order(spark, tmp_path):
    """Up to four sources, a query asks them for new offsets in the order of its plan every
    time it plans a batch (``sources_asked_in_plan_order``): a query's heartbeats, first in
    its union, are listed before its inputs (``plans/_inputs.heartbeats_listed_first``)."""
    from functools import reduce

    assert sources_asked_in_plan_order(4) and not sources_asked_in_plan_order(5)
    log = tmp_path / "asked"
    spark.dataSource.register(_probe_source(str(log)))
    tags = ["hb", "in1", "in2", "in3"]
    frames = [spark.readStream.format("mw_order_probe").option("tag", t).load() for t in tags]
    q = (
        reduce(lambda a, b: a.unionByName(b), frames)
        .writeStream.foreachBatch(lambda df, n: None)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while (
            time.monotonic() < deadline
            and len(planned_batches(Location.of(str(tmp_path / "cp")))) < 5
        ):
            time.sleep(0.2)
    finally:
        q.stop()
    asked = log.read_text().split()
    assert len(asked) >= 5 * len(tags), asked
    asked = asked[: len(asked) // len(tags) * len(tags)]
    assert asked == tags * (len(asked) // len(tags)), asked


def test_contract_release_state_stores(spark, tmp_path):
    """A stopped stateful query's state-store providers stay loaded in this JVM:
    ``release_state_stores`` finds them under the query's ``state`` directory, runs their
    maintenance and closes them; none is left for Spark's maintenance to write with later,
    and another query's providers are left alone."""
    data = tmp_path / "in"
    data.mkdir()
    pd.DataFrame({"k": [1, 2, 3, 1]}).to_parquet(data / "a.parquet")

    def run(name: str):
        count(spark, data, tmp_path / name)
        return Location.of(str(tmp_path / name / "state"))

    mine, other = run("mine"), run("other")
    assert release_state_stores(spark, mine) > 0
    assert release_state_stores(spark, mine) == 0  # closed: nothing left
    assert release_state_stores(spark, other) > 0  # the other query's were kept until asked
    assert release_state_stores(spark, Location.of(str(tmp_path / "nothing"))) == 0


@pytest.mark.parametrize("release", [False, True], ids=["kept", "released"])
def test_a_stopped_querys_state_store_writes_into_a_swapped_store_unless_released(
    tmp_path, release
):
    """What ``release_state_stores`` is for: Spark runs a stopped query's providers'
    maintenance later, by path, so a store swapped into its state directory gets the old
    store's snapshot (``<version>.zip`` and its SST files); released first, nothing is
    written there (``docs/reliability.md``, "Stopped queries' state stores")."""
    import json
    import subprocess
    import sys

    # the package is installed (editable), and conftest.py set PYSPARK_PYTHON
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("stray_snapshot_driver.py")),
            "release" if release else "keep",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    written = json.loads(out.stdout.strip().splitlines()[-1])
    if release:
        assert written == []
    else:  # Spark's behaviour: if it changes, the release may no longer be needed
        assert any(name.endswith(".zip") for name in written), written
