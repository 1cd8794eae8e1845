"""Bad input never stops other keys: it goes to the dead-letter stream with its reason."""

from __future__ import annotations

import pytest

from millwheel import (
    DEAD_LETTER_STREAM,
    Computation,
    ComputationOptions,
    ErrorPolicy,
    Record,
    Stage,
    Topology,
)
from millwheel.testing import Harness


class Fragile(Computation):
    """Adds to a running list; chokes on negative values, after having mutated its state."""

    def process_record(self, record):
        seen = self.state.get([])
        seen.append(record.value)
        self.state.set(seen)
        self.produce("out", record.value)
        if record.value < 0:
            msg = f"negative value {record.value}"
            raise ValueError(msg)


def test_failing_record_is_rolled_back_and_dead_lettered_while_others_go_on():
    h = Harness.for_computation(Fragile, inputs=["in"], outputs=["out"], raise_errors=False)
    h.inject(
        "in",
        [
            Record("a", 1, 1, "1"),
            Record("a", -5, 2, "2"),
            Record("a", 3, 3, "3"),
            Record("b", 7, 4, "4"),
        ],
    )
    h.run()
    assert h.state("Fragile", "a") == [1, 3]  # no trace of -5: the key was rolled back
    assert h.state("Fragile", "b") == [7]
    assert sorted(h.values("out")) == [1, 3, 7]  # nor its production
    (dead,) = h.dead_letters()
    assert dead.value.computation == "Fragile"
    assert dead.value.stage == Stage.PROCESS_RECORD
    assert dead.value.reason == "ValueError: negative value -5"
    assert dead.value.record.id == "2"
    assert dead.value.key == "a" and dead.value.stream == "in"
    assert h.metrics("Fragile")["dead_letters"] == 1
    # a retry of the dead-lettered record is a duplicate, not a second dead letter
    h.inject("in", [Record("a", -5, 2, "2")])
    h.run()
    assert len(h.dead_letters()) == 1


def test_key_extractor_failures_are_dead_lettered_with_the_stream():
    t = Topology("k")
    t.injector("in")
    t.computation(Fragile, inputs={"in": lambda r: r.value["user"]}, outputs=["out"])
    h = Harness(t, raise_errors=False)
    h.inject(
        "in",
        [
            Record(None, {"user": "u1"}, 1, "ok"),
            Record(None, {"nouser": 1}, 1, "bad"),
            Record(None, {"user": 3.5}, 1, "float"),
        ],
    )
    reasons = [d.value for d in h.dead_letters()]
    assert [r.stage for r in reasons] == [Stage.KEY_EXTRACTOR, Stage.KEY_EXTRACTOR]
    assert reasons[0].stream == "in" and "KeyError" in reasons[0].reason
    assert "keys must be str, int, bytes or a tuple of those; got float 3.5" in reasons[1].reason
    # counted the same way on both backends: the record came in and became a dead letter
    assert h.metrics("Fragile")["records_in"] == 2 and h.metrics("Fragile")["dead_letters"] == 2


def test_raise_policy_propagates():
    h = Harness.for_computation(
        Fragile,
        inputs=["in"],
        outputs=["out"],
        raise_errors=False,
        options=ComputationOptions(on_error=ErrorPolicy.RAISE),
    )
    h.inject("in", [Record("a", -1, 1, "1")])
    with pytest.raises(ValueError, match="negative value -1"):
        h.run()


def test_dead_letters_are_a_stream_others_can_read():
    class Count(Computation):
        def process_record(self, record):
            self.state.set(self.state.get(0) + 1)

    t = Topology("dl")
    t.injector("in")
    t.computation(Fragile, inputs=["in"], outputs=["out"])
    t.computation(Count, inputs={DEAD_LETTER_STREAM: lambda r: r.value.computation})
    h = Harness(t, raise_errors=False)
    h.inject("in", [Record("a", -1, 1, "1"), Record("b", -2, 1, "2")])
    h.run()
    assert h.state("Count", "Fragile") == 2
