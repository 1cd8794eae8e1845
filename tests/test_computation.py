"""The Computation base class: accessors, state handle, setup."""

from __future__ import annotations

import pytest

from millwheel import Computation, ComputationError, Record
from millwheel.testing import Harness


class Greeter(Computation):
    def __init__(self, greeting: str = "hello") -> None:
        self.greeting = greeting
        self.ready = False

    def setup(self) -> None:
        self.ready = True

    def process_record(self, record):
        if not self.ready:
            msg = "setup() was not called"
            raise RuntimeError(msg)
        self.produce("out", f"{self.greeting} {self.key} at {self.now}, wm {self.low_watermark}")


def test_accessors_inside_a_step_and_setup_is_called():
    h = Harness.for_computation(Greeter, inputs=["in"], outputs=["out"], params={"greeting": "hi"}, wall_time=42)
    h.inject("in", [Record("bob", None, 5, "a")])
    h.run()
    assert h.values("out") == ["hi bob at 42, wm -9223372036854775808"]


def test_accessors_outside_a_step_name_the_computation():
    h = Harness.for_computation(Greeter, inputs=["in"], outputs=["out"])
    comp = h._runner("Greeter").computation
    h.inject("in", [Record("bob", None, 5, "a")])
    h.run()  # after a step too: the step takes its key's state away again
    with pytest.raises(ComputationError, match=r"Greeter: key, state, timers and produce are only available inside process_record"):
        comp.state.get()
    with pytest.raises(ComputationError, match="only available inside"):
        comp.produce("out", 1)
    with pytest.raises(ComputationError, match="only available inside"):
        Greeter().key  # noqa: B018


def test_state_handle_get_default_set_clear():
    class Box(Computation):
        def process_record(self, record):
            if record.value == "clear":
                self.state.clear()
                return
            items = self.state.get([])
            items.append(record.value)
            self.state.set(items)
            assert self.state.get() is items  # decoded once per step: the same object

    h = Harness.for_computation(Box, inputs=["in"])
    h.inject("in", [Record("k", "a", 1, "1"), Record("k", "b", 1, "2")])
    h.run()
    assert h.state("Box", "k") == ["a", "b"]
    h.inject("in", [Record("k", "clear", 1, "3")])
    h.run()
    assert h.state("Box", "k") is None
