"""Server-side batching (Photon §2.2.1): requests that arrive while a durable write is in progress
are coalesced into the next one, one write for the whole group, answered once it is durable;
inside a group the earlier request wins a conflict."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from id_registry import CommitResult, HttpRegistryClient, Registry, RegistryUnavailableError, Status
from id_registry._worker import RegistryWorker


def test_requests_queued_behind_a_write_become_one_write(clock, gated):
    backend = gated
    worker = RegistryWorker(Registry(backend, clock=clock))
    try:
        backend.gate.clear()
        first = worker.commit([("a0", "t0", 1_000)])
        assert backend.waiting.wait(10)  # the first group is being written
        writes = backend.writes
        queued = [
            worker.commit([(f"a{i}", f"t{i}", 1_000), (f"b{i}", f"t{i}", 1_000)])
            for i in range(1, 20)
        ]
        assert not any(
            f.done() for f in [first, *queued]
        )  # nobody answered before the write is durable
        backend.gate.set()
        assert first.result(10) == [CommitResult(Status.COMMITTED)]
        assert all(f.result(10) == [CommitResult(Status.COMMITTED)] * 2 for f in queued)
        assert backend.writes - writes == 2  # 20 requests, 2 durable writes
        stats = worker.registry.stats
        assert stats.requests == 20 and stats.groups == 2 and stats.committed == 39
        assert stats.snapshot()["group_sizes"] == {"1-1": 1, "32-63": 1}
    finally:
        worker.close()


def test_inside_a_group_the_earlier_request_wins(clock, gated):
    backend = gated
    worker = RegistryWorker(Registry(backend, clock=clock))
    try:
        backend.gate.clear()
        worker.commit([("warmup", "t", 1_000)])
        assert backend.waiting.wait(10)
        a = worker.commit([("x", "joiner-a", 1_000)])
        b = worker.commit([("x", "joiner-b", 1_000), ("y", "joiner-b", 1_000)])
        c = worker.commit([("x", "joiner-a", 1_000)])  # joiner-a's retry in the same group
        backend.gate.set()
        assert a.result(10) == [CommitResult(Status.COMMITTED)]
        assert b.result(10) == [
            CommitResult(Status.CONFLICT, "joiner-a"),
            CommitResult(Status.COMMITTED),
        ]
        assert c.result(10) == [CommitResult(Status.COMMITTED)]
    finally:
        worker.close()


def test_a_group_is_cut_at_max_group_items(clock, gated):
    backend = gated
    worker = RegistryWorker(Registry(backend, clock=clock), max_group_items=10)
    try:
        backend.gate.clear()
        worker.commit([("w", "t", 1)])
        assert backend.waiting.wait(10)
        writes = backend.writes
        futures = [
            worker.commit([(f"{i}-{j}", "t", 1) for j in range(4)]) for i in range(6)
        ]  # 24 items
        backend.gate.set()
        assert all(len(f.result(10)) == 4 for f in futures)
        assert backend.writes - writes == 1 + 3  # the first; then groups of 8, 8, 8 items
    finally:
        worker.close()


def test_concurrent_http_requests_share_durable_writes(clock, gated, serve_app, secret):
    backend = gated
    worker = RegistryWorker(Registry(backend, clock=clock))
    with serve_app(worker) as url, HttpRegistryClient(url, secret=secret, timeout=20.0) as c:
        backend.gate.clear()
        with ThreadPoolExecutor(16) as pool:
            first = pool.submit(c.commit_many, [("first", "t", 1_000)])
            assert backend.waiting.wait(10)
            writes = backend.writes
            rest = [
                pool.submit(c.commit_many, [(f"id-{i}-{j}", f"tok-{i}", 1_000) for j in range(50)])
                for i in range(15)
            ]
            deadline = threading.Event()
            while worker.inflight_requests < 16 and not deadline.wait(
                0.01
            ):  # every request queued behind the gate
                pass
            backend.gate.set()
            assert first.result(20)[0].committed
            assert all(all(r.committed for r in f.result(20)) for f in rest)
        assert backend.writes - writes <= 2
        assert c.status()["stats"]["groups"] <= 3


def test_the_real_service_coalesces_concurrent_requests(service, ns):
    """32 joiners at once on the real service (RocksDB, fsync per write): fewer durable writes than requests."""
    with service.client(timeout=30.0) as c:
        before = c.status()
        with ThreadPoolExecutor(32) as pool:
            jobs = [
                pool.submit(
                    c.commit_many, [(f"{ns}{i}-{k}-{j}", f"tok-{i}", 1_000) for j in range(20)]
                )
                for i in range(32)
                for k in range(4)
            ]
            assert all(all(r.committed for r in f.result(60)) for f in jobs)
        after = c.status()
    requests = after["stats"]["requests"] - before["stats"]["requests"]
    writes = after["backend"]["durable_writes"] - before["backend"]["durable_writes"]
    assert requests == 128
    assert writes < requests


def test_a_closed_worker_refuses_at_once_and_answered_what_was_queued(clock, gated):
    worker = RegistryWorker(Registry(gated, clock=clock))
    gated.gate.clear()
    first = worker.commit([("a", "t", 1_000)])
    assert gated.waiting.wait(10)
    queued = worker.commit([("b", "t", 1_000)])
    threading.Timer(0.2, gated.gate.set).start()
    worker.close()  # drains: everything queued before the close is answered
    assert first.result(10)[0].committed and queued.result(10)[0].committed
    for submit in (
        lambda: worker.commit([("c", "t", 1_000)]),
        lambda: worker.call(lambda: 1, throttle=False),
        worker.status,
    ):
        with pytest.raises(RegistryUnavailableError, match="shutting down"):
            submit()
