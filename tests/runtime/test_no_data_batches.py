"""A query runs no no-data micro-batch unless its timers need one (``_query.py``,
``_session.NO_DATA_BATCHES_OFF``; docs/runtime.md, "No-data batches"): a computation that
handles no timers never; on the interval plans none, since a heartbeat addressed to the key
intervals fires their timers in the batch that reads it ("Heartbeats in the batch that
reads them"). One that set a timer all the same is ticked so its timer fails as it would
with them (``_wire.due_ticks``)."""

from __future__ import annotations

import json
import time

import pytest

from millwheel import Computation, SampleSource, TimerFamily, Topology
from millwheel._topology import ComputationSpec
from millwheel.runtime._fs import Location
from millwheel.runtime._spark_internals import (
    OFFSETS,
    committed_batches,
    interval_state_timeouts,
    offset_log_entries,
)


class Tally(Computation):
    def process_record(self, record):
        n = self.state.get(0) + 1
        self.state.set(n)
        self.produce("tallies", (self.key, n))


class Hooked(Tally):
    def process_timer(self, timer):  # pragma: no cover - never set
        pass


class NoHook(Computation):
    def process_record(self, record):
        self.set_timer("t", record.timestamp + 1)


class Family(Computation):
    close = TimerFamily()

    def process_record(self, record):
        self.close.set(record.timestamp + 1, name="x")

    @close.on_fire
    def _closed(self, name, timer):  # pragma: no cover - not run here
        pass


def _spec(cls):
    from millwheel import ComputationOptions

    return ComputationSpec(cls.__name__, cls, {}, (), ComputationOptions())


def test_which_classes_handle_timers():
    from computations.columnar_windowing import ColumnarWindowCounter

    assert [
        _spec(c).handles_timers for c in (Tally, Hooked, NoHook, Family, ColumnarWindowCounter)
    ] == [False, True, False, True, True]


def _no_data_batches(checkpoint: Location) -> list[int]:
    """Committed batches that read nothing new: their source offsets equal the batch before's."""
    out, before = [], None
    for n in sorted(committed_batches(checkpoint)):
        text = checkpoint.child(OFFSETS, str(n)).read_text() or ""
        sources = json.dumps(offset_log_entries(text))
        if sources == before:
            out.append(n)
        before = sources
    return out


def _poll_until(rt, done, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s}s: {rt.status()}"
        rt.poll()
        time.sleep(rt.settings.poll_ms / 1000)


@pytest.mark.spark
def test_a_timerless_query_runs_no_no_data_batch_and_a_forgotten_hook_still_fails(tmp_path, spark):
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    events = [{"k": f"k{i % 3}", "ts": 1_000 + 100 * i} for i in range(30)]
    t = Topology("timerless")
    t.injector("events", SampleSource(events, timestamp="ts", batch_size=10))
    for cls in (Tally, Hooked, NoHook):
        outputs = ["tallies"] if cls is not NoHook else []
        t.computation(cls, inputs={"events": lambda r: r.value["k"]}, outputs=outputs)
    # the per-key plan's timers wait for Spark's watermark: it keeps no-data batches
    rt = SparkRuntime(
        t,
        str(tmp_path / "run"),
        RuntimeSettings(drain=True, intervals=2, state_layout="keys"),
        spark=spark,
    )
    hooked, tally = rt.computations["Hooked"].checkpoint, rt.computations["Tally"].checkpoint
    rt.start()
    try:
        _poll_until(rt, rt.drained, "the run to drain")
        # the batch that brought the last heartbeat moved Spark's watermark: a query that keeps
        # no-data batches runs one at its next trigger (whether one ran before, while the
        # injectors still wrote, depends on timing), so the driver polls on until it has
        _poll_until(rt, lambda: _no_data_batches(hooked), "Hooked's no-data batch")
    finally:
        rt.stop()
    # the same answer either way; only the batches differ
    tallies = sorted(tuple(v) for v in rt.values("tallies"))
    assert tallies == sorted(2 * [(f"k{j}", n) for j in range(3) for n in range(1, 11)])
    # a class with process_timer got the batch that only moves the watermark (above); a
    # timerless one, over the same time, did not
    assert _no_data_batches(hooked)
    assert _no_data_batches(tally) == []
    # NoHook set timers without process_timer: ticked once the watermark passed them, they
    # fail into dead letters and the run drains (the harness: tests/test_timers.py)
    dead = [d.value for d in rt.dead_letters() if d.value.stage == "process_timer"]
    assert len(dead) == 3 and all("does not override process_timer" in d.reason for d in dead)


@pytest.mark.spark
def test_on_the_interval_plans_timers_fire_in_the_batch_that_reads_the_heartbeat(
    tmp_path, spark, second_counts
):
    # each second's count is a low-watermark timer; the last ones are due only at the end of
    # input (+inf). Fired in the batch that reads the heartbeat at +inf, no batch ever runs
    # under Spark's watermark at +inf: before, a no-data batch ran there to fire them
    from collections import Counter

    from computations.columnar_windowing import ColumnarWindowCounter
    from millwheel import MAX_TIMESTAMP, Record
    from millwheel.runtime import RuntimeSettings, SparkRuntime
    from millwheel.runtime._spark_internals import offset_log_metadata
    from millwheel.runtime._wire import to_spark

    records = [Record(None, {"key": f"k{i % 3}"}, 250 * i, f"r{i}") for i in range(40)]
    expected = Counter((r.value["key"], r.timestamp // 1_000 * 1_000) for r in records)
    columnar = Topology("window-counts")  # the columnar plan: the same counts
    columnar.injector("logs", SampleSource(records, batch_size=10), stream="events")
    columnar.computation(
        ColumnarWindowCounter,
        inputs={"events": lambda r: r.value["key"]},
        outputs=["window_counts"],
        params={"trailing_empty": 0},
    )
    runs = [
        (second_counts(SampleSource(records, batch_size=10)), "counts", "second"),
        (columnar, "window_counts", "window_start"),
    ]
    for n, (topology, stream, start) in enumerate(runs):
        rt = SparkRuntime(
            topology,
            str(tmp_path / f"run{n}"),
            RuntimeSettings(drain=True, intervals=2),
            spark=spark,
        )
        rt.run(timeout_s=300)
        got = Counter()
        for v in rt.values(stream):
            got[(v["key"], v[start])] += v["count"]
        assert got == expected
        cp = next(iter(rt.computations.values())).checkpoint
        assert _no_data_batches(cp) == []
        marks = [
            (offset_log_metadata(cp.child(OFFSETS, str(b)).read_text() or "") or {}).get(
                "batchWatermarkMs", 0
            )
            for b in committed_batches(cp)
        ]
        assert max(marks) < to_spark(MAX_TIMESTAMP), marks
        # and without Spark's timeouts: its state rows have no timeout column
        assert interval_state_timeouts(cp) is False


@pytest.mark.spark
@pytest.mark.parametrize("plan", ["intervals", "columnar"])
def test_state_written_with_sparks_timeouts_resumes_with_them_and_its_timers_fire(
    tmp_path, spark, second_counts, monkeypatch, plan
):
    # a run started before the interval plans dropped Spark's timeouts: its state rows carry
    # the timeout column, and Spark refuses another setting over them. Stopped after its
    # first batch and resumed, it keeps the setting, and every count is out exactly once
    from collections import Counter

    from computations.columnar_windowing import ColumnarWindowCounter
    from millwheel import Record
    from millwheel.runtime import RuntimeSettings, SparkRuntime
    from millwheel.runtime.plans.intervals import IntervalRowsPlan

    records = [Record(None, {"key": f"k{i % 3}"}, 250 * i, f"r{i}") for i in range(60)]
    expected = Counter((r.value["key"], r.timestamp // 1_000 * 1_000) for r in records)

    def topology():
        source = SampleSource(records, batch_size=10)
        if plan == "intervals":
            return second_counts(source), "counts", "second"
        t = Topology("window-counts")
        t.injector("logs", source, stream="events")
        t.computation(
            ColumnarWindowCounter,
            inputs={"events": lambda r: r.value["key"]},
            outputs=["window_counts"],
            params={"trailing_empty": 0},
        )
        return t, "window_counts", "window_start"

    settings = RuntimeSettings(drain=True, intervals=2, max_files_per_trigger=1, poll_ms=50)
    with monkeypatch.context() as m:
        m.setattr(IntervalRowsPlan, "timeouts", lambda self: True)  # as the code before
        rt = SparkRuntime(topology()[0], str(tmp_path), settings, spark=spark)
        rt.start()
        query = next(iter(rt.computations.values()))
        _poll_until(rt, lambda: query.metrics["processed"], "first batch", 300)
        rt.stop()
    assert interval_state_timeouts(query.checkpoint) is True
    t, stream, start = topology()
    rt = SparkRuntime(t, str(tmp_path), settings, spark=spark)
    rt.run(timeout_s=300)
    got = Counter()
    for v in rt.values(stream):
        got[(v["key"], v[start])] += v["count"]
    assert got == expected
    assert interval_state_timeouts(next(iter(rt.computations.values())).checkpoint) is True
