"""The Computation base class: accessors, state handle, setup."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from millwheel import (
    Computation,
    ComputationError,
    ComputationOptions,
    DataclassCodec,
    MsgpackCodec,
    Record,
    StateCodecError,
    TimeDomain,
    Timer,
    TimerFamily,
)
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
    h = Harness.for_computation(
        Greeter, inputs=["in"], outputs=["out"], params={"greeting": "hi"}, wall_time=42
    )
    h.inject("in", [Record("bob", None, 5, "a")])
    h.run()
    assert h.values("out") == ["hi bob at 42, wm -9223372036854775808"]


def test_accessors_outside_a_step_name_the_computation():
    h = Harness.for_computation(Greeter, inputs=["in"], outputs=["out"])
    comp = h._runner("Greeter").computation
    h.inject("in", [Record("bob", None, 5, "a")])
    h.run()  # after a step too: the step takes its key's state away again
    with pytest.raises(
        ComputationError,
        match=r"Greeter: key, state, timers and produce are only available inside process_record",
    ):
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


# ---- typed state and timer families ------------------------------------------------------
@dataclass
class Session:
    clicks: int = 0
    pages: list = field(default_factory=list)


class Sessions(Computation):
    """A session per user: closed 30 s after its last click (low watermark), with a
    wall-time reminder per page; typed state, two timer families, no process_timer."""

    options = ComputationOptions(state_codec=DataclassCodec(Session))
    close = TimerFamily()
    remind = TimerFamily(TimeDomain.WALL_TIME)

    def process_record(self, record: Record) -> None:
        s: Session = self.state.get() or Session()
        s.clicks += 1
        s.pages.append(record.value["page"])
        self.state.set(s)
        self.close.set(record.timestamp + 30_000)
        self.remind.set(self.now + 1_000, name=record.value["page"])

    @close.on_fire
    def closed(self, name: str, timer: Timer) -> None:
        s: Session = self.state.get()
        self.produce(
            "sessions", {"user": self.key, "clicks": s.clicks, "pages": s.pages, "name": name}
        )
        for page in self.remind.pending():
            self.remind.delete(page)
        self.state.clear()

    @remind.on_fire
    def reminded(self, page: str, timer: Timer) -> None:
        self.produce("reminders", {"user": self.key, "page": page})


def test_timer_families_dispatch_to_their_handlers_and_typed_state_round_trips():
    h = Harness.for_computation(
        Sessions, inputs={"clicks": lambda r: r.value["user"]}, outputs=["sessions", "reminders"]
    )
    h.inject(
        "clicks",
        [h.record({"user": "ann", "page": p}, 1_000 + i) for i, p in enumerate(["a", "b"])],
    )
    h.run()
    assert h.state("Sessions", "ann") == Session(2, ["a", "b"])
    assert sorted(t.tag for t in h.timers("Sessions", "ann")) == ["close", "remind:a", "remind:b"]
    h.advance_wall_time(by=1_000)
    h.run()
    assert sorted(v["page"] for v in h.values("reminders")) == ["a", "b"]
    h.inject("clicks", [h.record({"user": "ann", "page": "c"}, 3_000)])
    h.finish("clicks")
    h.run()
    assert h.values("sessions") == [
        {"user": "ann", "clicks": 3, "pages": ["a", "b", "c"], "name": ""}
    ]
    assert (
        h.keys("Sessions") == [] or h.timers("Sessions", "ann") == []
    )  # the pending reminder was deleted


def test_a_timer_of_no_family_still_needs_process_timer():
    class Stray(Sessions):
        def process_record(self, record: Record) -> None:
            self.set_timer("other", record.timestamp)

    h = Harness.for_computation(
        Stray, inputs={"clicks": lambda r: "k"}, outputs=["sessions", "reminders"]
    )
    h.inject("clicks", [h.record({}, 1_000)])
    h.finish("clicks")
    with pytest.raises(Exception, match="set timer 'other' but does not override process_timer"):
        h.run()


def test_dataclass_codec_refuses_other_types_and_reads_renamed_fields():
    codec = DataclassCodec(Session, renamed={"n": "clicks"})
    with pytest.raises(StateCodecError, match="state must be a Session, got dict"):
        codec.encode({"clicks": 1})
    assert codec.decode(DataclassCodec(Session).encode(Session(1, ["x"]))) == Session(1, ["x"])
    assert codec.decode(MsgpackCodec().encode({"n": 4})) == Session(4, [])
    with pytest.raises(StateCodecError, match=r"fields \['extra'\] that Session does not"):
        codec.decode(MsgpackCodec().encode({"extra": 1}))
    with pytest.raises(TypeError, match="takes a dataclass"):
        DataclassCodec(dict)
