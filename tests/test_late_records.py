"""Late records: behind the low watermark at arrival (MillWheel §4.5, §5.2), always counted."""

from __future__ import annotations

from millwheel import Computation, ComputationOptions, LatePolicy, Record
from millwheel.testing import Harness


class Collector(Computation):
    def process_record(self, record):
        self.state.set([*self.state.get([]), record.value])


def collector(late: LatePolicy, outputs=()):
    h = Harness.for_computation(
        Collector, inputs=["in"], outputs=outputs, options=ComputationOptions(late=late)
    )
    h.inject("in", [Record("k", "on-time", 1_000, "a")])
    h.advance_watermark("in", 2_000)
    h.inject("in", [Record("k", "late", 1_500, "b"), Record("k", "fine", 2_000, "c")])
    h.run()
    return h


def test_drop_discards_and_counts():
    h = collector(LatePolicy.drop())
    assert h.state("Collector", "k") == ["on-time", "fine"]
    m = h.metrics("Collector")
    assert (m["late"], m["late_dropped"]) == (1, 1)


def test_process_anyway_processes_and_counts():
    h = collector(LatePolicy.process())
    assert h.state("Collector", "k") == ["on-time", "late", "fine"]
    assert h.metrics("Collector")["late"] == 1


def test_to_stream_sends_the_record_unchanged_and_counts():
    h = collector(LatePolicy.to_stream("late_in"))
    assert h.state("Collector", "k") == ["on-time", "fine"]
    (late,) = h.output("late_in")
    assert (late.value, late.timestamp, late.id) == ("late", 1_500, "b")
    m = h.metrics("Collector")
    assert (m["late"], m["late_to_stream"]) == (1, 1)


def test_lateness_is_judged_at_arrival_not_at_processing():
    # delivered before the injector advanced its watermark: pending work, not late
    h = Harness.for_computation(Collector, inputs=["in"])
    h.inject("in", [Record("k", "queued", 1_000, "a")])
    h.advance_watermark("in", 5_000)
    h.run()
    assert h.state("Collector", "k") == ["queued"]
    assert h.metrics("Collector")["late"] == 0


def test_late_productions_downstream_are_late_too():
    class Forward(Computation):
        def process_record(self, record):
            self.produce(
                "mid", record.value, timestamp=record.timestamp - 10_000
            )  # breaks §4.5's rule

    t = Harness.for_computation(Forward, inputs=["in"], outputs=["mid"]).topology
    t.computation(Collector, inputs=["mid"])
    h = Harness(t)
    h.advance_watermark("in", 20_000)
    h.run()
    h.inject("in", [Record("k", "x", 20_000, "a")])
    h.run()
    assert h.metrics("Collector")["late_dropped"] == 1
    assert h.metrics("Forward")["productions_behind_watermark"] == 1  # the producer is told too
