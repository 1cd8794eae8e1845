"""The clients: retries and timeouts over HTTP, the embedded service, the same errors everywhere."""

from __future__ import annotations

import os

import httpx
import pytest

from watermark_authority import (
    AuthenticationError,
    AuthorityUnavailableError,
    HttpWatermarkClient,
    InvalidRequestError,
    StaleTokenError,
    WatermarkClient,
    embedded_authority,
    open_authority,
)
from watermark_authority.client import SECRET_ENV, SECRET_FILE_ENV, URL_ENV


@pytest.fixture(autouse=True)
def no_secret_in_the_environment(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)


def flaky(
    failures: int,
    error: type[Exception] = httpx.ConnectError,
    answer: tuple[int, dict] = (200, {"tokens": {"a": 7}}),
):
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
    with pytest.raises(
        AuthorityUnavailableError, match="unreachable after 3 attempts.*millwheel authority serve"
    ):
        c.watermarks()
    assert len(calls) == 3


def test_a_service_answering_5xx_is_said_to_be_failing_not_missing():
    body = {
        "error": "internal",
        "message": "POST /v1/report failed inside the service (OSError: disk full); see the service's log",
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(500, json=body))
    c = HttpWatermarkClient(
        "http://127.0.0.1:9", secret="s" * 20, retries=2, backoff=0.001, transport=transport
    )
    with pytest.raises(AuthorityUnavailableError) as err:
        c.report("c", "a", 1, 5)
    message = str(err.value)
    assert "is running but failed 3 of 3 attempts" in message and "OSError: disk full" in message
    assert "millwheel authority serve" not in message


def test_the_secret_is_sent_and_a_401_says_where_the_client_looked(tmp_path, monkeypatch):
    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(
            401,
            json={
                "error": "unauthorized",
                "message": "POST /v1/acquire needs the watermark authority's secret",
            },
        )

    c = HttpWatermarkClient("http://127.0.0.1:9", retries=3, transport=httpx.MockTransport(handle))
    with pytest.raises(
        AuthenticationError,
        match=f"needs the watermark authority's secret.*sent no secret: pass secret=..., or set \\${SECRET_ENV}",
    ):
        c.acquire("c", "a")
    assert seen == [None]  # never retried
    monkeypatch.setenv(SECRET_ENV, "from-the-environment-1234")
    c = HttpWatermarkClient("http://127.0.0.1:9", transport=httpx.MockTransport(handle))
    with pytest.raises(AuthenticationError, match=f"sent the secret from \\${SECRET_ENV}"):
        c.acquire("c", "a")
    assert seen[-1] == "Bearer from-the-environment-1234"
    monkeypatch.delenv(SECRET_ENV)
    (tmp_path / "s").write_text("from-a-named-file-5678\n")
    (tmp_path / "s").chmod(0o600)
    monkeypatch.setenv(SECRET_FILE_ENV, str(tmp_path / "s"))
    with pytest.raises(AuthenticationError):
        HttpWatermarkClient(
            "http://127.0.0.1:9", transport=httpx.MockTransport(handle)
        ).watermarks()
    assert seen[-1] == "Bearer from-a-named-file-5678"
    assert (
        HttpWatermarkClient("http://127.0.0.1:9", secret="explicit-secret-wins-90").secret.reveal()
        == "explicit-secret-wins-90"
    )


def test_without_the_secret_a_client_reads_but_cannot_write(service, ns):
    with HttpWatermarkClient(service.url, retries=0) as anon, service.client() as owner:
        t = owner.acquire(f"{ns}c", "a")
        owner.report(f"{ns}c", "a", t, 1_234)
        assert anon.watermark(f"{ns}c") == 1_234 and anon.watermarks()[f"{ns}c"] == 1_234
        for write in (
            lambda: anon.acquire(f"{ns}c", "a"),
            lambda: anon.report(f"{ns}c", "a", t, 9_999),
            lambda: anon.intervals(f"{ns}c"),
        ):
            with pytest.raises(AuthenticationError, match="sent no secret"):
                write()
        assert owner.watermark(f"{ns}c") == 1_234 and owner.intervals(f"{ns}c")["a"]["token"] == t


def test_5xx_answers_are_retried():
    transport, calls = flaky(2, error=503, answer=(200, {"watermarks": {"c": 5}}))  # type: ignore[arg-type]
    c = HttpWatermarkClient("http://127.0.0.1:9", retries=2, backoff=0.001, transport=transport)
    assert c.watermarks() == {"c": 5}
    assert len(calls) == 3


def test_a_4xx_is_never_retried_and_keeps_its_class():
    body = {
        "error": "stale_token",
        "message": "computation 'c': stale sequencer token",
        "intervals": [["c", "a"]],
    }
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
        c = HttpWatermarkClient(
            f"http://127.0.0.1:{s.getsockname()[1]}", timeout=0.2, retries=1, backoff=0.01
        )
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
    log = svc.log()
    assert (
        "listening on http://127.0.0.1:" in log
        and "secret from the file given with --secret-file" in log
    )
    assert svc.secret is not None and svc.secret.reveal() not in log
    assert (tmp_path / "wa" / "secret").stat().st_mode & 0o777 == 0o600


def test_open_authority_uses_a_url_when_given(service, monkeypatch, ns):
    monkeypatch.setenv(URL_ENV, service.url)
    with open_authority() as wm:
        assert isinstance(wm, HttpWatermarkClient) and wm.url == service.url
        assert isinstance(wm.watermarks(), dict)
        assert wm.secret is None  # nothing in the environment: reads only
    # a second driver on the same run directory finds the secret the embedded authority generated
    with open_authority(service.url, data_dir=service.data_dir) as wm:
        assert wm.secret == service.secret  # type: ignore[attr-defined]
        wm.acquire(f"{ns}second-driver", "a")


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
