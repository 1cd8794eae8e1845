"""Topology validation: mistakes surface when the topology is built, with the fix in the message."""

from __future__ import annotations

import pytest

from millwheel import (
    Computation,
    ComputationOptions,
    LatePolicy,
    TimerFamily,
    Topology,
    TopologyError,
)
from millwheel.testing import Harness


class Noop(Computation):
    def process_record(self, record):
        pass


class WithParams(Computation):
    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def process_record(self, record):
        pass


def base():
    t = Topology("t")
    t.injector("queries")
    return t


def test_unknown_input_stream_names_the_computation_and_suggests_the_closest():
    t = base()
    t.computation(Noop, inputs={"querys": lambda r: r.key})
    with pytest.raises(
        TopologyError,
        match=r"computation 'Noop' reads stream 'querys', which nothing produces.*did you mean 'queries'\?",
    ):
        t.validate()


def test_stream_with_no_producer_says_how_to_add_one():
    t = base()
    t.computation(Noop, inputs={"clicks": lambda r: r.key})
    with pytest.raises(
        TopologyError, match=r"'clicks', which nothing produces.*add an injector or a computation"
    ):
        t.validate()


def test_every_problem_is_listed_at_once():
    t = base()
    t.computation(Noop, inputs=["a"], name="A")
    t.computation(Noop, inputs=["b"], name="B")
    with pytest.raises(TopologyError) as err:
        t.validate()
    assert "'A' reads stream 'a'" in str(err.value) and "'B' reads stream 'b'" in str(err.value)


@pytest.mark.parametrize(
    ("extractor", "pattern"),
    [
        ("query", r"key extractor for stream 'queries' must be a function of the record"),
        (lambda: "k", r"must take exactly one argument \(the record\)"),
        (lambda a, b: "k", r"must take exactly one argument"),
    ],
)
def test_bad_key_extractors(extractor, pattern):
    with pytest.raises(TopologyError, match=pattern):
        base().computation(Noop, inputs={"queries": extractor})


def test_duplicate_names():
    t = base()
    t.computation(Noop, inputs=["queries"])
    with pytest.raises(
        TopologyError, match=r"already has a computation named 'Noop'; pass a unique name="
    ):
        t.computation(Noop, inputs=["queries"])
    with pytest.raises(TopologyError, match=r"already has a injector named 'queries'"):
        t.injector("queries")


def test_cycles_are_rejected_with_the_cycle_spelled_out():
    t = base()
    t.computation(Noop, inputs=["queries", "back"], outputs=["fwd"], name="A")
    t.computation(Noop, inputs=["fwd"], outputs=["back"], name="B")
    with pytest.raises(TopologyError, match=r"cycle \((A -> B -> A|B -> A -> B)\)"):
        t.validate()


def test_reading_its_own_output_is_a_cycle():
    t = base()
    t.computation(Noop, inputs=["queries", "self_loop"], outputs=["self_loop"])
    with pytest.raises(TopologyError, match="reads a stream it produces"):
        t.validate()


def test_not_a_computation_and_no_process_record():
    class Empty(Computation):
        pass

    with pytest.raises(TopologyError, match="expects a Computation subclass"):
        base().computation(object, inputs=["queries"])  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match=r"'Empty': Empty must override process_record"):
        base().computation(Empty, inputs=["queries"])


def test_outputs_given_as_a_string():
    with pytest.raises(TopologyError, match=r"write outputs=\['out'\]"):
        base().computation(Noop, inputs=["queries"], outputs="out")  # type: ignore[arg-type]


def test_no_inputs():
    with pytest.raises(TopologyError, match="has no input streams"):
        base().computation(Noop, inputs={})


def test_constructor_params_are_checked_against_the_class():
    with pytest.raises(
        TopologyError, match=r"WithParams\(\*\*params\) does not fit its constructor"
    ):
        base().computation(WithParams, inputs=["queries"], params={"treshold": 3})
    base().computation(WithParams, inputs=["queries"], params={"threshold": 3})


def test_bad_names_and_options():
    with pytest.raises(TopologyError, match="stream name 'has space' is not valid"):
        base().computation(Noop, inputs=["has space"])
    with pytest.raises(TopologyError, match="options must be a ComputationOptions"):
        base().computation(Noop, inputs=["queries"], options={"exactly_once": False})  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="LatePolicy"):
        ComputationOptions(late="drop")  # type: ignore[arg-type]


def test_late_stream_counts_as_an_output_and_sinks_are_checked():
    t = base()
    t.computation(
        Noop, inputs=["queries"], options=ComputationOptions(late=LatePolicy.to_stream("late_q"))
    )
    t.sink("late_q")
    t.validate()
    t.sink("nope")
    with pytest.raises(TopologyError, match=r"sink 'sink.nope' reads stream 'nope'"):
        t.validate()


def test_a_name_spark_would_skip_is_refused_with_the_reason():
    class _Private(Computation):
        def process_record(self, record): ...

    t = Topology("t")
    t.injector("logs")
    with pytest.raises(
        TopologyError,
        match=r"starting with a letter .*Spark skips those starting with '_' or '.'\); pass name=\.\.\.",
    ):
        t.computation(_Private, inputs=["logs"])
    t.computation(_Private, inputs=["logs"], name="Private")  # the fix the message names


class Forgetful(Computation):
    """Declares two timer families and handles only one of them."""

    close = TimerFamily()
    remind = TimerFamily(tag="r")

    def process_record(self, record):
        self.remind.set(record.timestamp + 10)

    @close.on_fire
    def closed(self, name, timer):
        pass


class OwnDispatch(Computation):
    """A family without a handler, on a class that handles every timer itself."""

    close = TimerFamily()

    def process_record(self, record):
        self.close.set(record.timestamp + 10)

    def process_timer(self, timer):
        self.produce("out", timer.tag)


def test_a_timer_family_without_a_handler_is_refused_before_any_timer_fires():
    t = base()
    t.computation(Forgetful, inputs=["queries"])
    with pytest.raises(
        TopologyError,
        match=r"computation 'Forgetful': timer family 'r' of Forgetful has no handler; "
        r"decorate .* with @remind\.on_fire",
    ) as info:
        t.validate()
    assert "'close'" not in str(info.value)  # the handled family is not named
    with pytest.raises(TopologyError, match="timer family 'r'"):
        Harness(t)


def test_a_family_is_fine_without_a_handler_when_the_class_overrides_process_timer():
    t = base()
    t.computation(OwnDispatch, inputs=["queries"], outputs=["out"])
    h = Harness(t)
    h.inject("queries", [h.record("q", 0, key="k")])
    h.advance_watermark("queries", 100)
    assert h.run().values("out") == ["close"]
