"""A driver can run part of a topology (``RuntimeSettings.only``): how a computation joins a
running topology without restarting the others. No Spark needed to check the wiring."""

from __future__ import annotations

import sys

import pytest

from millwheel import Computation, MillwheelError, SampleSource, Topology
from millwheel.runtime import RuntimeSettings, SparkRuntime

# Spark's Python workers cannot import this test module: ship its classes by value
pytest.importorskip("pyspark").cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Echo(Computation):
    def process_record(self, record):
        self.produce("out", record.value)


class Sink(Computation):
    def process_record(self, record):
        pass


def _topology():
    t = Topology("partial")
    t.injector("events", SampleSource([{"ts": 1}], timestamp="ts"))
    t.computation(Echo, inputs=["events"], outputs=["out"])
    t.computation(Sink, inputs=["out"], name="Late")
    return t


def test_only_runs_the_named_pieces_and_reads_the_rest_from_the_shared_directories(tmp_path):
    rt = SparkRuntime(_topology(), str(tmp_path), RuntimeSettings(only=("Late",)), spark=object())
    assert list(rt.computations) == ["Late"] and rt.injectors == {}
    assert rt.computations["Late"].inputs == [("out", "Echo")]  # Echo's directory, run elsewhere
    with pytest.raises(MillwheelError, match="Lat"):
        SparkRuntime(_topology(), str(tmp_path), RuntimeSettings(only=("Lat",)), spark=object())


@pytest.mark.spark
def test_a_computation_added_to_a_running_topology_catches_up(tmp_path, spark):
    from millwheel import Record
    from watermark_authority.client import InProcessWatermarkClient

    events = [Record(None, {"n": i}, 1_000 + i, f"e{i}") for i in range(300)]
    first = Topology("partial")
    first.injector("events", SampleSource(events, batch_size=100))
    first.computation(Echo, inputs={"events": lambda r: r.value["n"] % 5}, outputs=["out"])
    grown = Topology("partial")
    grown.injector("events", SampleSource(events, batch_size=100))
    grown.computation(Echo, inputs={"events": lambda r: r.value["n"] % 5}, outputs=["out"])
    grown.computation(Sink, inputs={"out": lambda r: r.value["n"] % 7}, name="Late")

    wm = InProcessWatermarkClient()  # in production: the authority service both drivers use
    settings = RuntimeSettings(intervals=2, poll_ms=50)
    running = SparkRuntime(first, str(tmp_path), settings, spark=spark, watermarks=wm)
    running.start()
    added = SparkRuntime(
        grown,
        str(tmp_path),
        RuntimeSettings(intervals=2, poll_ms=50, only=("Late",)),
        spark=spark,
        watermarks=wm,
    )
    try:
        import time

        deadline = time.monotonic() + 300
        while not running.drained() and time.monotonic() < deadline:
            running.poll()
            time.sleep(0.05)
        assert running.drained()
        added.start()  # the first driver keeps running; nothing of it restarts
        while not added.drained() and time.monotonic() < deadline:
            running.poll()
            added.poll()
            time.sleep(0.05)
        assert added.drained()
        assert running.computations["Echo"].metrics["productions"] == 300
        assert added.computations["Late"].metrics["processed"] == 300
    finally:
        added.stop()
        running.stop()
