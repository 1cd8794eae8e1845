"""An outage of the registry service (kill -9, restarted a few seconds later on the same port and
store) is waited out by a client with ``patience``: its calls block, say what they wait on and
since when, and finish once the service is back; beyond the patience they stop with a message
naming the registry. Before: five quick retries (~1.5 s) and ``RegistryUnavailableError``, which
stopped a pipeline whose registry was down for 21 s."""

from __future__ import annotations

import threading
import time

import pytest

from id_registry import InvalidRequestError, RegistryUnavailableError, Status
from id_registry.client import HttpRegistryClient, Outage, start_registry


def _restart_later(data_dir: str, port: int, after_s: float, started: list) -> threading.Thread:
    def run() -> None:
        time.sleep(after_s)
        started.append(start_registry(data_dir, port=port))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.timeout(120)
def test_a_client_with_patience_waits_out_a_kill_9_and_a_restart(tmp_path):
    data_dir = str(tmp_path / "registry")
    svc = start_registry(data_dir)
    port = int(svc.url.rsplit(":", 1)[1])
    waits: list[Outage | None] = []
    started: list = []
    try:
        with HttpRegistryClient(
            svc.url, secret=svc.secret, patience=60.0, max_backoff=0.5, on_wait=waits.append
        ) as client:
            assert client.commit_many([("c1", "dc1", 1_000)])[0].status is Status.COMMITTED
            svc.kill()  # kill -9: the store is closed by nobody
            restarter = _restart_later(data_dir, port, 4.0, started)
            begun = time.monotonic()
            out = client.commit_many(
                [("c1", "dc1", 1_000), ("c2", "dc1", 1_000)]
            )  # the same token again: a retry
            waited = time.monotonic() - begun
            restarter.join()
            assert [r.status for r in out] == [Status.COMMITTED, Status.COMMITTED]
            assert 3.0 < waited < 30.0
            # it said what it waited on, from when, and that it is over
            assert waits and waits[-1] is None and isinstance(waits[0], Outage)
            first = waits[0]
            assert (
                first.url == svc.url
                and first.attempts >= 1
                and abs(first.since_ms / 1000 - (time.time() - waited)) < 5
            )
            assert f"waiting on the id registry at {svc.url} since " in first.text()
            assert client.lookup_many(["c1", "c2"])[1].status is Status.FOUND  # nothing lost
    finally:
        for s in (svc, *started):
            s.stop()


@pytest.mark.timeout(60)
def test_beyond_its_patience_a_call_stops_naming_the_registry(tmp_path):
    svc = start_registry(str(tmp_path / "registry"))
    url, secret = svc.url, svc.secret
    svc.kill()
    svc.stop()
    with HttpRegistryClient(url, secret=secret, patience=2.0, max_backoff=0.2) as client:
        begun = time.monotonic()
        with pytest.raises(
            RegistryUnavailableError,
            match=r"the id registry at .* was unreachable for 2s .*attempts",
        ):
            client.commit_many([("c1", "dc1", 1_000)])
        assert 2.0 <= time.monotonic() - begun < 15.0


def test_patience_must_be_sane():
    with pytest.raises(InvalidRequestError, match="patience"):
        HttpRegistryClient("http://127.0.0.1:9", secret="s" * 32, patience=-1)
