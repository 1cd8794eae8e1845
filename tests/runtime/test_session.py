"""Session settings a run and its queries start with (``millwheel/runtime/_session.py``)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pyarrow.fs as pafs
import pytest

from millwheel.runtime._fs import Location
from millwheel.runtime._session import (
    LOCAL_CHECKPOINT_CONF,
    checkpoint_conf,
    join_java_options,
    start_query,
)


def test_a_checkpoint_on_a_local_disk_gets_the_filesystem_checkpoint_manager(tmp_path) -> None:
    assert checkpoint_conf(Location.of(str(tmp_path))) == LOCAL_CHECKPOINT_CONF
    assert checkpoint_conf(Location.of(f"file://{tmp_path}")) == LOCAL_CHECKPOINT_CONF


def test_a_checkpoint_elsewhere_keeps_spark_s_default_manager() -> None:
    # HDFS's FileContext renames atomically without overwriting: Spark's default stays
    remote = Location("mock:///runs/r", pafs._MockFileSystem(), "/runs/r")
    assert checkpoint_conf(remote) == {}


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class _Spark:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = _Conf(values)


class _Writer:
    def __init__(self, spark: _Spark, fail: bool = False) -> None:
        self.spark, self.fail, self.seen = spark, fail, None

    def start(self) -> str:
        self.seen = dict(self.spark.conf.values)
        if self.fail:
            msg = "query did not start"
            raise RuntimeError(msg)
        return "query"


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
def test_a_collector_in_millwheel_java_options_replaces_the_topologys() -> None:
    """The bundled sample's JVM options name SerialGC; a user who names another collector in
    $MILLWHEEL_JAVA_OPTIONS gets a JVM that starts (two collectors: "conflicting collector
    combinations", and no JVM), with their collector."""
    sample, user = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC", "-XX:+UseParallelGC"

    def starts(options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["java", *options.split(), "-XX:+PrintCommandLineFlags", "-version"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert starts(f"{sample} {user}").returncode != 0  # what plain concatenation gave
    joined = starts(join_java_options(sample, user))
    assert joined.returncode == 0, joined.stderr
    assert (
        "-XX:+UseParallelGC" in joined.stdout + joined.stderr
        and "-XX:TieredStopAtLevel=1" in joined.stdout + joined.stderr
    )
    assert (
        join_java_options(sample, "-Xss4m") == f"{sample} -Xss4m"
    )  # no collector named: the topology's stays


def test_start_query_sets_the_settings_for_the_start_only() -> None:
    spark = _Spark({"a": "session", "keep": "1"})
    writer = _Writer(spark)
    assert start_query(writer, spark, {"a": "query", "b": "query"}) == "query"
    assert writer.seen == {"a": "query", "b": "query", "keep": "1"}
    assert spark.conf.values == {"a": "session", "keep": "1"}


def test_start_query_restores_the_session_when_the_start_fails() -> None:
    spark = _Spark({"a": "session"})
    with pytest.raises(RuntimeError, match="did not start"):
        start_query(_Writer(spark, fail=True), spark, {"a": "query", "b": "query"})
    assert spark.conf.values == {"a": "session"}


@pytest.mark.spark
def test_a_run_on_a_local_disk_sets_the_manager_for_its_whole_run_and_writes_from_the_driver(
    spark, run_dir
) -> None:
    from millwheel import Record
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    from ._chain import chain

    key = next(iter(LOCAL_CHECKPOINT_CONF))
    before = spark.conf.get(key, None)
    rt = SparkRuntime(
        chain(
            "session", [Record(None, {"n": i}, 1_000 + i, f"r{i}") for i in range(12)], batch_size=4
        ),
        run_dir,
        RuntimeSettings(drain=True, intervals=2, poll_ms=50),
        spark=spark,
    )
    rt.start()
    try:
        assert (
            spark.conf.get(key) == LOCAL_CHECKPOINT_CONF[key]
        )  # while the run goes on (sources are made later)
        while not rt.drained():
            rt.poll()
            time.sleep(0.05)
    finally:
        rt.stop()
    assert spark.conf.get(key, None) == before
    assert sorted(rt.values("doubled")) == [2 * i for i in range(12)]
    # outbox_writer="auto" on a local master: the driver wrote the outboxes
    assert {q.outbox.writer for q in rt.computations.values()} == {"driver"}


def test_warming_the_python_workers_runs_on_a_real_session(spark) -> None:
    """The warm-up job runs (its function is importable in the workers, its schema right),
    and a job right after runs in workers that have the step's modules. Only "a worker": the
    suite's shared session may hold idle workers an earlier test started, without them
    (it failed once under xdist asking every task of the next job to be warm)."""
    import gc
    import sys

    from millwheel.runtime._session import warm_python_workers

    warm_python_workers(spark)

    def modules(batches):
        import pyarrow as pa

        for b in batches:
            yield pa.RecordBatch.from_pylist(
                [
                    {
                        "warm": "millwheel.runtime._interval" in sys.modules
                        and gc.get_freeze_count() > 10_000
                    }
                ]
                * b.num_rows
            )

    n = spark.sparkContext.defaultParallelism
    # the workers are reused: a job right after runs in them, their imports frozen out of the collector's walks
    assert True in {
        r.warm for r in spark.range(0, n, 1, n).mapInArrow(modules, "warm boolean").collect()
    }


def test_a_run_whose_warm_up_fails_says_so_and_goes_on(spark, run_dir, monkeypatch) -> None:
    from millwheel import Record
    from millwheel.runtime import RuntimeSettings, SparkRuntime, _runtime

    from ._chain import chain

    def fails(_spark) -> None:
        msg = "no Python worker today"
        raise RuntimeError(msg)

    monkeypatch.setattr(_runtime, "warm_python_workers", fails)
    lines: list[str] = []
    rt = SparkRuntime(
        chain("warm", [Record(None, {"n": i}, 1_000 + i, f"r{i}") for i in range(4)], batch_size=2),
        run_dir,
        RuntimeSettings(drain=True, intervals=2, poll_ms=50),
        spark=spark,
        log=lines.append,
    )
    rt.run(timeout_s=300)
    assert any(
        "warming the Python workers failed (no Python worker today)" in line for line in lines
    )
    assert sorted(rt.values("doubled")) == [2 * i for i in range(4)]
