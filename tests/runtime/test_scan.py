"""The scan plan for columnar computations (``millwheel/runtime/_scan.py``), on both
mappings: the JVM marks the key intervals a micro-batch has records for, and each
interval's step reads its records from the batch's files, as the row plan would have
handed them over."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from millwheel import ColumnarComputation, ComputationOptions, Record, SampleSource, Topology
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._fs import Location
from millwheel.runtime._scan import (
    BatchScan,
    Markers,
    ScannedInput,
    batch_files,
    batch_intervals,
    log_entries,
    spark_xxhash64,
)
from millwheel.runtime._wire import RowKind

from ._chain import Sum, by_n
from .test_keying import _UnkeyedFileMidRun


def test_the_hash_of_an_unkeyed_row_is_sparks_xxhash64():
    """Values of Spark 4.3's ``xxhash64(id)`` (seed 42) for these strings: a row without
    ``interval:C`` must land in the interval ``pmod(xxhash64(id), n)`` the row plan sends it to."""
    spark_says = {
        "abc": 1423657621850124518,
        "": -7444071767201028348,
        "q-123456789": -1576691694926087902,
        "é字": 2994304342832642983,
        "a" * 100: -5307276994506690727,
    }
    assert {s: spark_xxhash64(s) for s in spark_says} == spark_says
    assert spark_xxhash64(None) == 42  # Spark's hash of a null is its seed
    assert [spark_xxhash64(s) % 16 for s in ("abc", "", "q-123456789")] == [
        6,
        4,
        2,
    ]  # pmod, as Spark gives them


def test_markers_name_each_group_of_a_task_once_and_keep_a_null_group():
    out = list(
        Markers()(
            [
                pa.record_batch({"group": pa.array([3, 1, 3], pa.int32())}),
                pa.record_batch({"group": pa.array([1, None, 7], pa.int32())}),
            ]
        )
    )
    assert len(out) == 1
    got = out[0].to_pydict()
    assert sorted(got["group"], key=lambda g: -1 if g is None else g) == [None, 1, 3, 7] and all(
        got["scan"]
    )
    assert list(Markers()([pa.record_batch({"group": pa.array([], pa.int32())})])) == []


def _log(d: Path, name: str, entries: list[tuple[str, int]]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    lines = ["v1"] + [json.dumps({"path": p, "timestamp": 0, "batchId": b}) for p, b in entries]
    (d / name).write_text("\n".join(lines))


def test_a_file_source_log_is_read_through_its_compactions(tmp_path):
    """Offsets 0-3 compacted into ``3.compact`` (their own files deleted), 4 and 5 as files."""
    log = tmp_path / "sources" / "1"
    _log(log, "3.compact", [(f"file:///r/streams/s/p/f{b}.parquet", b) for b in range(4)])
    _log(log, "4", [("file:///r/streams/s/p/f4.parquet", 4)])
    _log(
        log,
        "5",
        [("file:///r/streams/s/p/f5a.parquet", 5), ("file:///r/streams/s/p/f5b.parquet", 5)],
    )
    names = [p[-1] for p, _ in log_entries(Location.of(str(log)), 2, 5)]
    assert names == ["f2.parquet", "f3.parquet", "f4.parquet", "f5a.parquet", "f5b.parquet"]
    with pytest.raises(RuntimeError, match="no entry for offset 6"):
        log_entries(Location.of(str(log)), 6, 6)


def _write_stream_file(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist(
            rows,
            schema=pa.schema(
                [
                    ("id", pa.string()),
                    ("ts", pa.int64()),
                    ("key", pa.binary()),
                    ("value", pa.binary()),
                    ("wm", pa.int64()),
                    ("key:C", pa.binary()),
                    ("interval:C", pa.int32()),
                ]
            ),
        ),
        path,
    )


def test_a_batch_reads_its_own_files_and_each_interval_its_own_rows(tmp_path):
    """Two batches of a query reading one stream: batch 1 is its files only; an interval
    gets its keyed rows in file order with their row index, and a row without
    ``interval:C`` where Spark's hash of its id sends it, as a row to key in the step;
    a batch planned anew (its offset-log entry rewritten) is read anew."""
    root, cp = tmp_path / "run", tmp_path / "run" / "checkpoints" / "C"
    sdir = root / "streams" / "s" / "p"
    rows = [
        {
            "id": "a",
            "ts": 1,
            "key": b"k",
            "value": b"1",
            "wm": None,
            "key:C": b"ka",
            "interval:C": 2,
        },
        {"id": "b", "ts": 2, "key": b"k", "value": b"2", "wm": 5, "key:C": b"kb", "interval:C": 0},
        {
            "id": "abc",
            "ts": 3,
            "key": b"raw",
            "value": b"3",
            "wm": None,
            "key:C": None,
            "interval:C": None,
        },
        {
            "id": "c",
            "ts": 4,
            "key": b"k",
            "value": b"4",
            "wm": None,
            "key:C": b"kc",
            "interval:C": 2,
        },
    ]
    _write_stream_file(sdir / "f0.parquet", rows[:1])
    _write_stream_file(sdir / "f1.parquet", rows)
    _log(cp / "sources" / "0", "0", [(f"file://{root}/heartbeats/C/h0.parquet", 0)])
    _log(cp / "sources" / "1", "0", [(f"file://{sdir}/f0.parquet", 0)])
    _log(cp / "sources" / "1", "1", [(f"file://{sdir}/f1.parquet", 1)])
    (cp / "offsets").mkdir(parents=True)
    (cp / "offsets" / "0").write_text('v1\n{}\n{"logOffset":0}\n{"logOffset":0}')
    (cp / "offsets" / "1").write_text('v1\n{}\n{"logOffset":0}\n{"logOffset":1}')
    scan = BatchScan(
        Location.of(str(cp)).uri,
        (ScannedInput("s", "p", Location.of(str(sdir)).uri),),
        "key:C",
        "interval:C",
        8,
    )
    assert [n for _, n in batch_files(scan, 1)] == ["f1.parquet"]
    got = scan.records(2, batch=1).to_pydict()
    assert (got["id"], got["key"], got["row"], got["src"], got["stream"]) == (
        ["a", "c"],
        [b"ka", b"kc"],
        [0, 3],
        ["f1.parquet"] * 2,
        ["s", "s"],
    )
    assert (
        got["kind"] == [int(RowKind.RECORD)] * 2
        and got["wm"] == [None, None]
        and got["now"] == [None, None]
    )
    unkeyed = scan.records(spark_xxhash64("abc") % 8, batch=1).to_pydict()  # interval 6
    assert (unkeyed["id"], unkeyed["key"], unkeyed["kind"], unkeyed["row"]) == (
        ["abc"],
        [b"raw"],
        [int(RowKind.UNKEYED)],
        [2],
    )
    assert scan.records(5, batch=1) is None
    assert scan.records(2, batch=0).to_pydict()["id"] == ["a"]
    # what a task that finds its intervals itself sees (``ArrowPlan.marks_in_tasks``)
    assert batch_intervals(scan, 1) == {0, 2, 6} and batch_intervals(scan, 0) == {2}
    (cp / "offsets" / "1").write_text(
        'v1\n{}\n{"logOffset":0}\n{"logOffset":0}'
    )  # planned anew: nothing new
    assert batch_files(scan, 1) == [] and scan.records(2, batch=1) is None
    assert batch_intervals(scan, 1) == set()


def test_a_file_without_key_columns_is_read_whole_as_rows_to_key(tmp_path):
    root, cp = tmp_path / "run", tmp_path / "run" / "checkpoints" / "C"
    sdir = root / "streams" / "s" / "p"
    sdir.mkdir(parents=True)
    ids = [f"old{i}" for i in range(20)]
    pq.write_table(
        pa.table(
            {
                "id": ids,
                "ts": np.arange(20, dtype=np.int64),
                "key": [b"x"] * 20,
                "value": [b"v"] * 20,
                "wm": pa.nulls(20, pa.int64()),
            }
        ),
        sdir / "legacy.parquet",
    )
    _log(cp / "sources" / "0", "0", [(f"file://{sdir}/legacy.parquet", 0)])
    (cp / "offsets").mkdir(parents=True)
    (cp / "offsets" / "0").write_text('v1\n{}\n{"logOffset":0}')
    scan = BatchScan(
        Location.of(str(cp)).uri,
        (ScannedInput("s", "p", Location.of(str(sdir)).uri),),
        "key:C",
        "interval:C",
        4,
    )
    seen = {}
    for i in range(4):
        t = scan.records(i, batch=0)
        for rid, row, kind in (
            zip(*(t.column(c).to_pylist() for c in ("id", "row", "kind")), strict=True)
            if t is not None
            else ()
        ):
            assert kind == int(RowKind.UNKEYED) and ids[row] == rid
            seen[rid] = i
    assert seen == {rid: spark_xxhash64(rid) % 4 for rid in ids}


def test_values_left_in_the_files_are_read_when_asked(tmp_path):
    """A scan for a computation that reads no values leaves them in the files: the rows
    come with a null ``value`` and a :class:`FileValues` that reads them, in the rows'
    order or any order taken of them, and fills them in; a file with a row to key in
    the step is read whole (that row's value is its key's input)."""
    root, cp = tmp_path / "run", tmp_path / "run" / "checkpoints" / "C"
    sdir = root / "streams" / "s" / "p"
    keyed = [
        {
            "id": f"r{i}",
            "ts": i,
            "key": b"k",
            "value": f"v{i}".encode(),
            "wm": None,
            "key:C": f"k{i}".encode(),
            "interval:C": i % 2,
        }
        for i in range(6)
    ]
    _write_stream_file(sdir / "f0.parquet", keyed[:3])
    _write_stream_file(sdir / "f1.parquet", keyed[3:])
    _write_stream_file(
        sdir / "f2.parquet",
        [
            {
                "id": "abc",
                "ts": 9,
                "key": b"raw",
                "value": b"u",
                "wm": None,
                "key:C": None,
                "interval:C": None,
            },
            keyed[0],
        ],
    )
    _log(cp / "sources" / "0", "0", [(f"file://{sdir}/f{i}.parquet", 0) for i in range(2)])
    _log(cp / "sources" / "0", "1", [(f"file://{sdir}/f2.parquet", 1)])
    (cp / "offsets").mkdir(parents=True)
    (cp / "offsets" / "0").write_text('v1\n{}\n{"logOffset":0}')
    (cp / "offsets" / "1").write_text('v1\n{}\n{"logOffset":1}')
    inputs = (ScannedInput("s", "p", Location.of(str(sdir)).uri),)
    scan = BatchScan(Location.of(str(cp)).uri, inputs, "key:C", "interval:C", 8, values=False)
    table, lazy = scan.records_lazy(0, batch=0)
    assert (
        table.column("id").to_pylist() == ["r0", "r2", "r4"]
        and table.column("value").null_count == 3
    )
    assert lazy is not None and lazy.load().to_pylist() == [b"v0", b"v2", b"v4"]
    assert lazy.ordered(np.array([2, 0, 1])).load().to_pylist() == [b"v4", b"v0", b"v2"]
    assert lazy.fill(table).equals(
        scan.records(0, batch=0)
    )  # the values read as they would have been
    again, nothing_left = scan.records_lazy(
        0, batch=0
    )  # read with their values since: the worker has them
    assert nothing_left is None and again.equals(scan.records(0, batch=0))
    whole, nothing_left = scan.records_lazy(0, batch=1)  # f2 has a row to key here: read whole
    assert nothing_left is None and whole.column("value").to_pylist() == [b"v0"]


def test_a_row_to_key_keeps_its_value_when_a_struct_column_comes_before_the_key_columns(tmp_path):
    """A stream that declares its fields writes them as a struct column before the key
    columns (``_streams.records_table``): the file's rows to key in the step are found in
    the rows read, not in a Parquet column index, so they come with their values."""
    root, cp = tmp_path / "run", tmp_path / "run" / "checkpoints" / "C"
    sdir = root / "streams" / "s" / "p"
    sdir.mkdir(parents=True)
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("ts", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("wm", pa.int64()),
            ("mw_fields", pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.int64())])),
            ("key:C", pa.binary()),
            ("interval:C", pa.int32()),
        ]
    )
    rows = [
        {
            "id": "abc",
            "ts": 1,
            "key": b"raw",
            "value": b"u",
            "wm": None,
            "mw_fields": {"a": 1, "b": "x", "c": 0},
            "key:C": None,
            "interval:C": None,
        },
        {
            "id": "k",
            "ts": 2,
            "key": b"k",
            "value": b"v",
            "wm": None,
            "mw_fields": {"a": 2, "b": "y", "c": 0},
            "key:C": b"kk",
            "interval:C": 1,
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), sdir / "f0.parquet")
    _log(cp / "sources" / "0", "0", [(f"file://{sdir}/f0.parquet", 0)])
    (cp / "offsets").mkdir(parents=True)
    (cp / "offsets" / "0").write_text('v1\n{}\n{"logOffset":0}')
    scan = BatchScan(
        Location.of(str(cp)).uri,
        (ScannedInput("s", "p", Location.of(str(sdir)).uri),),
        "key:C",
        "interval:C",
        8,
        values=False,
    )
    unkeyed, nothing_left = scan.records_lazy(spark_xxhash64("abc") % 8, batch=0)
    assert nothing_left is None and unkeyed.column("value").to_pylist() == [b"u"]


class ColumnarDouble(ColumnarComputation):
    """``_chain.Double`` in columns: each record's ``n`` doubled."""

    def process_batch(self, batch):
        r = batch.records
        batch.produce(
            "doubled", [v["n"] * 2 for v in r["value"]], keys=r["key"], timestamps=r["timestamp"]
        )


@pytest.mark.spark
def test_the_scan_plan_keys_unkeyed_files_and_restarts_with_the_keying_stage_when_needed(
    spark, run_dir
):
    """As the per-record path's test in ``test_keying.py``: input keyed at start, so the
    scan plan reads it; a record whose extractor fails at the producer is dead-lettered by
    the step; a file without key columns that appears later is read by the step as rows
    to key, the batch fails on the rows that belong to another interval, and the query
    restarts with the keying stage (the row plan): every record exactly once."""
    first = [Record(None, {"n": i}, 1_000 + i, f"r{i}") for i in range(10)] + [
        Record(None, {"x": 0}, 1_005, "bad")
    ]
    legacy = [Record(None, {"n": 100 + i}, 1_050 + i, f"old{i}") for i in range(6)]
    rest = [Record(None, {"n": 200 + i}, 1_100 + i, f"s{i}") for i in range(10)]
    t = Topology("midrun")
    t.injector("in", _UnkeyedFileMidRun(run_dir, first, legacy, rest))
    t.computation(ColumnarDouble, name="Double", inputs={"in": by_n}, outputs=["doubled"])
    t.computation(Sum, inputs={"doubled": lambda r: "all"}, outputs=["sums"])
    lines: list[str] = []
    rt = SparkRuntime(
        t,
        run_dir,
        RuntimeSettings(drain=True, intervals=4, poll_ms=50),
        spark=spark,
        log=lines.append,
    )
    rt.start()
    assert [s.stream for s in rt.computations["Double"].scanned] == [
        "in"
    ]  # the scan plan at the start
    rt.run(timeout_s=600)
    # one offset-log entry per source, plus the heartbeats: the markers read the input directory
    # in the same plan node as the rows (the driver pairs offset-log entries with ``sources/<i>``)
    offsets = Path(run_dir) / "checkpoints" / "Double" / "offsets"
    assert {len(p.read_text().splitlines()[2:]) for p in offsets.iterdir() if p.name.isdigit()} == {
        2
    }
    double = rt.computations["Double"]
    assert double._keying_forced and double.keying_stage and double.restart_policy.restarts == 0
    expected = [2 * r.value["n"] for r in first[:-1] + legacy + rest]
    assert sorted(rt.values("doubled")) == sorted(expected)
    assert max(rt.values("sums")) == sum(expected)
    assert [(r.value.record.id, r.value.reason) for r in rt.dead_letters()] == [
        ("bad", "KeyError: 'n'")
    ]


def _doubling(name: str, records: list[Record], batch_size: int, mapping: str) -> Topology:
    """``records`` injected ``batch_size`` a file by two injectors into one stream (two file
    sources of one input), each doubled by :class:`ColumnarDouble` on ``mapping``."""
    t = Topology(name)
    half = len(records) // 2
    t.injector("in", SampleSource(records[:half], batch_size=batch_size), stream="nums")
    t.injector("more", SampleSource(records[half:], batch_size=batch_size), stream="nums")
    t.computation(
        ColumnarDouble,
        name="Double",
        inputs={"nums": by_n},
        outputs=["doubled"],
        options=ComputationOptions(mapping=mapping),
    )
    return t


_ONE_FILE_A_BATCH = RuntimeSettings(drain=True, intervals=4, max_files_per_trigger=1, poll_ms=50)


def _until_first_batch(rt: SparkRuntime) -> None:
    """Start ``rt`` and poll it until ``Double``'s first batch is published."""
    rt.start()
    deadline = time.monotonic() + 300
    while not rt.computations["Double"].metrics["processed"]:
        assert time.monotonic() < deadline
        rt.poll()
        time.sleep(0.05)


@pytest.mark.spark
@pytest.mark.parametrize("mapping", ["default", "arrow"])
@pytest.mark.parametrize(("first", "then"), [("rows", "scan"), ("scan", "rows")])
def test_a_checkpoint_resumes_under_the_other_plan(spark, run_dir, first, then, mapping):
    """A run stopped after its first batches resumes reading its input the other way (rows:
    a query with the keying stage, ``plans/_inputs.py``; or from the batch's files): each
    record doubled once, the sums those of a run that never stopped; on either mapping."""
    records = [Record(None, {"n": i}, 1_000 + i, f"r{i}") for i in range(60)]
    records.insert(30, records[7])  # delivered twice
    topo = partial(_doubling, "replan", records, 15, mapping)
    rt = SparkRuntime(topo(), run_dir, _ONE_FILE_A_BATCH, spark=spark)
    rt.computations["Double"]._keying_forced = first == "rows"
    _until_first_batch(rt)
    rt.stop()
    assert rt.computations["Double"].metrics["processed"] < 60
    rt = SparkRuntime(topo(), run_dir, _ONE_FILE_A_BATCH, spark=spark)
    rt.computations["Double"]._keying_forced = then == "rows"
    rt.run(timeout_s=300)
    assert sorted(rt.values("doubled")) == sorted(2 * i for i in range(60))
    assert rt.computations["Double"].metrics["duplicates"] == 1
    assert bool(rt.computations["Double"].scanned) == (then == "scan")


@pytest.mark.spark
def test_the_arrow_mapping_reads_no_input_rows_in_spark(spark, run_dir):
    """Its tasks find their key intervals in the batch's files (``ArrowPlan.marks_in_tasks``):
    the query's plan keeps the input's file source, reads no column of it and runs no Python
    before the shuffle (the Markers pass); every record is still doubled once."""
    records = [Record(None, {"n": i}, 1_000 + i, f"r{i}") for i in range(40)]
    topo = partial(_doubling, "marks", records, 10, "arrow")
    rt = SparkRuntime(topo(), run_dir, _ONE_FILE_A_BATCH, spark=spark)
    _until_first_batch(rt)
    q = rt.computations["Double"].query._jsq.streamingQuery()
    plan = q.lastExecution().executedPlan().toString()
    rt.stop()
    # three file sources: the heartbeats, read; the input's two, under a filter that is always false
    scans = [line for line in plan.splitlines() if "FileScan" in line]
    inputs = [line for line in scans if "PushedFilters: [AlwaysFalse()]" in line]
    assert len(scans) == 3 and len(inputs) == 2, plan
    assert all("ReadSchema: struct<>" in line for line in inputs), plan
    assert plan.count("MapInArrow") == 1, plan  # the tasks' own: no Markers pass
    rt = SparkRuntime(topo(), run_dir, _ONE_FILE_A_BATCH, spark=spark)
    rt.run(timeout_s=300)
    assert sorted(rt.values("doubled")) == sorted(2 * i for i in range(40))


def _n(r: Record) -> int:
    return r.value["n"]


class FailsOnSeven(ColumnarComputation):
    """Reads no values; its call fails when a key is 7: that key's records are stepped
    one by one and dead-lettered, each with its value."""

    record_columns = ("key", "timestamp")

    def process_batch(self, batch):
        r = batch.records
        if (r["key"].astype(object) == 7).any():
            msg = "seven"
            raise ValueError(msg)
        batch.produce(
            "seen", r["key"].astype(object).tolist(), keys=r["key"], timestamps=r["timestamp"]
        )


@pytest.mark.spark
@pytest.mark.parametrize("mapping", ["default", "arrow"])
def test_a_record_that_fails_in_a_computation_reading_no_values_is_dead_lettered_with_its_value(
    spark, run_dir, mapping
):
    records = [
        Record(None, {"n": i % 10, "payload": f"p{i}"}, 1_000 + i, f"r{i}") for i in range(40)
    ]
    t = Topology("lazy")
    t.injector("in", SampleSource(records, batch_size=20))
    t.computation(
        FailsOnSeven,
        name="F",
        inputs={"in": _n},
        outputs=["seen"],
        options=ComputationOptions(mapping=mapping),
    )
    rt = SparkRuntime(t, run_dir, RuntimeSettings(drain=True, intervals=4, poll_ms=50), spark=spark)
    rt.run(timeout_s=300)
    assert rt.computations["F"].scanned  # the scan plan, its values left in the files
    assert sorted(rt.values("seen")) == sorted(r.value["n"] for r in records if r.value["n"] != 7)
    letters = {r.value.record.id: (r.value.record.value, r.value.reason) for r in rt.dead_letters()}
    assert letters == {r.id: (r.value, "ValueError: seven") for r in records if r.value["n"] == 7}
