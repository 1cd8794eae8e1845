"""kill -9 of the real registry service (RocksDB, fsync per write) while commits stream in, then a
restart on the same store: every acknowledged commit is still there under its token, another
token still conflicts, and the batches that were in flight at the kill commit when re-sent
with their tokens (whatever the kill did to them)."""

from __future__ import annotations

import threading
import time

import pytest

from id_registry import RegistryError, Status
from id_registry.client import start_registry


@pytest.mark.timeout(180)
def test_kill_9_mid_stream_loses_no_acknowledged_commit(tmp_path):
    data_dir = str(tmp_path / "registry")
    acked: dict[str, str] = {}  # id -> token, for every COMMITTED answer received
    in_flight: list[
        list[tuple[str, str, int]]
    ] = []  # batches sent and not answered when the service died
    lock = threading.Lock()
    batch_no = [0]
    for cycle in range(2):
        svc = start_registry(data_dir)
        try:
            stop = threading.Event()

            def writer(w: int, svc=svc, stop=stop, cycle=cycle) -> None:
                with svc.client(retries=0, timeout=5.0) as c:
                    while not stop.is_set():
                        with lock:
                            batch_no[0] += 1
                            n = batch_no[0]
                        batch = [
                            (f"c{cycle}-w{w}-b{n}-{i}", f"joiner-{w}", 1_000 + n)
                            for i in range(200)
                        ]
                        try:
                            out = c.commit_many(batch)
                        except RegistryError:
                            with lock:
                                in_flight.append(batch)
                            return
                        assert all(r.status is Status.COMMITTED for r in out)
                        with lock:
                            acked.update((i, t) for i, t, _ in batch)

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
            for t in threads:
                t.start()
            target = len(acked) + 3_000
            deadline = time.monotonic() + 60
            while (
                len(acked) < target and time.monotonic() < deadline
            ):  # kill by progress, mid-stream
                time.sleep(0.005)
            svc.kill()
            stop.set()
            for t in threads:
                t.join(30)
        finally:
            svc.stop()
        assert len(acked) >= target, "the writers made no progress before the kill"

    svc = start_registry(data_dir)
    try:
        with svc.client(timeout=30.0) as c:
            ids = list(acked)
            found = []
            for i in range(0, len(ids), 5_000):
                found += c.lookup_many(ids[i : i + 5_000])
            assert [(f.status, f.token) for f in found] == [(Status.FOUND, acked[i]) for i in ids]
            stolen = c.commit_many([(i, "thief", 1_000) for i in ids[:5_000]])
            assert all(
                r.status is Status.CONFLICT and r.holder == acked[i]
                for r, i in zip(stolen, ids[:5_000], strict=True)
            )
            for batch in in_flight:  # the joiner's retry after a lost answer (Photon §3.3.2)
                assert all(r.committed for r in c.commit_many(batch))
    finally:
        svc.stop()
