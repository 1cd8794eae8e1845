"""servicekit.http: the guard in front of a small app, exercised in process (Starlette's TestClient).

Each refusal has its status and JSON body, and the app behind the guard never runs for it.
"""

from __future__ import annotations

import warnings

import pytest
from starlette.applications import Starlette
from starlette.exceptions import StarletteDeprecationWarning
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import Route

with (
    warnings.catch_warnings()
):  # Starlette 1.x would rather drive its TestClient with httpx2; httpx works
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

from servicekit import BadRequestError, Secret
from servicekit.http import Guard, GuardMiddleware, hosts_for_bind, json_endpoint, normalize_host

SECRET = Secret("s3cret-for-the-tests-only", source="the test")
AUTH = SECRET.header()
READ_KEY = SECRET.read_key().header()


@pytest.fixture
def app():
    """A service with one mutation, one public read, one private read, one keyed read, one failing route."""
    calls: list[str] = []

    async def write(request: Request):
        body = await request.body()
        calls.append(f"write {len(body)}")
        return {"ok": True, "bytes": len(body)}

    async def read(request: Request):
        calls.append("read")
        return {"value": 1}

    async def refuse(request: Request):
        msg = "x must be y; " + "z" * 100_000
        raise BadRequestError(msg)

    async def crash(request: Request):
        msg = "secret internals " * 1_000
        raise RuntimeError(msg)

    guard = Guard(
        secret=SECRET,
        allowed_hosts=hosts_for_bind("127.0.0.1", ["svc.example.com"]),
        allowed_origins=frozenset({"https://ops.example.com"}),
        max_body_bytes=1_000,
        private_reads=frozenset({"/private"}),
        keyed_reads=frozenset({"/figures"}),
        secret_hint="find it in /etc/svc/secret",
        host_hint="add --allow-host",
        service="the test service",
    )
    routes = [
        Route("/write", json_endpoint(write), methods=["POST"]),
        Route("/read", json_endpoint(read)),
        Route("/private", json_endpoint(read)),
        Route("/figures", json_endpoint(read)),
        Route("/refuse", json_endpoint(refuse)),
        Route("/crash", json_endpoint(crash)),
    ]
    service = Starlette(routes=routes, middleware=[Middleware(GuardMiddleware, guard=guard)])
    service.state.calls = calls
    return service


@pytest.fixture
def client(app):
    with TestClient(app, base_url="http://127.0.0.1:7300", raise_server_exceptions=False) as c:
        yield c


def refused(response, status: int, code: str, text: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code and text in body["message"], body


def test_mutations_need_the_secret_and_public_reads_do_not(client, app):
    refused(
        client.post("/write", json={}),
        401,
        "unauthorized",
        "POST /write needs the test service's secret: send the header 'Authorization: Bearer <secret>'; find it in /etc/svc/secret",
    )
    refused(
        client.post("/write", json={}, headers={"Authorization": "Bearer wrong"}),
        401,
        "unauthorized",
        "is not the test service's secret",
    )
    refused(
        client.post("/write", json={}, headers={"Authorization": f"Token {SECRET.reveal()}"}),
        401,
        "unauthorized",
        "is not",
    )
    refused(client.put("/write", json={}), 401, "unauthorized", "PUT /write needs")
    refused(client.get("/private"), 401, "unauthorized", "GET /private needs")
    assert (
        client.post("/write", json={}).headers["www-authenticate"]
        == 'Bearer realm="the test service"'
    )
    assert app.state.calls == []  # the app never ran
    assert client.get("/read").json() == {"value": 1}
    assert client.get("/private", headers=AUTH).json() == {"value": 1}
    assert client.post(
        "/write", content=b'{"a": 1}', headers={**AUTH, "Content-Type": "application/json"}
    ).json() == {"ok": True, "bytes": 8}


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:7300", 200),
        ("localhost", 200),
        ("LOCALHOST.:1", 200),
        ("[::1]:7300", 200),
        ("svc.example.com", 200),
        ("192.168.7.7:7300", 200),
        ("[fe80::1]", 200),
        ("evil.example:7300", 421),
        ("127.0.0.1.evil.example", 421),
        ("svc.example.com.evil.example", 421),
        ("", 421),
    ],
)
def test_only_allowed_names_and_ip_addresses_are_served(client, host, status):
    r = client.get("/read", headers={"Host": host})
    assert r.status_code == status, (host, r.text)
    if status == 421:
        refused(r, 421, "misdirected_request", "add --allow-host")


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Origin": "http://127.0.0.1:7300"}, 200),  # this service's own page
        ({"Origin": "https://ops.example.com"}, 200),  # an allowed origin
        ({"Origin": "https://ops.example.com/"}, 200),
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "http://127.0.0.1:7301"}, 403),  # another port is another origin
        ({"Origin": "null"}, 403),
        ({"Origin": "not a url"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Sec-Fetch-Site": "same-site"}, 403),
        ({"Sec-Fetch-Site": "same-origin"}, 200),
        ({"Sec-Fetch-Site": "none"}, 200),  # typed in the address bar
        (
            {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"},
            403,
        ),  # a POST is never a navigation we allow
    ],
)
def test_cross_site_requests_are_refused(client, app, headers, status):
    r = client.post("/write", json={}, headers={**AUTH, **headers})
    assert r.status_code == status, (headers, r.text)
    if status == 403:
        refused(r, 403, "forbidden", "refuses requests from pages of another site")
        assert app.state.calls == []


def test_a_link_from_another_site_still_opens_a_page(client):
    assert (
        client.get(
            "/read", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
        ).status_code
        == 200
    )
    assert (
        client.get(
            "/read", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}
        ).status_code
        == 403
    )


def test_a_body_over_the_limit_is_refused_from_its_length_and_while_it_streams(client, app):
    r = client.post(
        "/write",
        content=b"{}",
        headers={**AUTH, "Content-Type": "application/json", "Content-Length": "1000000000"},
    )
    refused(r, 413, "payload_too_large", "1,000,000,000 bytes, more than the 1,000")
    assert r.headers["connection"] == "close"

    def stream():
        for _ in range(100):
            yield b" " * 100

    r = client.post(
        "/write", content=stream(), headers={**AUTH, "Content-Type": "application/json"}
    )
    refused(r, 413, "payload_too_large", "more than the 1,000 bytes the test service accepts")
    assert app.state.calls == []
    assert (
        client.post(
            "/write", content=b" " * 1_000, headers={**AUTH, "Content-Type": "application/json"}
        ).status_code
        == 200
    )
    refused(
        client.post(
            "/write",
            content=b"{}",
            headers={**AUTH, "Content-Type": "application/json", "Content-Length": "-5"},
        ),
        400,
        "invalid_request",
        "Content-Length must be a number",
    )


def test_a_body_must_be_declared_json(client):
    for ctype in ("text/plain", "application/x-www-form-urlencoded", ""):
        refused(
            client.post("/write", content=b"{}", headers={**AUTH, "Content-Type": ctype}),
            415,
            "unsupported_media_type",
            "Content-Type: application/json",
        )
    assert (
        client.post(
            "/write",
            content=b"{}",
            headers={**AUTH, "Content-Type": "application/merge-patch+json"},
        ).status_code
        == 200
    )
    assert client.post("/write", headers=AUTH).status_code == 200  # no body, no type needed


def test_errors_are_json_with_their_status_and_short(client):
    r = client.get("/refuse")
    refused(r, 400, "invalid_request", "x must be y")
    assert len(r.content) < 2_500
    r = client.get("/crash")
    refused(
        r, 500, "internal", "GET /crash failed inside the service (RuntimeError: secret internals"
    )
    assert len(r.json()["message"]) < 500 and "see the service's log" in r.json()["message"]


def test_every_answer_carries_the_safety_headers(client):
    for r in (
        client.get("/read"),
        client.post("/write", json={}),
        client.get("/read", headers={"Host": "evil.example"}),
    ):
        assert (
            r.headers["x-content-type-options"] == "nosniff"
            and r.headers["x-frame-options"] == "DENY"
        )


def test_hosts_for_bind():
    assert hosts_for_bind("127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    assert hosts_for_bind("::") == {"127.0.0.1", "localhost", "::1"}
    assert hosts_for_bind("10.0.0.5", ["Authority.Example.COM."]) == {
        "127.0.0.1",
        "localhost",
        "::1",
        "10.0.0.5",
        "authority.example.com",
    }
    assert normalize_host("[::1]") == "::1" and normalize_host("example.com:443") == "example.com"


def test_a_guard_needs_a_positive_body_limit():
    with pytest.raises(ValueError, match="max_body_bytes must be >= 1"):
        Guard(secret=SECRET, max_body_bytes=0)


def test_a_keyed_read_takes_the_secret_or_its_read_key_and_the_key_opens_nothing_else(client, app):
    refused(
        client.get("/figures"),
        401,
        "unauthorized",
        "GET /figures needs the test service's secret or its read key",
    )
    refused(
        client.get("/figures", headers={"Authorization": "Bearer " + "k" * 43}),
        401,
        "unauthorized",
        "is not the test service's secret or its read key",
    )
    assert app.state.calls == []
    assert client.get("/figures", headers=READ_KEY).json() == {"value": 1}
    assert client.get("/figures", headers=AUTH).json() == {"value": 1}
    refused(
        client.post("/write", json={}, headers=READ_KEY),
        401,
        "unauthorized",
        "is not the test service's secret;",
    )
    refused(
        client.get("/private", headers=READ_KEY),
        401,
        "unauthorized",
        "is not the test service's secret;",
    )
    refused(
        client.post("/figures", json={}, headers=READ_KEY),
        401,
        "unauthorized",
        "POST /figures: the bearer credential sent is not the test service's secret;",
    )


ASK = {"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization"}


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://127.0.0.1:9999", True),
        ("http://localhost", True),
        ("https://[::1]:1", True),
        ("https://ops.example.com", True),
        ("http://127.0.0.1:7300", True),
        ("http://evil.example", False),
        ("null", False),
        ("http://127.0.0.1.evil.example", False),
        ("http://localhost:0", False),
        ("http://localhost:99999", False),
        ("file://", False),
        ("http://me@localhost:80", False),
        ("http://localhost/path", False),
        ("ftp://127.0.0.1", False),
    ],
)
def test_pages_of_loopback_and_allowed_origins_may_make_keyed_reads_and_nothing_else(
    client, app, origin, allowed
):
    r = client.get(
        "/figures",
        headers={
            **READ_KEY,
            "Origin": origin,
            "Sec-Fetch-Site": "cross-site",
            "Sec-Fetch-Mode": "cors",
        },
    )
    pre = client.options("/figures", headers={"Origin": origin, **ASK})
    if allowed:
        assert (
            r.status_code == 200
            and r.headers["access-control-allow-origin"] == origin
            and r.headers["vary"] == "Origin"
        ), r.text
        assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == origin, (
            pre.text
        )
        assert (
            pre.headers["access-control-allow-headers"] == "Authorization"
            and pre.headers["access-control-allow-methods"] == "GET, HEAD"
        )
        assert (
            "access-control-allow-credentials" not in r.headers
            and "access-control-allow-credentials" not in pre.headers
        )
        assert (
            client.get("/figures", headers={"Origin": origin}).headers[
                "access-control-allow-origin"
            ]
            == origin
        )  # a 401 the page can read
    else:
        refused(r, 403, "forbidden", "refuses requests from pages of another site")
        refused(pre, 403, "forbidden", "refuses requests from pages of another site")
        assert (
            "access-control-allow-origin" not in r.headers
            and "access-control-allow-origin" not in pre.headers
        )
    if origin not in (
        "https://ops.example.com",
        "http://127.0.0.1:7300",
    ):  # not this service's own page nor an allowed one
        assert (
            client.get("/read", headers={"Origin": origin}).status_code == 403
        )  # other reads stay same-origin
        assert client.post("/write", json={}, headers={**AUTH, "Origin": origin}).status_code == 403
    assert client.options(
        "/write", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
    ).status_code in (401, 403)
    assert "access-control-allow-origin" not in client.get("/read").headers
    assert app.state.calls == ["read"] * (
        2 if allowed else 1
    )  # the keyed read ran only for an allowed page


@pytest.mark.parametrize(
    ("method", "asked"),
    [
        ("POST", "authorization"),
        ("PUT", ""),
        ("GET", "authorization, content-type"),
        ("GET", "x-anything"),
        ("", ""),
    ],
)
def test_a_preflight_may_ask_for_a_get_with_an_authorization_header_only(client, method, asked):
    r = client.options(
        "/figures",
        headers={
            "Origin": "http://127.0.0.1:9999",
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": asked,
        },
    )
    refused(r, 403, "forbidden", "with GET and an Authorization header only")
