"""Fixtures for the watermark authority's tests.

``client`` runs a test on both backends: the core in this process, and the real service
over HTTP (one service per test session, started on a free loopback port). Tests name
their computations and injectors with ``ns`` so they never see each other's.
"""

from __future__ import annotations

import itertools
import tempfile

import pytest

from watermark_authority import InProcessWatermarkClient
from watermark_authority.client import embedded_authority

_names = itertools.count()


@pytest.fixture(scope="session")
def service():
    """The real authority service (a subprocess on 127.0.0.1), shared by the session."""
    with tempfile.TemporaryDirectory(prefix="wa-test-") as d, embedded_authority(d) as svc:
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
