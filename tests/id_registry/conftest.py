"""Fixtures for the IdRegistry's tests.

* ``store`` — a fresh backend of each kind in turn: in memory, RocksDB in a temporary
  directory, and etcd (three members on loopback, shared by the session, one key prefix per
  test; skipped with the reason when etcd is not installed);
* ``client`` — a :class:`RegistryClient` on each side in turn: in process, and over HTTP
  to the real Starlette app served by uvicorn in a thread (fresh registry per test, a clock
  the test controls);
* ``serve_app`` — ``served(worker)``, the app over a worker of the test's own (e.g. on a
  ``gated`` backend whose writes wait for the test), with the ``secret`` fixture's secret;
* ``service`` — the real ``python -m id_registry serve`` subprocess, shared by the session;
  ``http`` / ``anon`` raw HTTP clients of it with and without its secret.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator

import pytest

from id_registry import (
    EtcdBackend,
    HttpRegistryClient,
    InProcessRegistryClient,
    MemoryBackend,
    Registry,
    RocksBackend,
)
from id_registry._server import create_app, registry_guard
from id_registry._worker import RegistryWorker
from id_registry.client import embedded_registry
from id_registry.testing import LocalEtcdCluster, etcd_binary
from servicekit import Secret, testing
from servicekit.ports import free_port

#: ``http`` / ``anon``: raw HTTP clients of ``service``, with and without its secret
http, anon = testing.http, testing.anon

SECRET = Secret("registry-secret-for-the-tests", source="the tests")
#: wall time of the tests' registries (ms): event times in the tests are well before it
NOW = 10_000_000


class FakeClock:
    """Wall time the test controls (milliseconds)."""

    def __init__(self, now: int = NOW) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@contextlib.contextmanager
def served(worker: RegistryWorker, secret: Secret = SECRET) -> Iterator[str]:
    """The real app over ``worker`` on a free loopback port, uvicorn in a thread; yields its URL."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(
        create_app(worker, guard=registry_guard(secret)),
        host="127.0.0.1",
        port=port,
        log_level="error",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            msg = "the in-thread registry server did not start"
            raise RuntimeError(msg)
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


class GatedBackend(MemoryBackend):
    """A backend whose durable writes wait at a gate the test opens: a slow fsync or Paxos round."""

    """:class:`MemoryBackend` whose writes block while :attr:`gate` is closed (it starts open)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        #: set when a write is waiting at the closed gate
        self.waiting = threading.Event()

    def _write(self, puts, deletes) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait(30)
        super()._write(puts, deletes)


_names = itertools.count()


@pytest.fixture
def secret() -> Secret:
    """The secret of the apps ``serve_app`` serves."""
    return SECRET


@pytest.fixture
def serve_app():
    """``served(worker)``: the real app over a worker, served by uvicorn in a thread (a context manager yielding the URL)."""
    return served


@pytest.fixture
def gated() -> GatedBackend:
    """A fresh :class:`GatedBackend` (writes wait while its ``gate`` is closed)."""
    return GatedBackend()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ns() -> str:
    """A fresh id prefix, so tests sharing a service never share an id."""
    return f"t{next(_names)}-{time.monotonic_ns()}-"


needs_etcd = [
    pytest.mark.etcd,
    pytest.mark.skipif(
        etcd_binary() is None,
        reason="etcd is not installed (scripts/setup.sh --test installs Debian's etcd-server; CI has it)",
    ),
]


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory) -> Iterator[LocalEtcdCluster]:
    """Three etcd members on loopback, shared by the session (tests that kill members start their own)."""
    if etcd_binary() is None:
        pytest.skip(
            "etcd is not installed (scripts/setup.sh --test installs Debian's etcd-server; CI has it)"
        )
    with LocalEtcdCluster(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


@pytest.fixture(params=["memory", "rocksdb", pytest.param("etcd", marks=needs_etcd)])
def store(request, tmp_path):
    """A fresh, empty backend of each kind."""
    if request.param == "memory":
        backend = MemoryBackend()
    elif request.param == "rocksdb":
        backend = RocksBackend(tmp_path / "rocks")
    else:
        cluster = request.getfixturevalue("etcd_cluster")
        backend = EtcdBackend(
            cluster.endpoints, prefix=f"test/{next(_names)}-{time.monotonic_ns()}/"
        )
    yield backend
    backend.close()


@pytest.fixture(params=["in_process", "http"])
def client(request, clock):
    """A client of a fresh registry (in memory, ``clock``) on each side in turn."""
    registry = Registry(clock=clock)
    if request.param == "in_process":
        with InProcessRegistryClient(registry) as c:
            yield c
        return
    with (
        served(RegistryWorker(registry)) as url,
        HttpRegistryClient(url, secret=SECRET, timeout=10.0) as c,
    ):
        yield c


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    """The real registry service (a subprocess on 127.0.0.1, RocksDB, fsync), shared by the session."""
    with embedded_registry(str(tmp_path_factory.mktemp("registry"))) as svc:
        yield svc
