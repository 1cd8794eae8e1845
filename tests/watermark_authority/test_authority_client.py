"""The clients: retries and timeouts over HTTP, the embedded service, the same errors everywhere."""

from __future__ import annotations

import os

import httpx
import pytest

from watermark_authority import (
    AuthorityUnavailableError,
    HttpWatermarkClient,
    InvalidRequestError,
    StaleTokenError,
    WatermarkClient,
    embedded_authority,
    open_authority,
)
from watermark_authority.client import URL_ENV


def flaky(failures: int, error: type[Exception] = httpx.ConnectError, answer: tuple[int, dict] = (200, {"tokens": {"a": 7}})):
    """A transport that fails ``failures`` times, then answers; counts the attempts."""
    calls = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) <= failures:
            if isinstance(error, type) and issubclass(error, Exception):
                msg = "boom"
                raise error(msg, request=request)
            return httpx.Response(error)  # an HTTP status
        return httpx.Response(answer[0], json=answer[1])

    return httpx.MockTransport(handle), calls


def test_connection_errors_are_retried_with_backoff():
    transport, calls = flaky(3)
    c = HttpWatermarkClient("http://127.0.0.1:9", retries=3, backoff=0.001, transport=transport)
    assert c.acquire("comp", "a") == 7
    assert calls == ["/v1/acquire"] * 4


def test_after_the_retries_the_client_says_the_authority_is_unavailable():
    transport, calls = flaky(10)
    c = HttpWatermarkClient("http://127.0.0.1:9", retries=2, backoff=0.001, transport=transport)
    with pytest.raises(AuthorityUnavailableError, match="after 3 attempts.*millwheel authority serve"):
        c.watermarks()
    assert len(calls) == 3


def test_5xx_answers_are_retried():
    transport, calls = flaky(2, error=503, answer=(200, {"watermarks": {"c": 5}}))  # type: ignore[arg-type]
    c = HttpWatermarkClient("http://127.0.0.1:9", retries=2, backoff=0.001, transport=transport)
    assert c.watermarks() == {"c": 5}
    assert len(calls) == 3


def test_a_4xx_is_never_retried_and_keeps_its_class():
    body = {"error": "stale_token", "message": "computation 'c': stale sequencer token", "intervals": [["c", "a"]]}
    transport, calls = flaky(0, answer=(409, body))
    c = HttpWatermarkClient("http://127.0.0.1:9", retries=5, backoff=0.001, transport=transport)
    with pytest.raises(StaleTokenError) as err:
        c.report("c", "a", 1, 5)
    assert err.value.intervals == [("c", "a")]
    assert len(calls) == 1
    transport, calls = flaky(0, answer=(400, {"error": "invalid_request", "message": "bad"}))
    c = HttpWatermarkClient("http://127.0.0.1:9", retries=5, transport=transport)
    with pytest.raises(InvalidRequestError, match="bad"):
        c.watermarks()
    assert len(calls) == 1


def test_split_is_not_retried_once_the_request_may_have_arrived():
    transport, calls = flaky(1, error=httpx.ReadTimeout)
    c = HttpWatermarkClient("http://127.0.0.1:9", retries=5, backoff=0.001, transport=transport)
    with pytest.raises(AuthorityUnavailableError, match="not retried"):
        c.split("c", "a", ["a1", "a2"])
    assert len(calls) == 1
    transport, calls = flaky(1, error=httpx.ReadTimeout, answer=(200, {"accepted": 1}))
    c = HttpWatermarkClient("http://127.0.0.1:9", retries=5, backoff=0.001, transport=transport)
    c.report("c", "a", 1, 5)  # a repeated report is harmless: retried
    assert len(calls) == 2


def test_a_real_timeout_against_a_silent_server():
    import socket

    with socket.socket() as s:  # listens, never answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        c = HttpWatermarkClient(f"http://127.0.0.1:{s.getsockname()[1]}", timeout=0.2, retries=1, backoff=0.01)
        with pytest.raises(AuthorityUnavailableError, match="Timeout"):
            c.watermarks()


def test_the_embedded_authority_starts_serves_and_stops(tmp_path):
    with embedded_authority(str(tmp_path / "wa")) as svc:
        assert svc.url.startswith("http://127.0.0.1:")
        wm = svc.client()
        assert isinstance(wm, WatermarkClient)
        t = wm.acquire("c", "a")
        wm.report("c", "a", t, 1_234)
        assert wm.watermark("c") == 1_234
        pid = svc.pid
    assert svc.process.poll() is not None, f"authority {pid} still running"
    assert (tmp_path / "wa" / "journal").is_dir()
    assert "listening on http://127.0.0.1:" in svc.log()


def test_open_authority_uses_a_url_when_given(service, monkeypatch):
    monkeypatch.setenv(URL_ENV, service.url)
    with open_authority() as wm:
        assert isinstance(wm, HttpWatermarkClient) and wm.url == service.url
        assert isinstance(wm.watermarks(), dict)


def test_open_authority_starts_an_embedded_one_otherwise(monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)
    with open_authority() as wm:
        assert wm.url.startswith("http://127.0.0.1:")  # type: ignore[attr-defined]
        t = wm.acquire("c", "a")
        wm.report("c", "a", t, 5)
        assert wm.watermarks() == {"c": 5}
    assert not os.environ.get(URL_ENV)


def test_bad_client_settings_are_refused():
    with pytest.raises(InvalidRequestError, match="retries >= 0"):
        HttpWatermarkClient("http://127.0.0.1:9", retries=-1)
