"""Throttling (Photon §3.2.2, §3.3.2): beyond a bound on requests or items in flight, a commit is
refused at once (429, ``Retry-After``, nothing done); the HTTP client waits and sends it again."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from id_registry import HttpRegistryClient, Registry, ThrottledError
from id_registry._worker import RegistryWorker


def _stalled(worker, backend):
    """Close the gate and park one write of 60 items behind it."""
    backend.gate.clear()
    parked = worker.commit([(f"p{i}", "t", 1_000) for i in range(60)])
    assert backend.waiting.wait(10)
    return parked


def test_items_beyond_the_bound_are_refused_until_the_queue_drains(clock, gated):
    worker = RegistryWorker(Registry(gated, clock=clock), max_inflight_items=100)
    try:
        parked = _stalled(worker, gated)
        queued = worker.commit([(f"q{i}", "t", 1_000) for i in range(30)])  # 90 in flight
        with pytest.raises(ThrottledError) as info:
            worker.commit([(f"r{i}", "t", 1_000) for i in range(20)])  # would be 110
        assert "90 items in flight" in str(info.value) and "nothing was done" in str(info.value)
        assert 10 <= info.value.retry_after_ms <= 5_000
        small = worker.commit([(f"s{i}", "t", 1_000) for i in range(10)])  # 100: fits
        gated.gate.set()
        assert all(len(f.result(10)) == n for f, n in [(parked, 60), (queued, 30), (small, 10)])
        assert worker.inflight_items == 0
        assert (
            len(worker.commit([(f"r{i}", "t", 1_000) for i in range(20)]).result(10)) == 20
        )  # drained: admitted
        assert worker.registry.stats.throttled == 1
        assert [x.status.value for x in worker.registry.lookup_many(["r0"])] == ["found"]
    finally:
        worker.close()


def test_a_large_request_is_admitted_when_nothing_is_in_flight(clock):
    worker = RegistryWorker(Registry(clock=clock), max_inflight_items=10)
    try:
        assert len(worker.commit([(f"x{i}", "t", 1_000) for i in range(500)]).result(10)) == 500
    finally:
        worker.close()


def test_requests_beyond_the_bound_are_refused(clock, gated):
    worker = RegistryWorker(Registry(gated, clock=clock), max_inflight_requests=2)
    try:
        _stalled(worker, gated)
        worker.commit([("a", "t", 1_000)])
        with pytest.raises(ThrottledError, match="2 requests in flight"):
            worker.commit([("b", "t", 1_000)])
        with pytest.raises(ThrottledError):
            worker.call(lambda: None)  # lookups and clears count too
        assert (
            worker.call(lambda: 42, throttle=False).done() is False
        )  # the status page is never refused
    finally:
        gated.gate.set()
        worker.close()


def test_http_answers_429_with_retry_after_and_changes_nothing(clock, gated, serve_app, secret):
    worker = RegistryWorker(Registry(gated, clock=clock), max_inflight_items=100)
    with (
        serve_app(worker) as url,
        httpx.Client(base_url=url, headers=secret.header(), timeout=10) as raw,
    ):
        parked = _stalled(worker, gated)
        r = raw.post("/v1/commit", json={"items": [[f"r{i}", "t", 1_000] for i in range(50)]})
        assert r.status_code == 429, r.text
        body = r.json()
        assert body["error"] == "throttled" and 10 <= body["retry_after_ms"] <= 5_000
        assert int(r.headers["retry-after"]) >= 1
        gated.gate.set()
        parked.result(10)
        r = raw.post("/v1/lookup", json={"ids": ["r0"]})
        assert r.json()["results"] == [["not_found", None, None]]


def test_the_client_honours_retry_after_and_gets_through(clock, gated, serve_app, secret):
    worker = RegistryWorker(Registry(gated, clock=clock), max_inflight_items=100)
    with (
        serve_app(worker) as url,
        HttpRegistryClient(url, secret=secret, throttle_timeout=30.0) as c,
    ):
        parked = _stalled(worker, gated)
        threading.Timer(0.5, gated.gate.set).start()
        started = time.monotonic()
        out = c.commit_many([(f"r{i}", "t", 1_000) for i in range(50)])
        assert all(x.committed for x in out)
        assert c.throttled >= 1 and time.monotonic() - started >= 0.4  # it waited, then got through
        parked.result(10)
        assert c.status()["stats"]["throttled"] == c.throttled


def test_the_client_gives_up_after_its_throttle_timeout(clock, gated, serve_app, secret):
    worker = RegistryWorker(Registry(gated, clock=clock), max_inflight_items=100)
    with (
        serve_app(worker) as url,
        HttpRegistryClient(url, secret=secret, throttle_timeout=0.3) as c,
    ):
        _stalled(worker, gated)
        try:
            with pytest.raises(ThrottledError, match="retry in about"):
                c.commit_many([(f"r{i}", "t", 1_000) for i in range(50)])
        finally:
            gated.gate.set()


def test_http_refuses_requests_beyond_the_bound_before_reading_them(
    clock, gated, serve_app, secret
):
    worker = RegistryWorker(Registry(gated, clock=clock), max_inflight_requests=2)
    with (
        serve_app(worker) as url,
        HttpRegistryClient(url, secret=secret) as c,
        httpx.Client(base_url=url, headers=secret.header(), timeout=10) as raw,
    ):
        gated.gate.clear()
        pending = [
            threading.Thread(target=c.commit_many, args=([(f"a{i}", "t", 1_000)],))
            for i in range(2)
        ]
        for t in pending:
            t.start()
        deadline = time.monotonic() + 10
        while worker.inflight_requests < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = raw.post("/v1/lookup", json={"ids": ["a0"]})
        assert r.status_code == 429 and r.headers["connection"] == "close", r.text
        assert r.json()["error"] == "throttled" and "2 requests in progress" in r.json()["message"]
        gated.gate.set()
        for t in pending:
            t.join(10)
        assert raw.post("/v1/lookup", json={"ids": ["a0"]}).json()["results"][0][0] == "found"
