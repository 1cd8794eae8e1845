"""Strong and weak productions under crashes (MillWheel §6.1.2, §6.1.3, §7.1)."""

from __future__ import annotations

import random

import pytest

from millwheel import Computation, ComputationError, ComputationOptions, Record, Topology
from millwheel.testing import Crash, Harness


class Stamp(Computation):
    """Non-deterministic on purpose: each production carries a random draw."""

    def process_record(self, record):
        self.produce("out", (record.value, random.random()))


class Collect(Computation):
    def process_record(self, record):
        self.state.set([*self.state.get([]), record.value])


def topology(strong: bool, consumer_exactly_once: bool = True):
    t = Topology("p")
    t.injector("in")
    t.computation(
        Stamp,
        inputs={"in": lambda r: r.value},
        outputs=["out"],
        options=ComputationOptions(strong_productions=strong),
    )
    t.computation(
        Collect,
        inputs={"out": lambda r: "all"},
        options=ComputationOptions(exactly_once=consumer_exactly_once),
    )
    return Harness(t)


def test_strong_productions_are_checkpointed_then_delivered_and_acknowledged():
    h = topology(strong=True)
    h.inject("in", [Record(None, "x", 1, "a")])
    h.process("Stamp", deliver=False)
    (pending,) = h.pending_productions("Stamp", "x")
    assert h.output("out") == []
    h.deliver("Stamp")
    assert h.output("out") == [pending.record]
    assert h.pending_productions("Stamp", "x") == []


def test_crash_after_commit_before_send_recovers_the_checkpointed_version():
    h = topology(strong=True)
    h.inject("in", [Record(None, "x", 1, "a")])
    h.process("Stamp", crash=Crash.AFTER_COMMIT)
    (checkpointed,) = h.pending_productions("Stamp", "x")
    assert h.output("out") == []
    h.restart("Stamp")  # the recovery scan finds the pending production (§7.1)
    h.run()
    assert h.output("out") == [checkpointed.record]  # the same bits, not a new draw
    assert h.state("Collect", "all") == [checkpointed.record.value]


def test_crash_after_send_before_ack_redelivers_and_the_consumer_drops_it():
    h = topology(strong=True)
    h.inject("in", [Record(None, "x", 1, "a")])
    h.process("Stamp", crash=Crash.AFTER_DELIVER)
    h.restart("Stamp")
    h.run()
    first, again = h.output("out")
    assert first == again  # bit-wise the same record, same id
    assert h.state("Collect", "all") == [first.value]
    assert h.metrics("Collect")["duplicates"] == 1


def test_weak_productions_may_differ_on_retry_and_are_not_in_the_envelope():
    h = topology(strong=False)
    h.inject("in", [Record(None, "x", 1, "a")])
    h.process("Stamp", crash=Crash.BEFORE_COMMIT)  # sent, then died before the checkpoint
    h.restart("Stamp")
    h.run()
    first, retry = h.output("out")
    assert first.id == retry.id  # ids come from the committed envelope: deterministic
    assert first.value != retry.value  # but the content was recomputed (random draw)
    assert h.metrics("Collect")["duplicates"] == 1  # dedup keeps the first, drops the retry
    assert h.state("Collect", "all") == [first.value]


def test_without_consumer_dedup_a_weak_retry_is_a_duplicate():
    h = topology(strong=False, consumer_exactly_once=False)
    h.inject("in", [Record(None, "x", 1, "a")])
    h.process("Stamp", crash=Crash.BEFORE_COMMIT)
    h.restart("Stamp")
    h.run()
    assert len(h.state("Collect", "all")) == 2


def test_production_ids_are_unique_per_key_and_deterministic():
    h = topology(strong=True)
    h.inject("in", [Record(None, v, 1, f"id{i}") for i, v in enumerate("xyxyx")])
    h.run()
    ids = [r.id for r in h.output("out")]
    assert len(set(ids)) == 5
    h2 = topology(strong=True)
    h2.inject("in", [Record(None, v, 1, f"id{i}") for i, v in enumerate("xyxyx")])
    h2.run()
    assert [r.id for r in h2.output("out")] == ids


def test_producing_to_an_undeclared_stream_names_the_fix():
    class Stray(Computation):
        def process_record(self, record):
            self.produce("nowhere", 1)

    h = Harness.for_computation(Stray, inputs=["in"], outputs=["out"])
    h.inject("in", [Record("k", 1, 1, "a")])
    with pytest.raises(
        ComputationError,
        match=r"'Stray' produced to stream 'nowhere'.*declared outputs: out.*outputs=\[",
    ):
        h.run()


def test_default_production_timestamp_is_the_source_records():
    h = topology(strong=True)
    h.inject("in", [Record(None, "x", 1234, "a")])
    h.run()
    assert h.output("out")[0].timestamp == 1234
