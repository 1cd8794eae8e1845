"""Stream logs, value encodings and Spark time: the pure parts of the runtime (no JVM)."""

from __future__ import annotations

import sys

from millwheel import MAX_TIMESTAMP, MIN_TIMESTAMP, Record
from millwheel.runtime._fs import Location
from millwheel.runtime._streams import FileStreamLog, file_name, min_ts_of
from millwheel.runtime._wire import SPARK_CAP, from_spark, timer_timeout, to_spark


def test_spark_time_round_trip_and_order():
    for ts in (-(10**11), -1, 0, 1, 1_000, 1_700_000_000_000):
        assert from_spark(to_spark(ts)) == ts
    assert to_spark(MIN_TIMESTAMP) == 0 and from_spark(0) == MIN_TIMESTAMP
    assert to_spark(MAX_TIMESTAMP) == SPARK_CAP and from_spark(SPARK_CAP) == MAX_TIMESTAMP
    values = [to_spark(t) for t in (-5, 0, 7, 1_700_000_000_000)]
    assert values == sorted(values)


def test_timer_timeout_fires_exactly_when_due():
    # Spark times a group out when timeout < watermark; a timer is due when ts <= low watermark
    for ts in (0, 1_000, 1_700_000_000_123):
        t = timer_timeout(ts)
        assert not t < to_spark(ts - 1)
        assert t < to_spark(ts)
    assert timer_timeout(MAX_TIMESTAMP) < SPARK_CAP


def test_file_names_carry_the_oldest_timestamp():
    assert min_ts_of(file_name("b0000000001-part", -42)) == -42
    assert min_ts_of(file_name("s1", 1_700_000_000_000)) == 1_700_000_000_000
    assert min_ts_of(".hidden-m5.parquet") is None
    assert min_ts_of("_SUCCESS") is None


def test_stream_log_append_is_atomic_idempotent_and_readable(tmp_path):
    log = FileStreamLog(Location.of(str(tmp_path)))
    log.ensure("words", "inj")
    recs = [Record("k", {"w": "cats", "t": (1, 2)}, 1_500, "r1"), Record(None, "dogs", 1_200, "r2")]
    log.append("words", "inj", "s0", recs)
    log.append("words", "inj", "s0", recs)  # a replay re-creates the same file: skipped
    assert log.files("words", "inj") == {"s0-m1200.parquet": 1200}
    assert log.read("words") == recs
    assert not [
        p for p in (tmp_path / "streams" / "words" / "inj").iterdir() if p.name.startswith(".")
    ]


def test_pruned_files_leave_the_live_listing_but_not_the_log(tmp_path):
    log = FileStreamLog(Location.of(str(tmp_path)))
    log.ensure("words", "inj")
    for i in range(3):
        log.append("words", "inj", f"s{i}", [Record(None, i, 1_000 + i, f"r{i}")])
    assert (
        log.prune("words", "inj", ["s0-m1000.parquet", "s1-m1001.parquet", "gone-m5.parquet"]) == 2
    )
    assert log.files("words", "inj", live_only=True) == {"s2-m1002.parquet": 1002}
    assert sorted(log.files("words", "inj")) == [
        "_done/s0-m1000.parquet",
        "_done/s1-m1001.parquet",
        "s2-m1002.parquet",
    ]
    assert [r.value for r in log.read("words")] == [0, 1, 2]


def test_importing_the_runtime_package_and_file_source_imports_no_pyspark():
    import subprocess

    code = (
        "import sys, millwheel, millwheel.runtime; from millwheel import LogFileSource; "
        "from millwheel.runtime import RuntimeSettings; print('pyspark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
