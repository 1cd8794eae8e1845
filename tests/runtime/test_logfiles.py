"""The Spark reader of ``LogFileSource`` (``millwheel/runtime/_logfiles.py``): its offsets, ranges
and rows are the shared plan's (``tests/test_logfile.py`` tests the plan itself). The stream
reader runs on the driver without a JVM, so it is tested directly.
"""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pytest

from millwheel import (
    DEAD_LETTER_STREAM,
    Computation,
    ComputationOptions,
    LatePolicy,
    LogFileSource,
    Topology,
)
from millwheel._logfile import initial_offset, plan_offset, plan_ranges

pytest.importorskip("pyspark.sql.datasource")
from millwheel.runtime._logfiles import LogFileStreamReader  # noqa: E402

T = 1_767_261_600_000


def _line(i, ts):
    return json.dumps({"id": f"e{i}", "ts": ts, "query": "cats"}) + "\n"


def test_the_reader_reads_the_shared_plan_as_stream_log_rows(tmp_path):
    (tmp_path / f"q-{T}.jsonl").write_text(_line(1, T + 1) + "{oops\n" + _line(2, T + 2))
    (tmp_path / f"q-{T + 1_000}.jsonl").write_text(_line(3, T + 1_001) + _line(4, T + 500))
    src = LogFileSource(tmp_path, finite=True, max_bytes_per_batch=80)
    reader = LogFileStreamReader({**src.options(), "injector": "logs", "stream": "queries"})
    start = reader.initialOffset()
    rows, wms = [], []
    while True:
        end = reader.latestOffset(start, None)
        assert end == plan_offset(start, src.read_options, 0) or end["lw"] == plan_offset(start, src.read_options, 0)["lw"]
        parts = reader.partitions(start, end)
        assert [r[:4] for p in parts for r in p.value] == [(r.name, r.begin, r.end, r.sender_watermark) for r in plan_ranges(start, end, 0)]
        for part in parts:
            for batch in reader.read(part):
                assert isinstance(batch, pa.RecordBatch)
                d = batch.to_pydict()
                rows += list(zip(d["stream"], d["id"], d["ts"], [pickle.loads(v) for v in d["value"]], strict=True))
                wms += list(zip(d["id"], d["wm"], strict=True))
        if end == start or end["lw"] == 2**63 - 1:
            break
        start = end
    assert [i for s, i, _, _ in rows if s == "queries"] == ["e1", "e2", "e3", "e4"]
    (dead,) = [v for s, _, _, v in rows if s == DEAD_LETTER_STREAM]
    assert dead.file == f"q-{T}.jsonl" and dead.reason.startswith("broken JSON")
    # e4 (T+500) is sent under at least its file's time: late downstream, however the bytes are batched
    sent = dict(wms)
    assert sent["e4"] >= T + 1_000 and sent["e1"] == T
    assert initial_offset() == reader.initialOffset()


@pytest.mark.spark
def test_finished_part_files_with_cross_file_disorder_count_exactly_on_spark(tmp_path, spark, real_logs, second_counts):
    # the harness twin is tests/test_logfile.py; both equal the batch answer, not only each other
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    truth, _ = real_logs(tmp_path / "logs", events=20_000, files=8, disorder_ms=5_000)
    t = second_counts(LogFileSource(tmp_path / "logs", id_field="id", ts_field="ts", finite=True))
    rt = SparkRuntime(t, str(tmp_path / "run"), RuntimeSettings(drain=True, intervals=2), spark=spark)
    rt.run(timeout_s=600)
    assert rt.computations["SecondCounts"].metrics["late"] == 0
    assert second_counts.answer(rt.output("counts")) == truth


@pytest.mark.spark
def test_a_growing_file_without_a_time_counts_exactly_on_spark(tmp_path, spark, real_logs, second_counts):
    import time

    from millwheel.runtime import RuntimeSettings, SparkRuntime

    truth, lines = real_logs(tmp_path, events=6_000, disorder_ms=5_000, only_lines=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "events.jsonl"
    log.write_text("")
    rt = SparkRuntime(second_counts(LogFileSource(logs)), str(tmp_path / "run"),
                      RuntimeSettings(intervals=2, poll_ms=50), spark=spark)  # fmt: skip
    rt.start()
    try:
        chunk = len(lines) // 6
        for i in range(7):
            with log.open("a") as fh:
                fh.write("".join(x + "\n" for x in lines[i * chunk : (i + 1) * chunk]))
            until = time.monotonic() + 1.5
            while time.monotonic() < until:
                rt.poll()
                time.sleep(0.05)
        (logs / "_DONE").write_text("")
        rt.run(timeout_s=300)  # until drained
    finally:
        rt.stop()
    assert rt.drained()
    assert rt.computations["SecondCounts"].metrics["late"] == 0
    assert second_counts.answer(rt.output("counts")) == truth


class Tally(Computation):
    def process_record(self, record):
        self.state.set((self.state.get(0) or 0) + 1)
        self.produce("seen", record.id)


@pytest.mark.spark
def test_a_rerun_reads_a_file_that_landed_in_a_finished_directory_before_it_says_drained(tmp_path, spark):
    # verification re-injects clicks into a stopped pipeline's finished
    # re-injection directory; before, a rerun reported drained at once (the watermark was already
    # +inf) and never read them
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "_DONE").write_text("")
    (logs / "first.jsonl").write_text(_line(1, T + 1) + _line(2, T + 2))
    t = Topology("rerun")
    t.injector("logs", LogFileSource(logs))
    t.computation(Tally, inputs={"logs": lambda r: "all"}, outputs=["seen"], options=ComputationOptions(late=LatePolicy.process()))
    run = str(tmp_path / "run")
    SparkRuntime(t, run, RuntimeSettings(drain=True, intervals=2), spark=spark).run(timeout_s=300)
    (logs / "reinject_1767261600999_42.jsonl").write_text(_line(3, T + 3))  # lands after the run finished
    rt = SparkRuntime(t, run, RuntimeSettings(drain=True, intervals=2), spark=spark)
    rt.run(timeout_s=300)
    assert sorted(rt.values("seen")) == ["e1", "e2", "e3"]
    assert rt.states("Tally") == {"all": 3}
