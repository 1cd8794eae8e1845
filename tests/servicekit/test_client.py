"""servicekit's client side: the retry loop, the error mapping and the shared ``serve`` flags,
on a service of no kind (each service's own tests cover its client end to end)."""

from __future__ import annotations

import argparse

import httpx
import pytest

from servicekit import (
    BadRequestError,
    ErrorSet,
    ServiceError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from servicekit.cli import add_serve_arguments, serve_flags, serve_problem
from servicekit.client import JsonHttpClient
from servicekit.service import ServiceInfo


class GoneError(ServiceError):
    code = "gone"
    status = 410

    def __init__(self, message: str, since: int | None = None) -> None:
        super().__init__(message)
        self.since = since

    @classmethod
    def from_answer(cls, message, body):
        return cls(message, body.get("since"))


class ThingClient(JsonHttpClient):
    info = ServiceInfo(
        "thing service",
        "thing",
        "millwheel thing",
        "THING_URL",
        "THING_SECRET",
        "THING_SECRET_FILE",
    )
    errors = ErrorSet(
        ServiceError, BadRequestError, UnauthorizedError, ServiceUnavailableError, (GoneError,)
    )


def client(answers, **options):
    """A client whose service answers ``answers`` in turn (a status and a body, or an exception)."""
    calls = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        answer = answers[min(len(calls), len(answers)) - 1]
        if isinstance(answer, type):
            msg = "boom"
            raise answer(msg, request=request)
        return httpx.Response(
            answer[0], json=answer[1], headers=answer[2] if len(answer) > 2 else None
        )

    options.setdefault("backoff", 0.001)
    return ThingClient(
        "http://127.0.0.1:9", transport=httpx.MockTransport(handle), **options
    ), calls


@pytest.fixture(autouse=True)
def no_secret(monkeypatch):
    monkeypatch.delenv("THING_SECRET", raising=False)
    monkeypatch.delenv("THING_SECRET_FILE", raising=False)


def test_an_answer_comes_back_as_the_service_s_own_error_with_its_fields():
    c, calls = client([(410, {"error": "gone", "message": "it went", "since": 7})], retries=3)
    with pytest.raises(GoneError, match="it went") as err:
        c._call("GET", "/v1/thing")
    assert err.value.since == 7 and len(calls) == 1
    c, _ = client([(403, {"error": "forbidden", "message": "cross-site"})])
    with pytest.raises(
        BadRequestError, match="cross-site"
    ):  # servicekit's refusals are invalid requests
        c._call("GET", "/v1/thing")
    c, _ = client([(401, {"error": "unauthorized", "message": "needs the secret"})])
    with pytest.raises(
        UnauthorizedError,
        match=r"sent no secret: pass secret=\.\.\., or set \$THING_SECRET or \$THING_SECRET_FILE",
    ):
        c._call("POST", "/v1/thing", {})


def test_the_unavailable_error_names_the_service_and_the_fix():
    c, calls = client([httpx.ConnectError], retries=2)
    with pytest.raises(
        ServiceUnavailableError,
        match="the thing service at http://127.0.0.1:9 is unreachable after 3 attempts.*`millwheel thing serve`",
    ):
        c._call("GET", "/v1/thing")
    assert len(calls) == 3
    c, calls = client([httpx.ReadTimeout], retries=2)
    with pytest.raises(
        ServiceUnavailableError,
        match="may have been received.*not retried.*check the service's state",
    ):
        c._call("POST", "/v1/thing", {}, idempotent=False)
    assert len(calls) == 1


def test_a_429_is_an_error_unless_the_client_waits_out_throttling():
    c, calls = client([(429, {"error": "throttled", "message": "busy"}), (200, {"ok": 1})])
    with pytest.raises(ServiceError, match="busy"):
        c._call("GET", "/v1/thing")
    c, calls = client(
        [(429, {"error": "throttled", "message": "busy", "retry_after_ms": 1}), (200, {"ok": 1})],
        throttle_timeout=5.0,
    )
    assert c._call("GET", "/v1/thing") == {"ok": 1} and c.throttled == 1 and len(calls) == 2


def test_the_body_travels_as_ascii_json_with_the_secret():
    c, calls = client([(200, {})], secret="s" * 24)
    c._call("POST", "/v1/thing", {"id": "caf\u00e9"})
    assert (
        calls[0].content == b'{"id":"caf\\u00e9"}'
        and calls[0].headers["authorization"] == "Bearer " + "s" * 24
    )
    with pytest.raises(BadRequestError, match=r"ThingClient: need timeout > 0, retries >= 0"):
        ThingClient("http://127.0.0.1:9", retries=-1)


def test_the_shared_serve_flags_and_their_checks():
    parser = argparse.ArgumentParser()
    add_serve_arguments(
        parser,
        ThingClient.info,
        default_port=7400,
        default_data_dir=".thing",
        data_dir_help="where it lives",
    )
    assert "$THING_SECRET" in parser.format_help()
    args = parser.parse_args(["--port", "0", "--allow-host", "thing.example"])
    assert serve_problem(args) is None
    flags = serve_flags(args)
    assert (flags.port, flags.data_dir, flags.allow_hosts, flags.tls) == (
        0,
        ".thing",
        ["thing.example"],
        False,
    )
    assert "65535" in (serve_problem(parser.parse_args(["--port", "70000"])) or "")
    assert "go together" in (serve_problem(parser.parse_args(["--ssl-certfile", "x.pem"])) or "")
