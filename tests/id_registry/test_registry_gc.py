"""The garbage-collection boundary (Photon §2.3): it only moves forward, it deletes what is older,
and what is older is refused ``TOO_OLD`` from then on, on every backend and across restarts."""

from __future__ import annotations

import pytest

from id_registry import (
    GcBackwardsError,
    GcResult,
    InProcessRegistryClient,
    InvalidRequestError,
    Registry,
    RocksBackend,
    Status,
)
from id_registry._backend import MemoryBackend, MetaChangedError


def test_boundary_only_moves_forward(store, clock):
    r = Registry(store, clock=clock)
    assert r.advance_gc(5_000) == GcResult(5_000, 0)
    assert r.advance_gc(5_000) == GcResult(5_000, 0)  # a repeat is harmless
    with pytest.raises(GcBackwardsError) as info:
        r.advance_gc(4_999)
    assert info.value.boundary_ms == 5_000
    assert "only moves forward: it is 5000, and 4999 is before it" in str(info.value)
    assert "joined a second time" in str(info.value)  # says why
    assert r.meta.gc_boundary_ms == 5_000


def test_boundary_in_the_future_is_refused(store, clock):
    r = Registry(store, clock=clock)
    with pytest.raises(InvalidRequestError, match="in the future"):
        r.advance_gc(clock.now + 1)
    assert r.advance_gc(clock.now).boundary_ms == clock.now


def test_gc_deletes_older_entries_only(store, clock):
    r = Registry(store, clock=clock)
    r.commit_many(
        [(f"old-{i}", "a", 1_000 + i) for i in range(50)]
        + [(f"new-{i}", "a", 2_000 + i) for i in range(50)]
    )
    assert r.advance_gc(1_025) == GcResult(1_025, 25)
    assert r.advance_gc(2_000) == GcResult(2_000, 25)
    found = r.lookup_many([f"old-{i}" for i in range(50)] + [f"new-{i}" for i in range(50)])
    assert [x.status for x in found] == [Status.NOT_FOUND] * 50 + [Status.FOUND] * 50


def test_an_entry_older_than_the_boundary_reads_too_old_before_it_is_collected(clock):
    r = Registry(clock=clock)
    r.commit_many([("c", "a", 1_000)])
    r.set_gc_boundary(2_000)  # the boundary is in force; nothing deleted yet
    assert r.lookup_many(["c"])[0] == (Status.TOO_OLD, "a", 1_000)
    assert r.commit_many([("c", "a", 1_000)])[0].status is Status.TOO_OLD
    assert r.clear_many(["c"])[0].status is Status.TOO_OLD
    assert r.collect_garbage() == 1
    assert r.lookup_many(["c"])[0].status is Status.NOT_FOUND


def test_boundary_and_deletions_survive_a_restart(tmp_path, clock):
    r = Registry(RocksBackend(tmp_path / "s"), clock=clock)
    r.commit_many([("a", "t", 1_000), ("b", "t", 3_000)])
    r.advance_gc(2_000)
    r.close()
    r = Registry(RocksBackend(tmp_path / "s"), clock=clock)
    assert r.meta.gc_boundary_ms == 2_000
    assert [x.status for x in r.lookup_many(["a", "b"])] == [Status.NOT_FOUND, Status.FOUND]
    with pytest.raises(GcBackwardsError):
        r.advance_gc(1_000)
    r.close()


def test_collection_runs_in_chunks_behind_waiting_commits(clock):
    """The registry thread deletes a chunk at a time; commits queued meanwhile are not held up."""
    backend = MemoryBackend()
    registry = Registry(backend, clock=clock)
    registry.commit_many([(f"old-{i}", "a", 1_000) for i in range(1_000)])
    with InProcessRegistryClient(registry, gc_chunk=100) as c:
        writes = backend.writes
        assert c.advance_gc(2_000) == GcResult(2_000, 1_000)
        assert backend.writes - writes == 1 + 10  # the boundary, then ten chunks
        assert c.status()["gc_boundary_ms"] == 2_000


def test_gc_over_http_refuses_going_back_with_its_code(client):
    client.advance_gc(1_000)
    with pytest.raises(GcBackwardsError) as info:
        client.advance_gc(10)
    assert info.value.boundary_ms == 1_000
    assert client.commit("x", "t", 999).status is Status.TOO_OLD


class BoundaryMovesMidGroup(MemoryBackend):
    """A store that applies a commit group in two parts, as etcd applies its transactions, and between
    them another server moves the GC boundary: the first part stays stored, the second is refused."""

    def __init__(self) -> None:
        super().__init__()
        self.other_server: Registry | None = None

    def insert_if_absent(self, keys, index_keys, values, meta):
        if self.other_server is None:
            return super().insert_if_absent(keys, index_keys, values, meta)
        other, self.other_server = self.other_server, None
        half = len(keys) // 2
        first = super().insert_if_absent(keys[:half], index_keys[:half], values[:half], meta)
        assert first == [None] * half
        other.set_gc_boundary(2_000)
        raise MetaChangedError


def test_ids_an_earlier_part_of_a_group_stored_are_committed_when_the_boundary_moves_meanwhile(
    clock,
):
    """Before: the retry after the metadata changed answered TOO_OLD for ids the
    group had already stored (registered, never written, never recovered); they are COMMITTED."""
    store = BoundaryMovesMidGroup()
    r, other = Registry(store, clock=clock), Registry(store, clock=clock)
    items = [(f"c{i}", "dc1/b7", 1_000 + i) for i in range(10)]
    store.other_server = other
    out = r.commit_many(items)
    assert r.meta.gc_boundary_ms == 2_000
    held = [
        found.status is Status.TOO_OLD and found.token == "dc1/b7"
        for found in r.lookup_many([i for i, _, _ in items])
    ]
    assert held == [True] * 5 + [False] * 5  # the first part is stored under the group's token
    assert [x.status for x in out] == [Status.COMMITTED] * 5 + [Status.TOO_OLD] * 5
