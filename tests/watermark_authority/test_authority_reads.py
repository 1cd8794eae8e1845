"""Reads never queue behind writes: a watermark read is answered from the published snapshot
while the writer thread is stuck in a journal write (§7.2: only journaled values are shown).

The service runs in this process (uvicorn on a thread) over a journal the test can stall.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from servicekit import Secret
from watermark_authority import Authority, MemoryJournal
from watermark_authority._server import authority_guard, create_app


class StallingJournal(MemoryJournal):
    """A journal whose commits wait for ``release`` while ``stall`` is set (a slow disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.stall = threading.Event()
        self.release = threading.Event()
        self.stalled = threading.Event()

    def commit(self, records):
        if self.stall.is_set():
            self.stalled.set()
            self.release.wait(10)
        super().commit(records)


@pytest.fixture
def served():
    """``(url, secret, journal)`` of an authority served from this process."""
    journal = StallingJournal()
    secret = Secret("reads-test-secret-0123456789", source="the test")
    app = create_app(Authority(journal), guard=authority_guard(secret))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the in-process service did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", secret, journal
    journal.release.set()
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.mark.timeout(30)
def test_a_read_is_answered_while_a_write_is_stuck_in_the_journal(served):
    url, secret, journal = served
    with httpx.Client(base_url=url, headers=secret.header(), timeout=10) as http:
        token = http.post("/v1/acquire", json={"computation": "c", "intervals": ["a"]}).json()[
            "tokens"
        ]["a"]
        assert (
            http.post(
                "/v1/report", json={"computation": "c", "reports": [["a", token, 1_000]]}
            ).status_code
            == 200
        )

        journal.stall.set()
        writer = threading.Thread(
            target=lambda: http.post(
                "/v1/report", json={"computation": "c", "reports": [["a", token, 5_000]]}
            )
        )
        writer.start()
        assert journal.stalled.wait(5), "the write never reached the journal"
        with httpx.Client(base_url=url, timeout=10) as reader:  # a consumer, no secret needed
            # the write stays stuck until the test releases it: reads that waited behind it would time out
            assert (
                reader.get("/v1/watermark", params={"name": "c"}).json()["low_watermark"] == 1_000
            )  # not yet durable: not shown
            assert reader.get("/v1/watermarks").json()["watermarks"] == {"c": 1_000}
            assert writer.is_alive() and not journal.release.is_set(), (
                "the write was not stuck while the reads were answered"
            )
            journal.stall.clear()
            journal.release.set()
            writer.join(10)
            assert (
                reader.get("/v1/watermark", params={"name": "c"}).json()["low_watermark"] == 5_000
            )  # journaled, then shown


def test_the_snapshot_is_replaced_not_changed():
    a = Authority(clock=lambda: 0)
    t = a.acquire("c", ["a"])["a"]
    before = a.published()
    a.report("c", [("a", t, 7, None)])
    assert dict(before) == {"c": -(2**63)} and dict(a.published()) == {"c": 7}
    with pytest.raises(TypeError):
        a.published()["c"] = 9  # type: ignore[index]
