"""Attacks on the authority service, each refused with its status and the state unchanged.

Who can reach the port without the secret (``anon``) may read published watermarks and
nothing else; a browser page of another site, a DNS-rebound name, an oversized or
deeply nested body, an out-of-range count or a huge name never changes the state and
never gets a 500. (Mistakes of honest clients are in ``test_authority_server``.)
"""

from __future__ import annotations

import json
import re
import select
import socket
from urllib.parse import urlsplit

import pytest

from watermark_authority import InvalidRequestError

JSON = {"Content-Type": "application/json"}


def mutations(c, inj, tokens):
    """A valid request to every mutating route."""
    return [
        ("/v1/acquire", {"computation": c, "intervals": ["a"]}),
        ("/v1/report", {"computation": c, "reports": [["a", tokens["a"], 2**63 - 1]]}),
        ("/v1/token/check", {"computation": c, "interval": "a", "token": tokens["a"]}),
        ("/v1/split", {"computation": c, "interval": "a", "into": ["a1", "a2"]}),
        ("/v1/merge", {"computation": c, "intervals": ["a", "b"], "into": "ab"}),
        ("/v1/injectors/expect", {"injector": inj, "processes": ["evil"]}),
        ("/v1/injectors/report", {"injector": inj, "process": "p0", "low_watermark": 2**63 - 1}),
    ]


def test_every_mutation_needs_the_secret(anon, service, seeded):
    c, inj, tokens, snapshot = seeded
    before = snapshot()
    wrong = {"Authorization": "Bearer " + "x" * 43}
    basic = {"Authorization": f"Basic {service.secret.reveal()}"}
    for path, body in mutations(c, inj, tokens):
        for headers, says in [
            ({}, "needs the watermark authority's secret"),
            (wrong, "is not the watermark authority's secret"),
            (basic, "is not"),
        ]:
            r = anon.post(path, json=body, headers=headers)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.json()["error"] == "unauthorized" and says in r.json()["message"]
            assert "Authorization: Bearer" in r.json()["message"] or "is not" in says
            assert (
                "$MILLWHEEL_AUTHORITY_SECRET" in r.json()["message"]
            )  # where the secret comes from
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert service.secret.reveal() not in r.text
    assert snapshot() == before


def test_reads_that_reveal_tokens_need_the_secret(anon, http, seeded):
    c, _, tokens, _ = seeded
    r = anon.get("/v1/intervals", params={"computation": c})
    assert r.status_code == 401 and "GET /v1/intervals needs" in r.json()["message"]
    assert (
        http.get("/v1/intervals", params={"computation": c}).json()["intervals"]["a"]["token"]
        == tokens["a"]
    )

    def keys(value):
        if isinstance(value, dict):
            for k, v in value.items():
                yield k
                yield from keys(v)
        elif isinstance(value, list):
            for v in value:
                yield from keys(v)

    for path in (
        "/v1/status",
        "/v1/watermarks",
        f"/v1/watermark?name={c}",
        "/v1/history?seconds=60",
    ):
        r = anon.get(path)
        assert r.status_code == 200, (path, r.text)  # reads of published watermarks are open
        assert "token" not in set(keys(r.json())), f"{path} reveals a sequencer token"


def test_tokens_are_useless_without_the_secret(anon, seeded):
    """Tokens are small sequential integers; guessing them gets a reader nowhere."""
    c, inj, tokens, snapshot = seeded
    before = snapshot()
    for iv in ("a", "b"):  # push the watermark to +inf (never undone) with every plausible token
        for t in range(max(1, tokens[iv] - 20), tokens[iv] + 20):
            r = anon.post("/v1/report", json={"computation": c, "reports": [[iv, t, 2**63 - 1]]})
            assert r.status_code == 401
    assert (
        anon.post("/v1/acquire", json={"computation": c, "intervals": ["a"]}).status_code == 401
    )  # no fencing the owner
    assert snapshot() == before


def test_cross_site_requests_are_refused_even_with_the_secret(http, service, seeded):
    c, inj, tokens, snapshot = seeded
    before = snapshot()
    report = json.dumps({"injector": inj, "process": "p0", "low_watermark": 2**63 - 1})
    host = urlsplit(service.url).netloc
    attacks = [
        {
            "Origin": "http://evil.example",
            "Content-Type": "text/plain",
        },  # a cross-site form or no-cors fetch
        {"Origin": "http://evil.example", "Content-Type": "application/json"},
        {"Origin": "null", "Content-Type": "application/json"},  # sandboxed iframes, file:// pages
        {"Origin": f"http://{host}.evil.example", "Content-Type": "application/json"},
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
        {
            "Sec-Fetch-Site": "same-site",
            "Content-Type": "application/json",
        },  # another port of this host
    ]
    for headers in attacks:
        r = http.post("/v1/injectors/report", content=report, headers=headers)
        assert r.status_code == 403, (headers, r.text)
        assert r.json()["error"] == "forbidden" and "another site" in r.json()["message"]
    r = http.get("/v1/status", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    assert snapshot() == before
    # this service's own pages may call it, and a link from elsewhere opens the dashboard
    assert (
        http.post(
            "/v1/injectors/report",
            content=report.replace(str(2**63 - 1), "3500"),
            headers={"Origin": f"http://{host}", **JSON},
        ).status_code
        == 200
    )
    assert (
        http.get(
            "/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
        ).status_code
        == 200
    )
    assert (
        http.get(
            "/v1/status", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}
        ).status_code
        == 403
    )


def test_a_rebound_host_name_is_refused(http, service, seeded):
    """DNS rebinding: evil.example re-pointed at 127.0.0.1 sends Host: evil.example."""
    c, inj, tokens, snapshot = seeded
    before = snapshot()
    port = urlsplit(service.url).port
    for method, path, body in [
        ("GET", "/", None),
        ("GET", "/v1/status", None),
        ("POST", "/v1/acquire", {"computation": c, "intervals": ["a"]}),
    ]:
        r = http.request(method, path, json=body, headers={"Host": f"evil.example:{port}"})
        assert r.status_code == 421, (path, r.text)
        assert r.json()["error"] == "misdirected_request" and "--allow-host" in r.json()["message"]
    assert snapshot() == before
    for ok in (
        f"localhost:{port}",
        f"127.0.0.1:{port}",
        "LOCALHOST.",
        f"10.1.2.3:{port}",
    ):  # loopback names and IP addresses
        assert http.get("/v1/watermarks", headers={"Host": ok}).status_code == 200, ok


def _raw(service, head: str) -> socket.socket:
    u = urlsplit(service.url)
    s = socket.create_connection((u.hostname, u.port), timeout=5)
    s.sendall(head.encode())
    return s


def _response(s: socket.socket, timeout: float) -> tuple[int, dict]:
    """Read one HTTP response (status, JSON body) from a raw socket."""
    s.settimeout(timeout)
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep and len(body) >= int(re.search(rb"(?i)content-length: *(\d+)", head).group(1)):
            break
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return int(head.split()[1]), json.loads(body)


def _post_head(service, path: str, extra: str) -> str:
    host = urlsplit(service.url).netloc
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {service.secret.reveal()}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    )


@pytest.mark.parametrize("length", [70_000_000, 1_000_000_000])
def test_a_body_over_the_limit_is_refused_from_its_content_length_before_it_is_read(
    service, seeded, length
):
    c, _, _, snapshot = seeded
    before = snapshot()
    s = _raw(service, _post_head(service, "/v1/report", f"Content-Length: {length}\r\n"))
    s.sendall(
        b'{"computation": "' + c.encode() + b'", "reports": [' + b"[" * 1000
    )  # a start, never the rest
    # the rest never comes: a service that waited for the body would never answer (the read times out)
    status, body = _response(s, timeout=30)
    s.close()
    assert status == 413 and body["error"] == "payload_too_large", body
    assert f"{length:,} bytes" in body["message"] and "send smaller batches" in body["message"]
    assert snapshot() == before


def test_a_70MB_body_without_a_length_is_refused_while_it_streams(service, seeded):
    c, _, _, snapshot = seeded
    before = snapshot()
    s = _raw(service, _post_head(service, "/v1/report", "Transfer-Encoding: chunked\r\n"))
    chunk = b"x" * (1 << 20)
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    answered = False
    while sent < 70_000_000:
        if select.select([s], [], [], 0)[0]:
            answered = True
            break
        try:
            s.sendall(framed)
        except (BrokenPipeError, ConnectionResetError):
            answered = True
            break
        sent += len(chunk)
    if not answered:  # every byte went out: the service must answer now, not have read it all
        select.select([s], [], [], 5)
    status, body = _response(s, timeout=5)
    s.close()
    assert status == 413 and body["error"] == "payload_too_large", body
    assert sent < 40_000_000, f"the service read {sent:,} bytes before refusing"
    assert snapshot() == before


@pytest.mark.parametrize("pending", [2**63, 2**64, 10**30, -1, 1.5, "3", True])
def test_an_out_of_range_pending_count_is_a_400_and_changes_nothing(http, seeded, pending):
    c, _, tokens, snapshot = seeded
    before = snapshot()
    r = http.post(
        "/v1/report",
        json={
            "computation": c,
            "reports": [["a", tokens["a"], 1_500, 1], ["b", tokens["b"], 2_500, pending]],
        },
    )
    assert r.status_code == 400, r.text
    assert "pending must be an integer in [0, 9223372036854775807]" in r.json()["message"]
    assert snapshot() == before
    assert http.get("/v1/status").status_code == 200


@pytest.mark.parametrize("pending", [2**63, 2**64, 10**30])
def test_an_out_of_range_pending_count_is_refused_on_both_backends(client, ns, pending):
    c = f"{ns}c"
    t = client.acquire(c, "a")
    client.report(c, "a", t, 1_000, 5)
    with pytest.raises(
        InvalidRequestError, match=r"pending must be an integer in \[0, 9223372036854775807\]"
    ):
        client.report(c, "a", t, 9_000, pending)
    assert client.watermark(c) == 1_000
    assert client.percentile_watermark(c, 99) == 1_000


def test_the_largest_pending_count_keeps_status_and_percentiles_working(http, seeded):
    c, _, tokens, _ = seeded
    top = 2**63 - 1
    r = http.post(
        "/v1/report",
        json={
            "computation": c,
            "reports": [["a", tokens["a"], 1_500, top], ["b", tokens["b"], 2_500, top]],
        },
    )
    assert r.status_code == 200, r.text
    status = http.get("/v1/status")
    assert status.status_code == 200
    assert status.json()["computations"][c]["holding"]["pending"] == top
    assert (
        http.get("/v1/watermark", params={"name": c, "pct": "50"}).json()["watermark"] == 2_500
    )  # equal weights
    merged = http.post("/v1/merge", json={"computation": c, "intervals": ["a", "b"], "into": "ab"})
    assert merged.status_code == 200
    assert (
        http.get("/v1/intervals", params={"computation": c}).json()["intervals"]["ab"]["pending"]
        == top
    )  # saturates


@pytest.mark.parametrize("depth", [9, 100_000])
def test_deeply_nested_json_is_a_400(http, seeded, depth):
    c, _, _, snapshot = seeded
    before = snapshot()
    body = '{"computation": "%s", "reports": %s%s}' % (c, "[" * (depth - 1), "]" * (depth - 1))  # noqa: UP031
    r = http.post("/v1/report", content=body, headers=JSON)
    assert r.status_code == 400, r.text[:300]
    assert "nested deeper than 8 levels" in r.json()["message"]
    assert snapshot() == before


def test_a_huge_name_is_never_echoed(http, seeded):
    c, inj, tokens, snapshot = seeded
    before = snapshot()
    huge = "n" * 10_000_000
    for path, body in [
        ("/v1/report", {"computation": huge, "reports": []}),
        ("/v1/report", {"computation": c, "reports": [[huge, tokens["a"], 5]]}),
        ("/v1/acquire", {"computation": c, "intervals": ["a", huge]}),
        ("/v1/injectors/report", {"injector": inj, "process": huge, "low_watermark": 5}),
        ("/v1/report", {"computation": c, "reports": [["a", tokens["a"], 5, huge]]}),
        (
            "/v1/report",
            {
                "computation": c,
                "reports": [["a", tokens["a"], 5]],
                **{f"f{k}": k for k in range(100_000)},
            },
        ),
    ]:
        r = http.post(path, json=body)
        assert r.status_code == 400, (path, r.status_code)
        assert len(r.content) < 1_000, f"{path}: {len(r.content)} bytes of error"
    r = http.get("/v1/watermark", params={"name": "q" * 8_000})
    assert r.status_code == 400 and len(r.content) < 1_000
    r = http.get(
        "/v1/watermark", params={"name": "unknown-" + "u" * 200}
    )  # a valid length, unknown: 404, shortened
    assert r.status_code == 404 and len(r.json()["message"]) < 400
    assert snapshot() == before


def test_a_body_that_is_not_json_is_a_415(http, seeded):
    c, _, _, snapshot = seeded
    before = snapshot()
    for ctype in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ):
        r = http.post(
            "/v1/acquire",
            content=json.dumps({"computation": c, "intervals": ["a"]}),
            headers={"Content-Type": ctype},
        )
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["message"], (
            ctype,
            r.text,
        )
    assert snapshot() == before


def test_every_answer_says_nosniff_and_no_framing(anon):
    for path in ("/", "/v1/watermarks", "/static/dashboard.js", "/v1/intervals"):
        r = anon.get(path)
        assert (
            r.headers["x-content-type-options"] == "nosniff"
            and r.headers["x-frame-options"] == "DENY"
        ), path
    assert "frame-ancestors 'none'" in anon.get("/").headers["content-security-policy"]
