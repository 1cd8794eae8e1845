"""The Arrow mapping's task (``millwheel/runtime/plans/arrow.py``) in process, without Spark: a key
interval's store read from the file the manifest names or from the worker's cache of it, a
second run of a batch writing its own files, and the productions the same either way."""

from __future__ import annotations

import types

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from computations.columnar_windowing import ColumnarWindowCounter
from computations.windowing import WindowCounter
from millwheel import (
    ColumnarComputation,
    ComputationOptions,
    SampleSource,
    TimeDomain,
    Topology,
)
from millwheel._codec import decode_value, encode_value
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._errors import MillwheelError, RunError, TopologyError
from millwheel._record import encode_key
from millwheel.runtime._colfiles import ColumnarFiles, Manifest
from millwheel.runtime._columnar import ColumnarIntervalStep
from millwheel.runtime._fs import Location
from millwheel.runtime._wire import SUMMARY_STREAM, IntervalSummary
from millwheel.runtime.plans import PlanKind, plan_for
from millwheel.runtime.plans import arrow as _arrowmap
from millwheel.runtime.plans.arrow import BatchPlan, IntervalTask, out_arrow_schema

T0 = 1_767_261_600_000


def _step(
    groups: list[int] | None = None, cls: type = ColumnarWindowCounter, out: str = "window_counts"
) -> ColumnarIntervalStep:
    t = Topology("t")
    t.injector("q", SampleSource([]))
    t.computation(
        cls,
        name="C",
        inputs={"q": lambda r: r.value},
        outputs=[out],
        options=ComputationOptions(mapping="arrow"),
        params={"window_ms": 1_000, "trailing_empty": 0} if cls is ColumnarWindowCounter else {},
    )
    return ColumnarIntervalStep(t.validate().computations["C"], groups=groups or [0, 1])


def _rows(ids: list[str], keys: list[str], ts: list[int]) -> pa.RecordBatch:
    n = len(ids)
    return pa.RecordBatch.from_pydict(
        {
            "group": pa.array([0] * n, pa.int32()),
            "kind": pa.array([0] * n, pa.int32()),
            "key": pa.array([encode_key(k) for k in keys], pa.binary()),
            "id": pa.array(ids, pa.string()),
            "ts": pa.array(ts, pa.int64()),
            "value": pa.array([encode_value(k) for k in keys], pa.binary()),
            "wm": pa.nulls(n, pa.int64()),
            "stream": pa.array(["q"] * n, pa.string()),
            "src": pa.array(["f0"] * n, pa.string()),
            "row": pa.array(range(n), pa.int64()),
            "now": pa.nulls(n, pa.int64()),
        }
    )


def _run(
    step,
    files: ColumnarFiles,
    manifest: Manifest,
    batch: int,
    token: str,
    lw: int,
    rows: list[pa.RecordBatch],
    *,
    now: int = 0,
    ticks: dict[int, int] | None = None,
    rowless: bool = False,
    stream: str = "window_counts",
):
    """One task of batch ``batch`` over ``rows`` (the only partition); the manifest after it,
    its productions to ``stream`` and its summaries."""
    plan = BatchPlan(
        batch,
        token,
        lw,
        now,
        manifest.low_watermark,
        1,
        dict(manifest.files),
        tuple(manifest.due(lw, now)),
        files.loc.uri,
        ticks or {},
    )
    out = pa.Table.from_batches(
        list(IntervalTask(step, plan, rowless=rowless)(iter(rows))), schema=out_arrow_schema(step)
    ).to_pylist()
    reports, summaries = [], []
    for r in out:
        if r["stream"] == SUMMARY_STREAM:
            s = IntervalSummary.decode(r["value"])
            summaries.append(s)
            reports.append((s.interval, r["id"], s.next_low_watermark_timer, s.next_wall_timer))
    prods = sorted((r["id"], r["ts"], r["value"]) for r in out if r["stream"] == stream)
    return manifest.after(batch, lw, reports), prods, summaries


def test_a_replayed_batch_writes_its_own_version_and_the_next_batch_reads_the_one_named(tmp_path):
    step, files = _step(), ColumnarFiles(Location.of(str(tmp_path / "c")))
    first = [_rows(["a", "b", "c", "a"], ["x", "y", "x", "x"], [T0, T0 + 10, T0 + 20, T0])]
    m0, p0, _ = _run(step, files, Manifest(), 0, "one", T0 - 1, first)
    m0_again, p0_again, _ = _run(
        step, files, Manifest(), 0, "two", T0 - 1, first
    )  # the batch run again (a replay)
    assert p0 == p0_again == []  # nothing due yet
    assert m0.files[0] != m0_again.files[0] and sorted(files.interval_dir(0).list()) == sorted(
        [m0.files[0], m0_again.files[0]]
    )
    second = [_rows(["a", "d"], ["x", "y"], [T0 + 30, T0 + 90_000])]  # "a" again: a duplicate
    # from the worker's cache (it wrote the version the manifest names: the file is not read) ...
    kept = files.read_store(0, m0_again.files[0])
    files.interval_dir(0).child(m0_again.files[0]).delete()
    _, cached, _ = _run(step, files, m0_again, 1, "three", T0 + 60_000, second)
    # ... and from the file, with the cache holding another version
    files.write_store(0, m0_again.files[0], kept)
    assert _arrowmap._CACHE[(files.loc.uri, 0)][0] != m0_again.files[0]
    _, from_file, _ = _run(step, files, m0_again, 1, "four", T0 + 60_000, second)
    assert cached == from_file
    counts = sorted((v["key"], v["count"]) for v in (decode_value(p[2]) for p in cached))
    assert counts == [
        ("x", 2),
        ("y", 1),
    ]  # window T0: x twice (a, c), y once (b); the repeated "a" dropped


class _FailsOnId(ColumnarComputation):
    """Reads keys and ids only (no values); a batch holding the id ``boom`` raises."""

    record_columns = ("key", "id")

    def process_batch(self, batch):
        if "boom" in set(batch.records["id"]):
            msg = "boom"
            raise ValueError(msg)


def test_a_record_of_the_row_plan_dead_lettered_without_its_value_when_the_computation_reads_none(
    tmp_path,
):
    """On the row plan (an input read as rows) the query keeps values in the JVM for a
    computation that reads none (``ArrowMapping.values``): its dead-lettered record has the
    rest, and no value. (On the scan plan it has its value: ``tests/runtime/test_scan.py``.)"""
    t = Topology("t")
    t.injector("q", SampleSource([]))
    t.computation(
        _FailsOnId,
        name="F",
        inputs={"q": lambda r: r.value},
        options=ComputationOptions(mapping="arrow"),
    )
    step = ColumnarIntervalStep(t.validate().computations["F"], groups=[0])
    rows = _rows(["ok", "boom"], ["x", "y"], [T0, T0 + 1]).set_column(
        5, "value", pa.nulls(2, pa.binary())
    )
    files = ColumnarFiles(Location.of(str(tmp_path / "c")))
    plan = BatchPlan(0, "t", T0 - 1, 0, T0 - 1, 1, {}, (), files.loc.uri)
    out = pa.Table.from_batches(
        list(IntervalTask(step, plan)(iter([rows]))), schema=out_arrow_schema(step)
    ).to_pylist()
    letters = [decode_value(r["value"]) for r in out if r["stream"] == DEAD_LETTER_STREAM]
    assert [(d.record.id, d.record.key, d.record.value, d.reason) for d in letters] == [
        ("boom", "y", None, "ValueError: boom")
    ]


class _Conf(dict):
    def get(self, key, default=None):
        return super().get(key, default)


class _FakeSpark:
    """What ``plans.plan_for`` asks of a session: its shuffle partitions and speculation."""

    def __init__(self, speculation: str = "false") -> None:
        self.conf = _Conf({"spark.sql.shuffle.partitions": "2"})
        conf = _Conf({"spark.speculation": speculation})
        self.sparkContext = types.SimpleNamespace(getConf=lambda: conf)


def _query(
    tmp_path,
    mapping: str,
    *,
    speculation: str = "false",
    layout: str = "intervals",
    own: bool = False,
):
    from millwheel.runtime import RuntimeSettings
    from millwheel.runtime._layout import Layout

    t = Topology("t")
    t.injector("q", SampleSource([]))
    t.computation(
        _FailsOnId,
        name="F",
        inputs={"q": lambda r: r.value},
        options=ComputationOptions(mapping=mapping),
    )
    root = Location.of(str(tmp_path / "run"))
    root.mkdirs()
    rt = types.SimpleNamespace(
        root=root,
        spark=_FakeSpark(speculation),
        settings=RuntimeSettings(state_layout=layout),
        keyer=None,
        pipeline_id="p",
        layout=lambda name: Layout(2, (0, 1), own=own, state_layout=layout),
    )
    return types.SimpleNamespace(
        spec=t.validate().computations["F"],
        rt=rt,
        name="F",
        checkpoint=root.child("checkpoints", "F"),
        groups=[0, 1],
        state_layout=layout,
    )


def _plan(query):
    return plan_for(query, query.rt.layout(query.name))


def test_the_arrow_mapping_is_refused_where_it_cannot_keep_its_promises(tmp_path):
    assert _plan(_query(tmp_path / "a", "default")).kind is PlanKind.COLUMNAR
    arrow = _plan(_query(tmp_path / "e", "arrow"))
    assert arrow.kind is PlanKind.ARROW and arrow.partitions == 2  # the session's, pinned
    with pytest.raises(MillwheelError, match="spark.speculation=true"):
        _plan(_query(tmp_path / "b", "arrow", speculation="true"))
    with pytest.raises(MillwheelError, match="state_layout='intervals'"):
        _plan(_query(tmp_path / "c", "arrow", layout="keys"))
    with pytest.raises(MillwheelError, match="rescaled"):
        _plan(_query(tmp_path / "d", "arrow", own=True))
    with pytest.raises(TopologyError, match="is for columnar computations"):
        Topology("t").computation(
            WindowCounter, inputs={"q": None}, options=ComputationOptions(mapping="arrow")
        )
    with pytest.raises(TopologyError, match="mapping must be one of"):
        ComputationOptions(mapping="pandas")


def test_records_read_from_arrow_are_the_records_read_through_pandas():
    """The task's Arrow reading (``arrow_input``) gives the runner what the pandas reading
    (``_input``, the default mapping's) gives: the same send order (sender watermark, file,
    row), keys, ids, streams, values and arrival watermarks."""
    import random

    import numpy as np

    from millwheel.runtime._columnar import _input, arrow_input, plain_records

    rng = random.Random(3)
    n = 400
    rows = {
        "group": [0] * n,
        "kind": [0] * n,
        "key": [encode_key(f"k{rng.randrange(20)}") for _ in range(n)],
        "id": [f"r{i}" for i in range(n)],
        "ts": [T0 + rng.randrange(10_000) for _ in range(n)],
        "value": [encode_value(i) for i in range(n)],
        "wm": [rng.choice([None, T0, T0 + 5_000]) for _ in range(n)],
        "stream": [rng.choice(["q", "p", DEAD_LETTER_STREAM]) for _ in range(n)],
        "src": [rng.choice([None, "f2", "f1", "f10"]) for _ in range(n)],
        "row": [rng.randrange(50) for _ in range(n)],
        "now": [None] * n,
    }
    types_ = {
        "group": pa.int32(),
        "kind": pa.int32(),
        "key": pa.binary(),
        "value": pa.binary(),
        "id": pa.string(),
        "stream": pa.string(),
        "src": pa.string(),
    }
    table = pa.table({c: pa.array(v, types_.get(c, pa.int64())) for c, v in rows.items()})
    assert plain_records(table) and not plain_records(
        table.set_column(1, "kind", pa.array([0] * (n - 1) + [None], pa.int32()))
    )
    a, b = arrow_input(table), _input([table.to_pandas()])
    assert a.kbs == b.kbs and a.uniques == b.uniques and a.codes.tolist() == b.codes.tolist()
    assert a.ids.to_pylist() == b.ids.to_pylist() and a.ts.tolist() == b.ts.tolist()
    assert a.streams_at(list(range(n))) == b.streams_at(list(range(n))) and a.values_at(
        list(range(n))
    ) == b.values_at(list(range(n)))
    assert a.arrival_watermarks(-1).tolist() == b.arrival_watermarks(-1).tolist()
    assert (
        a.not_stream(DEAD_LETTER_STREAM) == b.not_stream(DEAD_LETTER_STREAM)
    ).all() and not np.all(a.not_stream(DEAD_LETTER_STREAM))
    assert (
        a.ts.tolist() != sorted(a.ts.tolist()) and a.ids.to_pylist() != rows["id"]
    )  # the data was out of send order


def test_a_batch_plan_reaches_its_tasks_as_text_and_a_task_without_one_fails(tmp_path, monkeypatch):
    """The plan a batch's tasks read from their context (``BatchPlan.of_task``) is the one
    the sink encoded, intervals and due timers included; a task whose job carries no plan,
    or another batch's, raises instead of running the intervals on a stale one."""
    plan = BatchPlan(
        12, "tok", T0, T0 + 5, T0 - 1, 2, {0: "s-1", 7: "s-2"}, (3, 7), str(tmp_path), {3: T0 + 9}
    )
    assert BatchPlan.decode(plan.encode()) == plan
    props: dict[str, str | None] = {_arrowmap.PLAN_PROPERTY: plan.encode()}
    batch = {"id": 12}
    monkeypatch.setattr(_arrowmap, "task_property", lambda name: props.get(name))
    monkeypatch.setattr(_arrowmap, "task_batch_id", lambda: batch["id"])
    assert BatchPlan.of_task() == plan
    batch["id"] = 13
    with pytest.raises(RunError, match="micro-batch 13 was given the plan of batch 12"):
        BatchPlan.of_task()
    batch["id"] = None  # a job not of the stream's thread: no batch id, whatever its plan
    with pytest.raises(RunError, match="found no micro-batch id"):
        BatchPlan.of_task()
    props.clear()
    batch["id"] = 12
    with pytest.raises(RunError, match="found no batch plan"):
        list(IntervalTask(_step())(iter([])))


@pytest.mark.parametrize("jump", [10**12, "final"])
def test_records_arriving_as_the_watermark_jumps_past_their_ids_are_forgotten(tmp_path, jump):
    """The columnar twin of ``test_interval.py``'s: a batch run under a watermark past its
    records' id horizon, whose records arrived under an older one, reports it (``judged``),
    which makes its interval due for a tick (``passed_since_run``), and the tick's run, with
    no records, forgets the keys; at +inf the batch forgets them itself."""
    from millwheel import MAX_TIMESTAMP
    from millwheel.runtime._wire import passed_since_run

    step, files = _step(), ColumnarFiles(Location.of(str(tmp_path / "c")))
    lw = MAX_TIMESTAMP if jump == "final" else T0 + jump

    def run(manifest: Manifest, batch: int, rows: list[pa.RecordBatch]):
        after, _, (summary,) = _run(step, files, manifest, batch, f"t{batch}", lw, rows)
        return after, summary

    before = Manifest().after(0, T0 - 1, [])  # the watermark the records arrive under
    first_manifest, first = run(before, 1, [_rows(["a", "b"], ["x", "y"], [T0, T0 + 10])])
    if jump == "final":
        assert first.low_watermark == lw and first.keys == 0 and first.judged is None
        assert not passed_since_run(first, lw)
        return
    assert first.low_watermark == lw and first.judged == T0 - 1 and first.keys == 2
    assert passed_since_run(first, lw)
    _, tick = run(first_manifest, 2, [])  # the interval due: it runs without records
    assert tick.keys == 0 and tick.judged is None
    assert not passed_since_run(tick, lw)


def _scanned_batch(tmp_path, *files: dict[int, list[str]], intervals: int = 2):
    """A query checkpoint whose batch 0 read the given files of stream ``q`` (each: the
    records of each key interval named, keyed for ``C`` by their producer), and the scan
    that reads them."""
    from millwheel.runtime._scan import BatchScan, ScannedInput

    from .test_scan import _log, _write_stream_file

    root, cp = tmp_path / "run", tmp_path / "run" / "checkpoints" / "C"
    sdir = root / "streams" / "q" / "p"
    for f, keys_by_interval in enumerate(files):
        rows = [
            {
                "id": f"{k}-{f}-{n}",
                "ts": T0 + n,
                "key": encode_key(k),
                "value": encode_value(k),
                "wm": None,
                "key:C": encode_key(k),
                "interval:C": i,
            }
            for i, keys in keys_by_interval.items()
            for n, k in enumerate(keys)
        ]
        _write_stream_file(sdir / f"q-{f}.parquet", rows)
    _log(
        cp / "sources" / "0",
        "0",
        [(f"file://{sdir}/q-{f}.parquet", 0) for f in range(len(files))],
    )
    (cp / "offsets").mkdir(parents=True)
    (cp / "offsets" / "0").write_text('v1\n{}\n{"logOffset":0}')
    return BatchScan(
        Location.of(str(cp)).uri,
        (ScannedInput("q", "p", Location.of(str(sdir)).uri),),
        "key:C",
        "interval:C",
        intervals,
    )


def _task_in(monkeypatch, partition: int) -> None:
    import pyspark

    ctx = types.SimpleNamespace(
        partitionId=lambda: partition, attemptNumber=lambda: 0, getLocalProperty=lambda name: None
    )
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: ctx))


def _summaries(
    step, plan: BatchPlan, rows: tuple[pa.RecordBatch, ...] = ()
) -> dict[int, IntervalSummary]:
    """The summary row of each key interval one task of ``plan`` ran, given ``rows`` from Spark."""
    out = pa.Table.from_batches(
        list(IntervalTask(step, plan)(iter(rows))), schema=out_arrow_schema(step)
    ).to_pylist()
    return {
        (s := IntervalSummary.decode(r["value"])).interval: s
        for r in out
        if r["stream"] == SUMMARY_STREAM
    }


def test_a_task_finds_its_own_intervals_in_the_batchs_files(tmp_path, monkeypatch):
    """``ArrowPlan.marks_in_tasks``: Spark hands a task no marker rows; each task runs the key
    intervals of its partition that have records in the batch's files (and only those), with
    the output a marker row would have given."""
    from millwheel.runtime._wire import spark_hash_int

    files = ColumnarFiles(Location.of(str(tmp_path / "c")))
    step = _step()
    step.scan = _scanned_batch(tmp_path, {0: ["x", "x", "z"], 1: ["y"]})

    def run(partitions: int, *rows: pa.RecordBatch) -> dict[int, tuple]:
        plan = BatchPlan(0, "t", T0 - 1, 0, T0 - 1, partitions, {}, (), files.loc.uri)
        return {
            i: (s.keys, s.next_low_watermark_timer, s.metrics.get("processed"))
            for i, s in _summaries(step, plan, rows).items()
        }

    _task_in(monkeypatch, 0)
    found = run(1)
    assert set(found) == {0, 1}
    assert found[0][0] == 2 and found[1][0] == 1  # keys x, z; y
    # the union's columns: markers carry group and scan only
    blank = _rows(["m", "m"], ["m", "m"], [T0, T0])
    marker = pa.RecordBatch.from_arrays(
        [pa.array([0, 1], pa.int32())]
        + [pa.nulls(2, f.type) for f in blank.schema if f.name != "group"]
        + [pa.array([True, True])],
        names=[*blank.schema.names, "scan"],
    )
    assert run(1, marker) == found  # what marker rows from Spark would have run
    owner = {i: spark_hash_int(i) % 3 for i in (0, 1)}
    assert owner == {0: 0, 1: 1}  # Spark's hash partitioning: partition 2 holds neither
    for partition in (0, 1, 2):
        _task_in(monkeypatch, partition)
        got = run(3)
        assert set(got) == {i for i, p in owner.items() if p == partition}
        assert got == {i: found[i] for i in got}


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    intervals=st.integers(1, 6),
    partitions=st.integers(1, 4),
    files=st.lists(
        st.lists(st.tuples(st.integers(0, 5), st.sampled_from("abcdefgh")), max_size=12),
        min_size=1,
        max_size=4,
    ),
    due=st.sets(st.integers(0, 5)),
)
def test_each_interval_with_records_or_due_runs_once_in_its_own_partition_with_all_its_records(
    monkeypatch, intervals, partitions, files, due
):
    """The invariant ``marks_in_tasks`` rests on: over the tasks of one batch, a key interval
    runs exactly once, in the partition Spark's hash partitioning gives its group, if and only
    if the batch's files hold records of it or it has a timer due; and it reads every one of its
    records, whichever file holds them. Groups are dealt out of order, as a layout may."""
    import tempfile
    from pathlib import Path

    from millwheel.runtime._wire import spark_hash_int

    groups = [(3 * i + 1) % 7 + 10 * i for i in range(intervals)]
    by_file = []
    for rows in files:
        per: dict[int, list[str]] = {}
        for i, key in rows:
            per.setdefault(i % intervals, []).append(key)
        by_file.append(per)
    want = {i: sum(len(f.get(i, [])) for f in by_file) for i in range(intervals)}
    due = tuple(sorted(i % intervals for i in due))
    with tempfile.TemporaryDirectory() as d:
        step = _step(groups)
        step.scan = _scanned_batch(Path(d), *by_file, intervals=intervals)
        store = ColumnarFiles(Location.of(f"{d}/c"))
        ran: dict[int, int] = {}
        for partition in range(partitions):
            _task_in(monkeypatch, partition)
            plan = BatchPlan(
                0, f"t{partition}", T0 - 1, 0, T0 - 1, partitions, {}, due, store.loc.uri
            )
            for i, summary in _summaries(step, plan).items():
                assert i not in ran, f"interval {i} ran twice"
                assert spark_hash_int(groups[i]) % partitions == partition
                ran[i] = summary.metrics.get("records_in", 0)
    assert set(ran) == {i for i, n in want.items() if n} | set(due)
    assert ran == {i: want[i] for i in ran}


def test_a_record_keyed_for_an_interval_the_layout_lacks_fails_its_batch(tmp_path, monkeypatch):
    """As a row of no group does on a plan that scans its inputs in Spark: the task raises,
    naming the intervals, rather than leave the records unread."""
    step = _step()
    step.scan = _scanned_batch(tmp_path, {0: ["x"], 5: ["y"]})
    _task_in(monkeypatch, 0)
    plan = BatchPlan(0, "t", T0 - 1, 0, T0 - 1, 1, {}, (), str(tmp_path / "c"))
    with pytest.raises(RunError, match=r"key intervals \[5\], outside this run's 2"):
        _summaries(step, plan)


class Remind(ColumnarComputation):
    """Sets each key's wall-time timer 500 ms after the batch's wall time; its firing says when it ran."""

    def process_batch(self, batch):
        keys = batch.records["key"].unique()
        batch.set_timers(
            keys, ["remind"] * len(keys), [batch.now + 500] * len(keys), TimeDomain.WALL_TIME
        )

    def process_timers(self, batch, timers):
        batch.produce(
            "reminded", [batch.now] * len(timers), keys=timers["key"], timestamps=[T0] * len(timers)
        )


def test_a_rowless_task_runs_the_intervals_its_plan_ticks_at_the_ticks_time(tmp_path, monkeypatch):
    """``ArrowMapping.rowless``: no row reaches the task (its partition's one placeholder row
    carries nothing), so the wall ticks of the batch's heartbeat files come in the plan: a
    ticked interval of the task's partition runs, at the tick's time when it is later than
    the batch's, as a tick row would have made it (``IntervalBatch.take_ticks``)."""
    step = _step(cls=Remind, out="reminded")
    step.scan = _scanned_batch(tmp_path, {0: ["x"], 1: ["y"]})
    files = ColumnarFiles(Location.of(str(tmp_path / "c")))
    _task_in(monkeypatch, 0)
    placeholder = pa.RecordBatch.from_pydict({"id": pa.array([0], pa.int64())})

    def run(batch: int, manifest: Manifest, now: int, ticks: dict[int, int]):
        after, prods, summaries = _run(
            step,
            files,
            manifest,
            batch,
            f"t{batch}",
            T0 - 1,
            [placeholder],
            now=now,
            ticks=ticks,
            rowless=True,
            stream="reminded",
        )
        return after, {s.interval for s in summaries}, sorted(decode_value(v) for *_, v in prods)

    m, ran, fired = run(0, Manifest(), T0, {})
    assert ran == {0, 1} and fired == []  # the batch's files hold both intervals' records
    offsets = tmp_path / "run" / "checkpoints" / "C" / "offsets"
    for later in ("1", "2"):  # batches of heartbeat files only: no input file past batch 0's
        (offsets / later).write_text((offsets / "0").read_text())
    assert run(1, m, T0 + 100, {})[1:] == (set(), [])  # no timer due, no tick: nothing runs
    m2, ran, fired = run(1, m, T0 + 100, {1: T0 + 600})
    assert ran == {1} and fired == [T0 + 600]  # y's, at the tick's time, not the batch's
    assert run(2, m2, T0 + 700, {})[1:] == ({0}, [T0 + 700])  # x's timer, due at the batch's


class _Consumed:
    """The part of ``ConsumedFiles`` the driver's heartbeat reading uses: each heartbeat file's
    (source, log entry), batch ``B`` reading log entry ``B`` of source 0."""

    def __init__(self, files: dict[str, int]) -> None:
        self.heartbeat_files = {name: (0, entry) for name, entry in files.items()}
        self.forgotten: set[str] = set()

    def refresh(self) -> None:
        pass

    def log_offsets(self, batch: int) -> dict[int, int]:
        return {0: batch}

    def forget(self, stream, producer, names) -> None:
        self.forgotten |= set(names)


def test_the_driver_reads_a_batchs_watermark_ticks_and_whether_its_tasks_need_its_rows(tmp_path):
    """``ArrowMapping._heartbeats``: over the heartbeat files batch 5 reads, the newest watermark
    (rows of interval -1, whatever else the file holds), each interval's newest tick (none for an
    interval the layout lacks), and whether a file holds rows only the tasks can apply (a state
    load's ``INSTALL`` rows, a watermark addressed to an interval): then the batch runs its
    rows, not :attr:`ArrowMapping.rowless`. Files of earlier batches are not read, and forgotten."""
    import pyarrow.parquet as pq

    from millwheel.runtime._heartbeats import HB_FILE_SCHEMA
    from millwheel.runtime._wire import to_spark

    def hb(name: str, rows: list[tuple], **extra: pa.Array) -> None:
        cols = {
            "interval": pa.array([r[0] for r in rows], pa.int32()),
            "wm": pa.array([r[1] for r in rows], pa.int64()),
            "now": pa.array([r[2] for r in rows], pa.int64()),
            "upto": pa.nulls(len(rows), pa.int64()),
        }
        schema = HB_FILE_SCHEMA if not extra else None
        pq.write_table(pa.table({**cols, **extra}, schema=schema), tmp_path / name)

    mapping = object.__new__(_arrowmap.ArrowMapping)
    mapping.heartbeats = Location.of(str(tmp_path))
    mapping.query = types.SimpleNamespace(intervals=4)
    hb("old.parquet", [(-1, to_spark(T0 + 50), None)])  # read by batch 4
    hb("a.parquet", [(-1, to_spark(T0 + 5), None), (2, None, T0 + 9), (9, None, T0 + 10)])
    hb("b.parquet", [(2, None, T0 + 3), (1, None, T0 + 4)])
    mapping.consumed = _Consumed({"old.parquet": 4, "a.parquet": 5, "b.parquet": 5})
    assert mapping._heartbeats(5) == (T0 + 5, {2: T0 + 9, 1: T0 + 4}, False)
    assert mapping.consumed.forgotten == {"old.parquet"}
    hb(
        "load.parquet",
        [(-1, to_spark(T0 + 7), None), (None, None, None)],
        kind=pa.array([None, 3], pa.int32()),
    )
    mapping.consumed = _Consumed({"a.parquet": 5, "load.parquet": 5})
    assert mapping._heartbeats(5) == (T0 + 7, {2: T0 + 9}, True)
    hb("addressed.parquet", [(3, to_spark(T0 + 8), None)])
    mapping.consumed = _Consumed({"addressed.parquet": 5})
    assert mapping._heartbeats(5)[2] is True
