"""Low watermarks (MillWheel §4.5, §7.2): min(oldest work, upstream), monotonic, never early."""

from __future__ import annotations

import pytest

from millwheel import MIN_TIMESTAMP, Computation, ComputationOptions, HarnessError, Record, Topology
from millwheel.testing import Harness


class Buffer(Computation):
    """Holds each record in a low-watermark timer at its timestamp + 1000, then forwards it."""

    def process_record(self, record):
        self.state.set([*self.state.get([]), record.value])
        self.set_timer("flush", record.timestamp + 1_000)

    def process_timer(self, timer):
        self.produce("out", self.state.get(), timestamp=timer.timestamp)
        self.state.clear()


class Sink(Computation):
    def process_record(self, record):
        self.state.set(record.value)


def pipeline(strong=True):
    t = Topology("wm")
    t.injector("in")
    t.computation(
        Buffer,
        inputs={"in": lambda r: "k"},
        outputs=["out"],
        options=ComputationOptions(strong_productions=strong),
    )
    t.computation(Sink, inputs={"out": lambda r: "k"})
    return Harness(t)


def test_nothing_known_until_injectors_publish():
    h = pipeline()
    assert h.low_watermark("in") == MIN_TIMESTAMP
    assert h.low_watermark("Buffer") == MIN_TIMESTAMP
    assert h.low_watermark("Sink") == MIN_TIMESTAMP


def test_unprocessed_input_holds_the_watermark():
    h = pipeline()
    h.inject("in", [Record(None, "a", 3_000, "a")])
    h.advance_watermark("in", 10_000)
    assert h.low_watermark("Buffer") == 3_000  # queued, not processed yet
    assert h.low_watermark("Sink") == 3_000  # downstream is never ahead of upstream


def test_pending_timer_holds_the_watermark_until_it_fires():
    h = pipeline()
    h.inject("in", [Record(None, "a", 3_000, "a")])
    h.advance_watermark("in", 3_500)
    h.run()
    assert h.low_watermark("Buffer") == 3_500  # the timer at 4000 is ahead of the input
    h.advance_watermark("in", 10_000)
    h.process("Buffer", deliver=False)
    # the timer fired; its strong production is checkpointed, not delivered: it holds
    assert h.pending_productions("Buffer", "k")[0].record.timestamp == 4_000
    assert h.low_watermark("Buffer") == 4_000
    h.deliver("Buffer")
    assert h.pending_productions("Buffer", "k") == []
    assert h.low_watermark("Buffer") == 10_000
    assert h.low_watermark("Sink") == 4_000  # its input is queued
    h.run()
    assert h.low_watermark("Sink") == 10_000


def test_timer_holds_the_watermark_at_its_timestamp():
    h = pipeline()
    h.inject("in", [Record(None, "a", 3_000, "a")])
    h.run()
    h.advance_watermark("in", 3_999)
    h.run()
    assert h.low_watermark("Buffer") == 3_999
    assert h.timers("Buffer", "k")[0].timestamp == 4_000
    h.advance_watermark("in", 50_000)
    # the input moved on; the pending timer (now due but not yet fired) holds Buffer
    assert h.low_watermark("Buffer") == 4_000


def test_minimum_over_several_upstreams():
    t = Topology("two")
    t.injector("a")
    t.injector("b")
    t.computation(Sink, inputs=["a", "b"])
    h = Harness(t)
    h.advance_watermark("a", 5_000)
    h.advance_watermark("b", 2_000)
    assert h.low_watermark("Sink") == 2_000
    h.advance_watermark("b", 9_000)
    assert h.low_watermark("Sink") == 5_000


def test_monotonic_even_with_late_data():
    h = pipeline()
    h.advance_watermark("in", 10_000)
    h.run()
    assert h.low_watermark("Buffer") == 10_000
    h.inject("in", [Record(None, "late", 1_000, "x")])  # queued work far behind
    assert h.low_watermark("Buffer") == 10_000


def test_injector_watermark_cannot_go_back():
    h = pipeline()
    h.advance_watermark("in", 10)
    with pytest.raises(HarnessError, match="cannot go back"):
        h.advance_watermark("in", 9)
    with pytest.raises(HarnessError, match="wall time cannot go back"):
        h.advance_wall_time(to=-1)


def test_weak_productions_do_not_wait_in_the_envelope():
    h = pipeline(strong=False)
    h.inject("in", [Record(None, "a", 3_000, "a")])
    h.advance_watermark("in", 10_000)
    h.process("Buffer", deliver=False)
    assert h.pending_productions("Buffer", "k") == []
    assert h.values("out") == [["a"]]  # sent optimistically, before the checkpoint (§6.1.3)
