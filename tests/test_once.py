"""Productions at most once across pipelines (Photon §2, ``millwheel/_once.py``), on the harness.

Two harnesses sharing one registry are two pipelines ("datacenters") reading the same
input: every event is produced by exactly one of them; a replay of a pipeline's own
batch still produces its output; an event older than the registry's GC boundary is a
dead letter, not a silent drop.
"""

from __future__ import annotations

import pytest

from millwheel import Computation, ComputationError, Record, Stage
from millwheel._once import (
    Member,
    MemoryOnceRegistry,
    OnceResult,
    PipelineNameTaken,
    holder_of,
    join_roster,
    roster,
)
from millwheel.testing import Crash, Harness


class JoinOnce(Computation):
    def process_record(self, record: Record) -> None:
        self.produce("joined", record.value, once_id=record.value["click"])


def _pipeline(registry, name, **kw) -> Harness:
    return Harness.for_computation(
        JoinOnce,
        inputs={"clicks": lambda r: r.value["query"]},
        outputs=["joined"],
        registry=registry,
        pipeline=name,
        **kw,
    )


def _clicks(n: int) -> list[Record]:
    return [
        Record(None, {"click": f"c{i}", "query": f"q{i % 7}"}, 1_000 + i, f"r{i}") for i in range(n)
    ]


def test_two_pipelines_on_the_same_input_produce_each_event_once_between_them():
    registry = MemoryOnceRegistry()
    a, b = _pipeline(registry, "dc1"), _pipeline(registry, "dc2")
    clicks = _clicks(50)
    a.inject("clicks", clicks[:30])
    b.inject("clicks", clicks[20:])  # dc2 is behind on the first 20, ahead on the rest
    b.run()
    a.run()
    a.inject("clicks", clicks[30:])
    b.inject("clicks", clicks[:20])
    a.run()
    b.run()
    joined = [v["click"] for v in a.values("joined")] + [v["click"] for v in b.values("joined")]
    assert sorted(joined) == sorted(f"c{i}" for i in range(50))  # every click once, none twice
    assert a.metrics("JoinOnce")["once_conflicts"] + b.metrics("JoinOnce")["once_conflicts"] == 50
    assert registry.calls <= 4  # one registry call per round of a computation, not per record


def test_a_replayed_batch_still_produces_its_output():
    registry = MemoryOnceRegistry()
    a = _pipeline(registry, "dc1")
    a.inject("clicks", _clicks(5))
    a.process("JoinOnce", crash=Crash.BEFORE_COMMIT)  # committed to the registry, then died
    a.restart("JoinOnce")
    a.run()
    assert sorted(v["click"] for v in a.values("joined")) == [f"c{i}" for i in range(5)]


def test_strong_conflicts_are_not_left_pending_in_the_checkpoint():
    registry = MemoryOnceRegistry()
    registry.commit_many([("c1", "someone-else", 1)])
    a = _pipeline(registry, "dc1")
    a.inject("clicks", _clicks(3))
    a.process("JoinOnce", deliver=False)
    pending = [
        p.record.value["click"]
        for k in a.keys("JoinOnce")
        for p in a.pending_productions("JoinOnce", k)
    ]
    assert sorted(pending) == ["c0", "c2"]  # checkpointed without the one held elsewhere
    a.run()
    assert sorted(v["click"] for v in a.values("joined")) == ["c0", "c2"]


def test_events_older_than_the_gc_boundary_are_dead_letters():
    registry = MemoryOnceRegistry()
    registry.gc_boundary = 1_002
    a = _pipeline(registry, "dc1", raise_errors=False)
    a.inject("clicks", _clicks(4))
    a.run()
    assert sorted(v["click"] for v in a.values("joined")) == ["c2", "c3"]
    dead = sorted(r.value.record.value["click"] for r in a.dead_letters())
    assert dead == ["c0", "c1"] and {r.value.stage for r in a.dead_letters()} == {
        Stage.ONCE_TOO_OLD
    }


def test_the_memory_registry_is_a_first_token_wins_map():
    reg = MemoryOnceRegistry()
    assert reg.commit_many([("x", "t1", 5), ("x", "t2", 5), ("x", "t1", 5)]) == [
        OnceResult.COMMITTED,
        OnceResult.CONFLICT,
        OnceResult.COMMITTED,
    ]
    reg.clear("x")
    assert reg.commit_many([("x", "t2", 5)]) == [OnceResult.COMMITTED]


def test_a_bad_once_id_fails_its_record():
    class Bad(Computation):
        def process_record(self, record):
            self.produce("joined", 1, once_id=42)

    h = Harness.for_computation(Bad, inputs=["clicks"], outputs=["joined"], raise_errors=False)
    h.inject("clicks", [Record("k", 1, 1, "a")])
    h.run()
    (dead,) = h.dead_letters()
    assert "once_id" in dead.value.reason
    with pytest.raises(ComputationError, match="once_id"):
        bad = Harness.for_computation(Bad, inputs=["clicks"], outputs=["joined"])
        bad.inject("clicks", [Record("k", 1, 1, "a")])
        bad.run()


def test_two_pipelines_under_the_default_name_still_emit_each_event_once():
    # the token was once (name, computation, key); two harnesses left at the
    # default name, sharing a registry, emitted every click twice
    registry = MemoryOnceRegistry()
    a = Harness.for_computation(
        JoinOnce,
        inputs={"clicks": lambda r: r.value["query"]},
        outputs=["joined"],
        registry=registry,
    )
    b = Harness.for_computation(
        JoinOnce,
        inputs={"clicks": lambda r: r.value["query"]},
        outputs=["joined"],
        registry=registry,
    )
    for h in (a, b):
        h.inject("clicks", _clicks(1))
        h.run()
    assert [v["click"] for v in a.values("joined") + b.values("joined")] == ["c0"]
    assert b.metrics("JoinOnce")["once_conflicts"] == 1
    assert holder_of(registry.holder("c0")) == a.pipeline_id and a.pipeline_id.startswith(
        "harness#"
    )


def test_the_roster_knows_the_pipelines_and_refuses_a_second_directory_under_one_name():
    registry = MemoryOnceRegistry()
    assert join_roster(registry, "dc1", "e1", "host:/runs/a") == [
        Member("dc1", "e1", "host:/runs/a")
    ]
    join_roster(registry, "dc2", "e2", "host:/runs/b")
    assert (
        join_roster(registry, "dc1", "e1", "host:/runs/a")[0].id == "dc1#e1"
    )  # a restart: already in
    with pytest.raises(
        PipelineNameTaken,
        match=r"held in this IdRegistry by the run directory host:/runs/a .*--pipeline NAME",
    ):
        join_roster(registry, "dc1", "e9", "host:/runs/c")
    # the same directory under a new epoch (it lost its checkpoint) joins beside its old one
    join_roster(registry, "dc1", "e3", "host:/runs/a")
    assert [m.id for m in roster(registry)] == ["dc1#e1", "dc2#e2", "dc1#e3"]
