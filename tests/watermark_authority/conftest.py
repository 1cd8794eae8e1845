"""Fixtures for the watermark authority's tests.

``client`` runs a test on both backends: the core in this process, and the real service
over HTTP (one service per test session, started on a free loopback port, its secret
generated in its data directory). ``http`` is a raw HTTP client of that service holding
its secret, ``anon`` one without. Tests name their computations and injectors with ``ns``
so they never see each other's.
"""

from __future__ import annotations

import itertools
import tempfile

import pytest

from servicekit import testing
from watermark_authority import InProcessWatermarkClient
from watermark_authority.client import embedded_authority

#: ``http`` / ``anon``: raw HTTP clients of ``service``, with and without its secret
http, anon = testing.http, testing.anon

_names = itertools.count()


@pytest.fixture(scope="session")
def service():
    """The real authority service (a subprocess on 127.0.0.1), shared by the session; it samples
    its watermarks for the dashboard 5 times a second, so a test waits a fifth of a second for one."""
    with (
        tempfile.TemporaryDirectory(prefix="wa-test-") as d,
        embedded_authority(d, extra_args=["--sample-interval", "0.2"]) as svc,
    ):
        yield svc


@pytest.fixture(params=["in_process", "http"])
def client(request):
    """A :class:`WatermarkClient` on each backend in turn."""
    if request.param == "in_process":
        yield InProcessWatermarkClient()
        return
    svc = request.getfixturevalue("service")
    c = svc.client(timeout=10.0, retries=2)
    yield c
    c.close()


@pytest.fixture
def seeded(http, ns):
    """A computation with two reported intervals and an injector, and a snapshot function."""
    c, inj = f"{ns}c", f"{ns}logs"
    tokens = http.post("/v1/acquire", json={"computation": c, "intervals": ["a", "b"]}).json()[
        "tokens"
    ]
    r = http.post(
        "/v1/report",
        json={
            "computation": c,
            "reports": [
                ["a", tokens["a"], 1_000],
                {"interval": "b", "token": tokens["b"], "oldest_work": 2_000, "pending": 4},
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert (
        http.post("/v1/injectors/expect", json={"injector": inj, "processes": ["p0"]}).status_code
        == 200
    )
    assert (
        http.post(
            "/v1/injectors/report", json={"injector": inj, "process": "p0", "low_watermark": 3_000}
        ).status_code
        == 200
    )

    def snapshot():
        return (
            http.get("/v1/intervals", params={"computation": c}).json(),
            http.get("/v1/watermarks").json()["watermarks"].get(c),
            http.get("/v1/status").json()["injectors"][inj]["processes"],
            http.get("/v1/watermark", params={"name": c, "pct": "99"}).json(),
        )

    return c, inj, tokens, snapshot


@pytest.fixture
def ns():
    """A fresh name prefix, so tests sharing one service never share a computation."""
    return f"t{next(_names)}-"


class FakeClock:
    """Wall time the test controls (milliseconds)."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock():
    return FakeClock()
