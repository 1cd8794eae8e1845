"""Timers (MillWheel §4.6): many per key, tagged, in timestamp order, never early."""

from __future__ import annotations

import pytest

from millwheel import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Computation,
    ComputationError,
    Record,
    TimeDomain,
    Timer,
)
from millwheel.testing import Harness


class Scheduler(Computation):
    """Record values are lists of (tag, ts, domain) timers to set; timers produce (tag, ts)."""

    def process_record(self, record):
        for tag, ts, domain in record.value:
            if ts is None:
                self.delete_timer(tag)
            else:
                self.set_timer(tag, ts, TimeDomain(domain))

    def process_timer(self, timer):
        self.produce(
            "fired",
            (timer.tag, timer.timestamp, int(timer.domain)),
            timestamp=max(timer.timestamp, self.low_watermark),
        )
        if timer.tag.startswith("chain") and timer.timestamp < 5_000:
            # re-arm in the past: already due, must fire in this same step, in order
            self.set_timer(f"chain{timer.timestamp + 100}", timer.timestamp + 100)


def harness(**kw):
    return Harness.for_computation(
        Scheduler, inputs={"cmd": lambda r: "k"}, outputs=["fired"], **kw
    )


LW, WALL = int(TimeDomain.LOW_WATERMARK), int(TimeDomain.WALL_TIME)


def test_fire_in_timestamp_order_whatever_the_order_they_were_set():
    h = harness()
    h.inject("cmd", [h.record([("c", 3_000, LW), ("a", 1_000, LW), ("b", 2_000, LW)], 0)])
    h.run()
    assert [t.tag for t in h.timers("Scheduler", "k")] == ["a", "b", "c"]
    h.advance_watermark("cmd", 10_000)
    h.run()
    assert [v[0] for v in h.values("fired")] == ["a", "b", "c"]
    assert h.timers("Scheduler", "k") == []


def test_low_watermark_timer_never_fires_before_the_watermark_reaches_it():
    h = harness()
    h.inject("cmd", [h.record([("t", 2_000, LW)], 0)])
    h.advance_watermark("cmd", 1_999)
    h.run()
    assert h.values("fired") == []
    h.advance_wall_time(to=10**12)  # wall time is irrelevant to a low-watermark timer
    h.run()
    assert h.values("fired") == []
    h.advance_watermark("cmd", 2_000)
    h.run()
    assert h.values("fired") == [("t", 2_000, LW)]


def test_wall_time_timer_fires_on_wall_time_only():
    h = harness(wall_time=1_000)
    h.inject("cmd", [h.record([("w", 5_000, WALL)], 0)])
    h.advance_watermark("cmd", MAX_TIMESTAMP - 1)
    h.run()
    assert h.values("fired") == []
    h.advance_wall_time(by=3_999)
    h.run()
    assert h.values("fired") == []
    h.advance_wall_time(by=1)
    h.run()
    assert [v[:2] for v in h.values("fired")] == [("w", 5_000)]


def test_same_tag_replaces_and_delete_cancels():
    h = harness()
    h.inject("cmd", [h.record([("x", 1_000, LW), ("y", 1_500, LW)], 0)])
    h.inject("cmd", [h.record([("x", 3_000, LW), ("y", None, LW)], 1)])
    h.run()
    assert h.timers("Scheduler", "k") == [Timer("x", 3_000, TimeDomain.LOW_WATERMARK)]
    h.advance_watermark("cmd", 5_000)
    h.run()
    assert h.values("fired") == [("x", 3_000, LW)]


def test_timers_set_while_firing_that_are_already_due_fire_in_order_in_the_same_step():
    h = harness()
    h.inject("cmd", [h.record([("chain1000", 1_000, LW), ("late", 1_250, LW)], 0)])
    h.advance_watermark("cmd", 1_300)
    h.run()
    fired = [v[:2] for v in h.values("fired")]
    # chain1300 is set at exactly the watermark: due, so it fires too; chain1400 is not due
    assert fired == [
        ("chain1000", 1_000),
        ("chain1100", 1_100),
        ("chain1200", 1_200),
        ("late", 1_250),
        ("chain1300", 1_300),
    ]
    assert h.timers("Scheduler", "k")[0].timestamp == 1_400


def test_many_timers_per_key_in_both_domains_interleave_by_timestamp():
    h = harness(wall_time=0)
    h.inject(
        "cmd",
        [
            h.record(
                [(f"l{i}", i * 10, LW) for i in range(50)]
                + [(f"w{i}", i * 10 + 5, WALL) for i in range(50)],
                0,
            )
        ],
    )
    h.advance_watermark("cmd", 10_000)
    h.advance_wall_time(to=10_000)
    h.run()
    stamps = [v[1] for v in h.values("fired")]
    assert stamps == sorted(stamps) and len(stamps) == 100


def test_timers_survive_a_restart():
    h = harness()
    h.inject("cmd", [h.record([("t", 2_000, LW)], 0)])
    h.run()
    h.restart("Scheduler")  # a fresh instance; envelopes are the only memory
    h.advance_watermark("cmd", 2_000)
    h.run()
    assert h.values("fired") == [("t", 2_000, LW)]


def test_a_timer_that_keeps_rearming_in_the_past_is_bounded_per_step():
    class Spinner(Computation):
        def process_record(self, record):
            self.set_timer("spin", 0)

        def process_timer(self, timer):
            self.set_timer("spin", 0)  # due again, forever

    from millwheel import ComputationOptions

    h = Harness.for_computation(
        Spinner, inputs=["in"], options=ComputationOptions(max_timer_fires_per_step=5)
    )
    h.inject("in", [h.record(None, 0, key="k")])
    h.advance_watermark("in", 10)
    h.process("Spinner")
    m = h.metrics("Spinner")
    assert m["timers_fired"] == 5 and m["timers_deferred"] == 1


def test_bad_timer_arguments_are_clear_errors():
    class Bad(Computation):
        def process_record(self, record):
            self.set_timer("t", record.value)

        def process_timer(self, timer):  # pragma: no cover - never reached
            pass

    h = Harness.for_computation(Bad, inputs=["in"])
    h.inject("in", [h.record(1.5, 0, key="k")])
    with pytest.raises(ComputationError, match=r"timestamp must be an int.*float"):
        h.run()


def test_setting_a_timer_without_process_timer_is_reported():
    class NoHook(Computation):
        def process_record(self, record):
            self.set_timer("t", 10)

    h = Harness.for_computation(NoHook, inputs=["in"], raise_errors=False)
    h.inject("in", [h.record(None, 0, key="k")])
    h.advance_watermark("in", 10)
    h.run()
    (dead,) = h.dead_letters()
    assert dead.value.stage == "process_timer" and dead.value.timer is not None
    assert "does not override process_timer" in dead.value.reason
    assert h.timers("NoHook", "k") == []  # the failing timer is not retried forever


def test_a_wall_time_timer_produces_before_any_watermark_progress(edge_timers):
    # the commonest wall-time timer, a periodic flush, fires before the injector has said
    # anything: its production defaults to the earliest record time, not MIN_TIMESTAMP
    h = Harness(edge_timers(None))
    h.inject("words", [Record(None, {"word": "cat"}, 1_000, "a")])
    h.run()
    assert h.low_watermark("Flusher") < 1_000
    (flush,) = h.output("flushes")
    assert flush.value == {"key": "cat", "count": 1} and flush.timestamp == MIN_TIMESTAMP + 1
    assert h.dead_letters() == []


def test_an_event_time_timer_at_max_timestamp_fires_when_the_input_is_finished(edge_timers):
    h = Harness(edge_timers(None))
    h.inject(
        "words",
        [Record(None, {"word": "cat"}, 1_000, "a"), Record(None, {"word": "cat"}, 2_000, "b")],
    )
    h.advance_watermark("words", 5_000)
    h.run()
    assert h.output("totals") == []  # not before the input is finished
    h.finish("words")
    h.run()
    assert h.values("totals") == [{"key": "cat", "total": 2}]
    assert h.state("Totals", "cat") == 2 and h.metrics("Totals")["late"] == 0  # on time downstream
    assert h.low_watermark("Totals") == MAX_TIMESTAMP


def test_a_wall_time_timer_at_max_timestamp_is_refused_with_what_to_use():
    h = harness()
    h.inject("cmd", [Record(None, [("t", MAX_TIMESTAMP, WALL)], 1, "a")])
    with pytest.raises(
        ComputationError,
        match="never fire; an event-time timer at MAX_TIMESTAMP fires when the input is finished",
    ):
        h.run()
