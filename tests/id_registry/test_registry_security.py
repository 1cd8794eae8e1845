"""Attacks on the real registry service (servicekit's guard in front of it), each refused with its
status, a JSON message that says what to do, and the registry unchanged. The threat model is
the authority's (``docs/authority.md``, Security); ``docs/registry.md`` says what differs."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

ROUTES = {
    "/v1/commit": lambda ns: {"items": [[f"{ns}x", "evil", 1_000]]},
    "/v1/lookup": lambda ns: {"ids": [f"{ns}x"]},
    "/v1/clear": lambda ns: {"ids": [f"{ns}x"]},
    "/v1/gc": lambda ns: {"boundary_ms": 1_000},
    "/v1/shards": lambda ns: {"effective_from_ms": 2**62, "shard_count": 2},
}


@pytest.fixture
def seeded(http, ns):
    """One committed id, and a snapshot of what an attacker would like to change."""
    r = http.post("/v1/commit", json={"items": [[f"{ns}x", "joiner-a", 1_000]]})
    assert r.json()["results"] == [["committed", None]], r.text

    def snapshot():
        status = http.get("/v1/status").json()
        found = http.post("/v1/lookup", json={"ids": [f"{ns}x"]}).json()["results"]
        return found, status["gc_boundary_ms"], status["shards"]

    return snapshot


def test_every_route_but_the_status_needs_the_secret(anon, service, seeded, ns):
    """Lookups too: they reveal joiners' tokens (§3.3.3)."""
    before = seeded()
    wrong = {"Authorization": "Bearer " + "x" * 43}
    for path, body in ROUTES.items():
        for headers, says in [
            ({}, "needs the id registry's secret"),
            (wrong, "is not the id registry's secret"),
        ]:
            r = anon.post(path, json=body(ns), headers=headers)
            assert r.status_code == 401, (path, r.text)
            assert r.json()["error"] == "unauthorized" and says in r.json()["message"]
            assert "$MILLWHEEL_REGISTRY_SECRET" in r.json()["message"]
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert service.secret.reveal() not in r.text
    assert seeded() == before


def test_the_status_is_public_and_reveals_no_id_token_or_secret(anon, service, seeded, ns):
    r = anon.get("/v1/status")
    assert r.status_code == 200
    text = r.text
    assert f"{ns}x" not in text and "joiner-a" not in text and service.secret.reveal() not in text
    stats = r.json()["stats"]
    assert {
        "commits_per_s",
        "committed",
        "conflicts",
        "too_old",
        "group_sizes",
        "throttled",
    } <= set(stats)
    assert {"requests", "items"} == set(r.json()["in_flight"])


def test_cross_site_requests_are_refused_even_with_the_secret(http, service, seeded, ns):
    before = seeded()
    host = urlsplit(service.url).netloc
    body = json.dumps(ROUTES["/v1/commit"](ns))
    for headers in (
        {"Origin": "http://evil.example", "Content-Type": "text/plain"},
        {"Origin": "null", "Content-Type": "application/json"},
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
        {"Sec-Fetch-Site": "same-site", "Content-Type": "application/json"},
    ):
        r = http.post("/v1/commit", content=body, headers=headers)
        assert r.status_code == 403, (headers, r.text)
        assert r.json()["error"] == "forbidden" and "another site" in r.json()["message"]
    assert http.get("/v1/status", headers={"Origin": "http://evil.example"}).status_code == 403
    assert seeded() == before
    assert (
        http.post(
            "/v1/lookup", json={"ids": ["a"]}, headers={"Origin": f"http://{host}"}
        ).status_code
        == 200
    )


def test_a_rebound_host_name_is_refused(http, service, seeded, ns):
    before = seeded()
    port = urlsplit(service.url).port
    r = http.post(
        "/v1/commit", json=ROUTES["/v1/commit"](ns), headers={"Host": f"evil.example:{port}"}
    )
    assert r.status_code == 421 and "--allow-host" in r.json()["message"]
    assert seeded() == before


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "says"),
    [
        (b'{"items": [["a", "t", NaN]]}', "application/json", 400, "NaN is not JSON"),
        (
            b'{"items": ' + b"[" * 50 + b"]" * 50 + b"}",
            "application/json",
            400,
            "nested deeper than 6 levels",
        ),
        (
            b'{"items": [["a", "t", 1]], "extra": 1}',
            "application/json",
            400,
            "unexpected field(s) ['extra']",
        ),
        (b'{"items": "a"}', "application/json", 400, "items must be a list, got str"),
        (
            b'{"items": [["' + b"y" * 1_000_000 + b'", "t", 1]]}',
            "application/json",
            400,
            "(1000000 characters)",
        ),
        (b'{"items": [["a", "t", 1]]}', "text/plain", 415, "Content-Type: application/json"),
        (b"not json", "application/json", 400, "not valid JSON"),
    ],
)
def test_malformed_bodies_are_refused_by_name_and_never_echoed(
    http, seeded, raw, content_type, status, says
):
    before = seeded()
    r = http.post("/v1/commit", content=raw, headers={"Content-Type": content_type})
    assert r.status_code == status, r.text
    assert says in r.json()["message"], r.json()
    assert len(r.text) < 2_500
    assert seeded() == before


def test_a_body_over_the_limit_is_refused_before_it_is_read(service, seeded):
    before = seeded()
    u = urlsplit(service.url)
    with socket.create_connection((u.hostname, u.port), timeout=5) as s:
        s.sendall(
            f"POST /v1/commit HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: Bearer {service.secret.reveal()}\r\n"
            'Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n{"items": ['.encode()
        )
        head = b""
        while chunk := s.recv(65536):  # the answer closes the connection
            head += chunk
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    assert b"send smaller batches" in head
    assert seeded() == before


def test_too_many_items_in_one_call_are_refused_with_the_limit(http):
    r = http.post("/v1/lookup", json={"ids": ["a"] * 100_001})
    assert r.status_code == 400 and "send at most 100,000 per call" in r.json()["message"]
