"""Bad input never stalls a key or the run: each kind of bad input, on the harness (the Spark
side is the differential test ``tests/runtime/test_differential_bad_input.py``, which runs the
same bad input through both backends).

Every test asserts that the other keys' output is complete and exact and that the bad
input appears once in ``dead_letters`` with its reason.
"""

from __future__ import annotations

import threading

import pytest

from millwheel import (
    DEAD_LETTER_STREAM,
    MAX_TIMESTAMP,
    Computation,
    ComputationOptions,
    HarnessError,
    LatePolicy,
    Record,
    Stage,
    Timer,
    Topology,
)
from millwheel.testing import Crash, Harness


class Echo(Computation):
    """Produces what it gets, keyed; fails on demand with values that cannot be stored."""

    def process_record(self, record: Record) -> None:
        v = record.value
        if v == "lock-in-state":
            self.state.set(threading.Lock())
        elif v == "lock-produced":
            self.produce("out", threading.Lock())
        elif v == "far-timer":
            self.set_timer("t", 2**70)
        else:
            self.state.set((self.state.get(0)) + 1)
            self.produce("out", (self.key, v))


def _harness(**kw) -> Harness:
    return Harness.for_computation(
        Echo, inputs={"in": lambda r: r.key}, outputs=["out"], raise_errors=False, **kw
    )


def _dead(h: Harness) -> list:
    return [r.value for r in h.dead_letters()]


# ---- 2. one unserialisable value stalls nothing -------------------------------------------
@pytest.mark.parametrize("bad", ["lock-in-state", "lock-produced", "far-timer"])
def test_an_unstorable_value_fails_its_record_only(bad):
    h = _harness()
    h.inject(
        "in",
        [
            Record("a", 1, 10, "1"),
            Record("a", bad, 11, "2"),
            Record("a", 3, 12, "3"),
            Record("b", 4, 13, "4"),
        ],
    )
    h.run()
    h.inject("in", [Record("a", 5, 14, "5")])  # later runs work too
    h.run()
    assert sorted(h.values("out")) == [("a", 1), ("a", 3), ("a", 5), ("b", 4)]
    assert h.state("Echo", "a") == 3 and h.state("Echo", "b") == 1
    (dead,) = _dead(h)
    assert dead.computation == "Echo" and dead.key == "a" and dead.record.id == "2"
    assert dead.stage in (Stage.PROCESS_RECORD, Stage.CHECKPOINT)
    assert ("pickle" in dead.reason) or ("64-bit" in dead.reason)


# ---- 3. malformed record fields are refused at the boundary --------------------------------
@pytest.mark.parametrize(
    ("ts", "rid", "why"),
    [
        (None, "x", "timestamp must be an int"),
        ("12", "x", "timestamp must be an int"),
        (1.5, "x", "timestamp must be an int"),
        (2**64, "x", "64-bit"),
        (1, 7, "id must be a non-empty str"),
        (1, None, "id must be a non-empty str"),
        (1, b"x", "id must be a non-empty str"),
        (1, "", "id must be a non-empty str"),
        (1, "x\ud800", "lone surrogate"),
    ],
)
def test_bad_ids_and_timestamps_are_dead_lettered_at_inject(ts, rid, why):
    h = _harness()
    h.inject("in", [Record("a", 1, 10, "1"), Record("a", 2, ts, rid), Record("b", 3, 11, "3")])
    h.run()
    assert sorted(h.values("out")) == [("a", 1), ("b", 3)]
    (dead,) = _dead(h)
    assert dead.stage == Stage.INVALID_RECORD and why in dead.reason and dead.injector == "in"


# ---- 4. dead letters have unique ids and never loop -------------------------------------------
class Fails(Computation):
    def process_record(self, record: Record) -> None:
        msg = f"no {record.value}"
        raise ValueError(msg)


def test_two_failures_of_one_key_in_two_steps_are_two_dead_letters():
    h = Harness.for_computation(Fails, inputs=["in"], raise_errors=False)
    h.inject("in", [Record("k", "x", 1, "1")])
    h.run()
    h.inject("in", [Record("k", "y", 2, "2")])
    h.run()
    ids = [r.id for r in h.dead_letters()]
    assert len(ids) == 2 and len(set(ids)) == 2


def test_a_dead_letter_consumer_that_fails_does_not_loop():
    t = Topology("dl")
    t.injector("in")
    t.computation(Fails, inputs=["in"])
    t.computation(Fails, inputs={DEAD_LETTER_STREAM: lambda r: r.value.nope}, name="BadReader")
    t.computation(
        Fails, inputs={DEAD_LETTER_STREAM: lambda r: r.value.computation}, name="FailingReader"
    )
    h = Harness(t, raise_errors=False)
    h.inject("in", [Record("k", "x", 1, "1")])
    h.run()
    assert [r.value.computation for r in h.dead_letters()] == ["Fails"]
    assert h.metrics("BadReader")["dead_letters_dropped"] == 1
    assert h.metrics("FailingReader")["dead_letters_dropped"] == 1


# ---- 5. dead-lettering is linear ----------------------------------------------------------
def test_thousands_of_failures_in_one_step_cost_linear_work():
    calls = []

    class Half(Computation):
        def process_record(self, record: Record) -> None:
            calls.append(record.id)
            self.state.set(self.state.get(0) + 1)
            if record.value % 2:
                msg = "odd"
                raise ValueError(msg)

    n = 4_000
    h = Harness.for_computation(Half, inputs=["in"], raise_errors=False)
    h.inject("in", [Record("k", i, i, str(i)) for i in range(n)])
    h.run()
    assert len(h.dead_letters()) == n // 2 and h.state("Half", "k") == n // 2
    # the fast attempt stops at the first failure, the careful one runs each record once:
    # re-running from the start after each failure would make this ~n*n/4
    assert len(calls) <= n + 2


# ---- 8. counters are not counted twice by a crash replay --------------------------------------
def test_a_crash_before_commit_does_not_double_count():
    h = _harness()
    h.inject("in", [Record("a", 1, 1, "1")])
    h.process("Echo", crash=Crash.BEFORE_COMMIT)
    h.restart("Echo")
    h.run()
    assert h.metrics("Echo")["records_in"] == 1 and h.metrics("Echo")["processed"] == 1


# ---- 9. a late record is late once ---------------------------------------------------------
def test_a_late_record_redelivered_is_a_duplicate_not_late_again():
    h = _harness(options=ComputationOptions(late=LatePolicy.drop()))
    h.advance_watermark("in", 100)
    h.inject("in", [Record("a", 1, 50, "late")])
    h.run()
    h.inject("in", [Record("a", 1, 50, "late")])
    h.run()
    m = h.metrics("Echo")
    assert (m["late"], m["duplicates"]) == (1, 1)


# ---- 10. state can hold the low watermark; reads have no side effects ----------------------
class NewestStamp(Computation):
    """Emits a window at its end, stamped with its newest record (allowed by §4.5)."""

    def process_record(self, record: Record) -> None:
        end = record.timestamp // 1_000 * 1_000 + 1_000
        newest = max(self.state.get(0), record.timestamp)
        self.state.set(newest)
        self.hold_watermark(newest)  # what we will emit is this old
        self.set_timer("end", end)

    def process_timer(self, timer: Timer) -> None:
        self.produce("windows", self.key, timestamp=self.state.get())
        self.state.clear()
        self.hold_watermark(None)


class Collect(Computation):
    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)


def _windows() -> Harness:
    t = Topology("w")
    t.injector("in")
    t.computation(NewestStamp, inputs=["in"], outputs=["windows"])
    t.computation(Collect, inputs=["windows"])
    return Harness(t)


def test_a_state_hold_keeps_consumers_from_dropping_the_window_as_late():
    h = _windows()
    h.inject("in", [Record("a", 1, 400, "1"), Record("a", 1, 900, "2")])
    h.advance_watermark("in", 950)
    h.run()
    assert h.low_watermark("NewestStamp") == 900  # held by the state, not by the timer at 1000
    h.advance_watermark("in", 1_000)
    h.run()
    assert h.metrics("Collect")["late"] == 0 and h.state("Collect", "a") == 1
    assert h.low_watermark("NewestStamp") == 1_000


def test_reading_a_watermark_changes_nothing():
    def run(read: bool) -> dict:
        h = _windows()
        h.inject("in", [Record("a", 1, 400, "1")])
        if read:
            h.low_watermark("NewestStamp")
            h.low_watermark("Collect")
        h.advance_watermark("in", 2_000)
        if read:
            h.low_watermark("Collect")
        h.run()
        return h.metrics("Collect")

    assert run(True) == run(False)


# ---- 12. record.stream and tuple keys ---------------------------------------------------------
class Join(Computation):
    def process_record(self, record: Record) -> None:
        sides = self.state.get({})
        sides[record.stream] = record.value["v"]
        self.state.set(sides)
        if len(sides) == 2:
            self.produce("joined", (self.key, sides["left"], sides["right"]))


def test_a_join_tells_its_inputs_apart_and_keys_can_be_tuples():
    t = Topology("j")
    t.injector("left")
    t.injector("right")
    by = lambda r: (r.value["user"], r.value["day"])  # noqa: E731
    t.computation(Join, inputs={"left": by, "right": by}, outputs=["joined"])
    h = Harness(t)
    h.inject("left", [Record(None, {"user": "u", "day": 1, "v": "L"}, 1, "l1")])
    h.inject("right", [Record(None, {"user": "u", "day": 1, "v": "R"}, 1, "r1")])
    h.run()
    assert h.values("joined") == [(("u", 1), "L", "R")]
    assert h.state("Join", ("u", 1)) == {"left": "L", "right": "R"}


def test_harness_misuse_is_still_an_error():
    h = _harness()
    with pytest.raises(HarnessError, match="takes Record objects"):
        h.inject("in", [{"not": "a record"}])
    assert MAX_TIMESTAMP > 0
