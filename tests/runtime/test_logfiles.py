"""The Spark reader of ``LogFileSource`` (``millwheel/runtime/_logfiles.py``): its offsets, ranges
and rows are the shared plan's (``tests/test_logfile.py`` tests the plan itself). The stream
reader runs on the driver without a JVM, so it is tested directly; the runs count exactly
with either reader (``RuntimeSettings.log_reader``; the driver's: ``test_logreader.py``).
"""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from millwheel import (
    DEAD_LETTER_STREAM,
    MAX_TIMESTAMP,
    Computation,
    ComputationOptions,
    LatePolicy,
    LogFileSource,
    Topology,
)
from millwheel._fields import FIELDS_COLUMN, StreamFields, rebuild_values
from millwheel._logfile import ByteRange, initial_offset, plan_offset, plan_ranges, read_range

pytest.importorskip("pyspark.sql.datasource")
from millwheel.runtime._keying import Keyer  # noqa: E402
from millwheel.runtime._logfiles import LogFileStreamReader, declared_columns, keyer_options  # noqa: E402

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
        assert (
            end == plan_offset(start, src.read_options, 0)
            or end["lw"] == plan_offset(start, src.read_options, 0)["lw"]
        )
        parts = reader.partitions(start, end)
        assert [r[:4] for p in parts for r in p.value] == [
            (r.name, r.begin, r.end, r.sender_watermark) for r in plan_ranges(start, end, 0)
        ]
        for part in parts:
            for batch in reader.read(part):
                assert isinstance(batch, pa.RecordBatch)
                d = batch.to_pydict()
                rows += list(
                    zip(
                        d["stream"],
                        d["id"],
                        d["ts"],
                        [pickle.loads(v) for v in d["value"]],
                        strict=True,
                    )
                )
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
@pytest.mark.parametrize("log_reader", ["driver", "spark"])
def test_finished_part_files_with_cross_file_disorder_count_exactly_on_spark(
    tmp_path, spark, real_logs, second_counts, log_reader
):
    # the harness twin is tests/test_logfile.py; both equal the batch answer, not only each other
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    truth, _ = real_logs(tmp_path / "logs", events=20_000, files=8, disorder_ms=5_000)
    t = second_counts(LogFileSource(tmp_path / "logs", id_field="id", ts_field="ts", finite=True))
    rt = SparkRuntime(
        t,
        str(tmp_path / "run"),
        RuntimeSettings(drain=True, intervals=2, log_reader=log_reader),
        spark=spark,
    )
    rt.run(timeout_s=600)
    assert rt.computations["SecondCounts"].metrics["late"] == 0
    assert second_counts.answer(rt.output("counts")) == truth


@pytest.mark.spark
@pytest.mark.parametrize("log_reader", ["driver", "spark"])
def test_a_growing_file_without_a_time_counts_exactly_on_spark(
    tmp_path, spark, real_logs, second_counts, log_reader
):
    import time

    from millwheel.runtime import RuntimeSettings, SparkRuntime

    truth, lines = real_logs(tmp_path, events=6_000, disorder_ms=5_000, only_lines=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "events.jsonl"
    log.write_text("")
    rt = SparkRuntime(
        second_counts(LogFileSource(logs)),
        str(tmp_path / "run"),
        RuntimeSettings(intervals=2, poll_ms=50, log_reader=log_reader),
        spark=spark,
    )
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
def test_a_rerun_reads_a_file_that_landed_in_a_finished_directory_before_it_says_drained(
    tmp_path, spark
):
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
    t.computation(
        Tally,
        inputs={"logs": lambda r: "all"},
        outputs=["seen"],
        options=ComputationOptions(late=LatePolicy.process()),
    )
    run = str(tmp_path / "run")
    SparkRuntime(t, run, RuntimeSettings(drain=True, intervals=2), spark=spark).run(timeout_s=300)
    (logs / "reinject_1767261600999_42.jsonl").write_text(
        _line(3, T + 3)
    )  # lands after the run finished
    rt = SparkRuntime(t, run, RuntimeSettings(drain=True, intervals=2), spark=spark)
    rt.run(timeout_s=300)
    assert sorted(rt.values("seen")) == ["e1", "e2", "e3"]
    assert rt.states("Tally") == {"all": 3}


@pytest.mark.spark
def test_a_finished_empty_directory_gets_its_query_only_once_a_file_lands(tmp_path, spark):
    """A complete directory without a log file (Photon's re-injection directory) starts no
    query: its watermark is +inf at once, the run drains without it; a file that lands
    later starts the query, which reads it (``LogFileInjector.waiting``)."""
    import time

    from millwheel.runtime import RuntimeSettings, SparkRuntime

    logs, late = tmp_path / "logs", tmp_path / "late"
    for d in (logs, late):
        d.mkdir()
        (d / "_DONE").write_text("")
    (logs / "first.jsonl").write_text(_line(1, T + 1) + _line(2, T + 2))
    t = Topology("waiting")
    t.injector("logs", LogFileSource(logs))
    t.injector("late", LogFileSource(late))
    t.computation(
        Tally,
        inputs={"logs": lambda r: "all", "late": lambda r: "all"},
        outputs=["seen"],
        options=ComputationOptions(late=LatePolicy.process()),
    )
    rt = SparkRuntime(
        t, str(tmp_path / "run"), RuntimeSettings(intervals=2, poll_ms=50), spark=spark
    )

    def poll_until(done):
        deadline = time.monotonic() + 300
        while not done():
            assert time.monotonic() < deadline, rt.status()
            rt.poll()
            time.sleep(0.05)

    rt.start()
    try:
        waiting = rt.injectors["late"]
        assert waiting.waiting and not waiting.reading and waiting.low_watermark == MAX_TIMESTAMP
        poll_until(rt.drained)
        assert not waiting.reading and sorted(rt.values("seen")) == ["e1", "e2"]
        (late / "reinject_1767261600999_42.jsonl").write_text(_line(3, T + 3))
        assert not rt.drained()  # something to read: not drained, whatever the watermark
        poll_until(lambda: rt.drained() and len(rt.values("seen")) == 3)
        assert waiting.reading and not waiting.waiting
    finally:
        rt.stop()
    assert sorted(rt.values("seen")) == ["e1", "e2", "e3"]
    assert rt.states("Tally") == {"all": 3}


@pytest.mark.spark
def test_the_stall_advice_followed_mid_run_finishes_a_file_without_a_final_newline(tmp_path, spark):
    """Issue 36, observation 1 on Spark: a file whose last line has no newline never
    finished, and the stall warning's advice (``<name>.done``, ``_DONE``) changed nothing."""
    import time

    from millwheel.runtime import RuntimeSettings, SparkRuntime

    logs = tmp_path / "logs"
    logs.mkdir()
    name = "queries-2026-01-01.jsonl"
    (logs / name).write_text(_line(1, T + 1) + _line(2, T + 2) + _line(3, T + 3)[:-1])
    t = Topology("no_final_newline")
    t.injector("logs", LogFileSource(logs, idle_finish_ms=None))
    t.computation(Tally, inputs={"logs": lambda r: "all"}, outputs=["seen"])
    rt = SparkRuntime(
        t,
        str(tmp_path / "run"),
        RuntimeSettings(intervals=2, poll_ms=50, stall_warning_s=1.0),
        spark=spark,
    )
    rt.start()
    try:
        until = time.monotonic() + 300  # a bound, not a wait
        while (warning := rt.injectors["logs"].stalled()) is None:
            assert time.monotonic() < until, "no stall warning"
            rt.poll()
            time.sleep(0.05)
        assert f"{name}.done" in warning and "without a newline" in warning
        (logs / f"{name}.done").write_text("")  # the advice, followed mid-run
        while "e3" not in rt.values("seen"):
            assert time.monotonic() < until, "the last line was never read"
            rt.poll()
            time.sleep(0.05)
        (logs / "_DONE").write_text("")
        rt.run(timeout_s=120)  # until drained
    finally:
        rt.stop()
    assert sorted(rt.values("seen")) == ["e1", "e2", "e3"] and rt.dead_letters() == []


def _messy_lines() -> str:
    """Lines whose values conform to the declared fields or do not (order, extra or missing
    fields, wrong types, an int beyond int64, None), and lines that are dead letters."""
    values = [
        {"id": "c1", "ts": T + 1, "query": "cats"},
        {"id": "c2", "ts": T + 2, "query": None},
        {"ts": T + 3, "id": "c3", "query": "dogs"},
        {"id": "c4", "ts": T + 4, "query": "cats", "extra": [1, 2.5]},
        {"id": "c5", "ts": T + 5},
        {"id": "c6", "ts": T + 6, "query": 7},
        {"id": "c7", "ts": T + 7, "query": True},
        {"id": "c8", "ts": T + 8, "query": "é ☕"},
    ]
    lines = [json.dumps(v, ensure_ascii=False) for v in values]
    lines += [
        '{"id": "c9", "ts": 1767261600009, "query": "x", "n": 123456789012345678901234567890}',
        "{oops",
        '{"id": "d", "ts": 1.5}',
        "[1]",
        "",
    ]
    return "\n".join(lines) + "\n"


def _rowwise(reader: LogFileStreamReader, r: ByteRange) -> pa.Table:
    """A range's rows built value by value, the way every writer builds them
    (``StreamFields.split``, ``Keyer.arrays`` over all rows): what the reader's columns must equal."""
    chunk = read_range(reader.opts, r, reader.injector, reader.stream)
    rows = [(reader.stream, rec, r.sender_watermark) for rec in chunk.records] + [
        (DEAD_LETTER_STREAM, rec, None) for rec in chunk.dead_letters
    ]
    keyer = reader.keyer
    values, declared = keyer.value_columns(
        reader.stream, [s for s, _, _ in rows], [rec.value for _, rec, _ in rows]
    )
    cols = {
        "stream": pa.array([s for s, _, _ in rows], pa.string()),
        "id": pa.array([rec.id for _, rec, _ in rows], pa.string()),
        "ts": pa.array([rec.timestamp for _, rec, _ in rows], pa.int64()),
        "key": pa.array([None] * len(rows), pa.binary()),
        "value": values,
        "wm": pa.array([w for _, _, w in rows], pa.int64()),
    }
    for f, a in zip(
        keyer.arrow_fields(reader.consumers),
        keyer.arrays([(s, rec) for s, rec, _ in rows], reader.consumers),
        strict=True,
    ):
        cols[f.name] = a
    if declared is not None:
        cols[FIELDS_COLUMN] = declared
    return pa.table(cols)


@pytest.mark.parametrize("declare", [True, False])
def test_the_readers_columns_are_the_rows_built_value_by_value(tmp_path, declare):
    (tmp_path / f"q-{T}.jsonl").write_text(_messy_lines(), encoding="utf-8")
    (tmp_path / f"q-{T + 1_000}.jsonl").write_text(
        "".join(_line(i, T + 1_000 + i) for i in range(50))
    )
    t = Topology("t")
    src = LogFileSource(tmp_path, finite=True)
    t.injector("logs", src, stream="queries")
    if declare:
        t.stream("queries", fields={"id": str, "ts": int, "query": str})

    class Count(Computation):
        def process_record(self, ctx, record):
            pass

    t.computation(Count, inputs={"queries": lambda r: r.value["query"]})
    t.computation(Count, name="Letters", inputs={DEAD_LETTER_STREAM: lambda r: r.value.file})
    t.validate()
    options = {**src.options(), "injector": "logs", "stream": "queries", "partitions": "1"}
    options.update(keyer_options(Keyer.of(t, 4), "queries"))
    reader = LogFileStreamReader(options)
    start = reader.initialOffset()
    (part,) = reader.partitions(start, reader.latestOffset(start))
    got = pa.Table.from_batches(list(reader.read(part)))
    want = pa.concat_tables([_rowwise(reader, ByteRange(*r)) for r in part.value])
    assert got.schema == want.schema
    # the same rows, in the same order: each range's records, then its dead letters
    assert got.to_pylist() == want.to_pylist()
    assert got.num_rows == 62 and got.column("stream").to_pylist().count(DEAD_LETTER_STREAM) == 3
    if declare:  # what conforms is stored as columns, the rest pickled
        assert [v is None for v in got.column("value").to_pylist()[:9]] == [
            True,
            True,
            False,
            False,
            False,
            False,
            False,
            True,
            False,
        ]


@given(
    st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {
                    "q": st.one_of(st.none(), st.text(max_size=4), st.integers(), st.booleans()),
                    "n": st.one_of(
                        st.none(),
                        st.integers(min_value=-(2**64), max_value=2**64),
                        st.floats(allow_nan=False),
                        st.booleans(),
                    ),
                }
            ),
            st.dictionaries(st.sampled_from(["q", "n", "x"]), st.integers(), max_size=3),
            st.integers(),
            st.none(),
        ),
        max_size=12,
    )
)
def test_declared_columns_split_values_as_streamfields_split_does(values):
    f = StreamFields.of({"q": str, "n": int})
    arr, encoded = f.split(values)
    value, fields = declared_columns(f, values)
    assert value.to_pylist() == encoded
    assert rebuild_values(value.to_pylist(), fields) == rebuild_values(encoded, arr) == values
    assert fields.type == arr.type and [v is None for v in fields.to_pylist()] == [
        v is None for v in arr.to_pylist()
    ]
