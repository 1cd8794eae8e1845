"""``GET /v1/stats``: the registry's figures second by second (commits, conflicts, too-old answers,
requests, the size of each durable write: Photon §2.2.1), read by the authority's dashboard.

A *keyed read*: it needs the secret or its read key (never neither), it is the only route a page
of a loopback origin may read (CORS), its window is bounded, and the read key allows nothing else.
"""

from __future__ import annotations

import httpx
import pytest

from id_registry import HttpRegistryClient, InProcessRegistryClient, InvalidRequestError, Registry
from id_registry._core import Stats
from id_registry._worker import RegistryWorker

PAGE = "http://127.0.0.1:7300"  # the authority's dashboard, another origin on this machine
MUTATIONS = {
    "/v1/commit": {"items": [["stats-x", "evil", 1_000]]},
    "/v1/lookup": {"ids": ["stats-x"]},
    "/v1/clear": {"ids": ["stats-x"]},
    "/v1/gc": {"boundary_ms": 1_000},
}


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def next_second(clock) -> None:
    """End the registry clock's current second: ``/v1/stats`` answers only full seconds."""
    clock.now = (clock.now // 1_000 + 1) * 1_000


def test_the_stats_need_the_secret_or_its_read_key(anon, service):
    key = service.secret.read_key().reveal()
    assert key != service.secret.reveal() and len(key) == 43
    for headers, says in [
        ({}, "needs the id registry's secret or its read key"),
        (bearer("x" * 43), "is not the id registry's secret or its read key"),
    ]:
        r = anon.get("/v1/stats", headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["error"] == "unauthorized" and says in r.json()["message"]
        assert "read key" in r.json()["message"] and r.headers["www-authenticate"].startswith(
            "Bearer"
        )
    for credential in (key, service.secret.reveal()):
        r = anon.get("/v1/stats", headers=bearer(credential))
        assert r.status_code == 200, r.text
        body = r.json()
        assert {
            "now_ms",
            "started_ms",
            "interval_ms",
            "totals",
            "in_flight",
            "limits",
            "history",
        } <= set(body)
        assert key not in r.text and service.secret.reveal() not in r.text


def test_the_read_key_allows_nothing_else(anon, http, service):
    key = bearer(service.secret.read_key().reveal())
    gc_before = http.get("/v1/status").json()["gc_boundary_ms"]
    for path, body in MUTATIONS.items():
        r = anon.post(path, json=body, headers=key)
        assert r.status_code == 401, (path, r.text)
        assert "is not the id registry's secret;" in r.json()["message"]
    assert http.post("/v1/lookup", json={"ids": ["stats-x"]}).json()["results"] == [
        ["not_found", None, None]
    ]
    assert http.get("/v1/status").json()["gc_boundary_ms"] == gc_before


def test_the_figures_move_with_commits_conflicts_and_too_old_answers(serve_app, secret, clock):
    with (
        serve_app(RegistryWorker(Registry(clock=clock))) as url,
        HttpRegistryClient(url, secret=secret) as reg,
    ):
        empty = reg.stats(5)
        assert empty["totals"]["committed"] == empty["totals"]["groups"] == 0
        assert set(empty["history"]) == {"t", *Stats.COLUMNS} and all(
            len(v) == 5 for v in empty["history"].values()
        )
        next_second(clock)
        reg.commit_many(
            [("a", "dc1", 1_000), ("b", "dc1", 1_000), ("c", "dc1", 1_000)]
        )  # one request, a write of 3 ids
        reg.commit_many([("a", "dc1", 1_000)])  # a retry: COMMITTED again
        reg.commit_many(
            [("a", "dc2", 1_000), ("d", "dc2", 1_000)]
        )  # another pipeline: a conflict, a commit
        reg.advance_gc(5_000)
        reg.commit_many([("old", "dc1", 4_999)])  # behind the GC boundary
        totals = reg.stats(5)["totals"]
        assert (
            totals["committed"],
            totals["repeated"],
            totals["conflicts"],
            totals["too_old"],
        ) == (4, 1, 1, 1)
        assert (totals["requests"], totals["groups"], totals["group_items"]) == (4, 4, 7)
        assert totals["group_sizes"] == {"1-1": 2, "2-3": 2}
        next_second(clock)
        stats = reg.stats(5)
        h = stats["history"]
        assert h["t"] == sorted(h["t"]) and h["t"][-1] < stats["now_ms"] <= h["t"][-1] + 2_000
        assert all(b - a == 1_000 for a, b in zip(h["t"], h["t"][1:], strict=False))
        assert (sum(h["commits"]), sum(h["conflicts"]), sum(h["too_old"])) == (
            5,
            1,
            1,
        )  # committed + repeated
        assert (
            sum(h["requests"]),
            sum(h["groups"]),
            sum(h["group_items"]),
            max(h["group_max"]),
        ) == (4, 4, 7, 3)
        assert stats["totals"]["commits_per_s"] == pytest.approx(
            0.5
        )  # 5 COMMITTED answers over 10 s


def test_requests_batched_into_one_write_show_as_one_large_group(clock, gated, serve_app, secret):
    """Server-side batching (§2.2.1) as the dashboard sees it: 10 requests queued behind a slow
    write become one durable write of 20 ids."""
    worker = RegistryWorker(Registry(gated, clock=clock))
    with serve_app(worker) as url, HttpRegistryClient(url, secret=secret) as reg:
        next_second(clock)
        gated.gate.clear()
        first = worker.commit([("w", "t", 1_000)])
        assert gated.waiting.wait(10)
        queued = [worker.commit([(f"a{i}", "t", 1_000), (f"b{i}", "t", 1_000)]) for i in range(10)]
        assert reg.stats(5)["in_flight"] == {
            "requests": 11,
            "items": 21,
        }  # read while the registry thread is stuck
        gated.gate.set()
        assert all(f.result(10) for f in [first, *queued])
        next_second(clock)
        h = reg.stats(5)["history"]
        assert (
            sum(h["groups"]),
            sum(h["requests"]),
            sum(h["group_items"]),
            max(h["group_max"]),
        ) == (2, 11, 21, 20)


@pytest.mark.parametrize(
    "seconds", ["0", "601", "-1", "nan", "inf", "1e9", "abc", "", "9" * 10_000]
)
def test_the_window_is_bounded_and_a_bad_one_is_refused_by_name(http, seconds):
    r = http.get("/v1/stats", params={"seconds": seconds})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid_request"
    assert "query parameter 'seconds' must be a finite number in [1, 600]" in r.json()["message"]
    assert len(r.text) < 600  # never echoed whole


def test_the_window_defaults_to_five_minutes_and_goes_to_ten(http):
    assert len(http.get("/v1/stats").json()["history"]["t"]) == 300
    assert len(http.get("/v1/stats", params={"seconds": "600"}).json()["history"]["commits"]) == 600
    assert len(http.get("/v1/stats", params={"seconds": "1"}).json()["history"]["groups"]) == 1


def test_a_stats_request_takes_no_body(http):
    r = http.request("GET", "/v1/stats", content=b"x" * 100, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415, r.text


def test_pages_of_this_machine_may_read_the_stats_with_the_key_and_nothing_else(service):
    key = bearer(service.secret.read_key().reveal())
    with httpx.Client(base_url=service.url, timeout=10) as c:
        pre = c.options(
            "/v1/stats",
            headers={
                "Origin": PAGE,
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert pre.status_code == 204, pre.text
        assert (
            pre.headers["access-control-allow-origin"] == PAGE
            and pre.headers["access-control-allow-headers"] == "Authorization"
        )
        assert "access-control-allow-credentials" not in pre.headers
        for origin in (PAGE, "http://localhost:8000", "https://[::1]:9"):
            r = c.get(
                "/v1/stats",
                params={"seconds": "2"},
                headers={**key, "Origin": origin, "Sec-Fetch-Site": "same-site"},
            )
            assert r.status_code == 200, (origin, r.text)
            assert (
                r.headers["access-control-allow-origin"] == origin and r.headers["vary"] == "Origin"
            )
        r = c.get(
            "/v1/stats", headers={"Origin": PAGE}
        )  # no key: refused, in words the page can read
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == PAGE

        for origin in (
            "http://evil.example",
            "null",
            "http://127.0.0.1.evil.example:7300",
            "http://user@127.0.0.1:7300",
        ):
            r = c.get("/v1/stats", headers={**key, "Origin": origin})
            assert r.status_code == 403, (origin, r.text)
            assert "access-control-allow-origin" not in r.headers
            pre = c.options(
                "/v1/stats", headers={"Origin": origin, "Access-Control-Request-Method": "GET"}
            )
            assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
        for method, asked in (
            ("POST", "authorization"),
            ("GET", "authorization, content-type"),
            ("DELETE", ""),
        ):
            pre = c.options(
                "/v1/stats",
                headers={
                    "Origin": PAGE,
                    "Access-Control-Request-Method": method,
                    "Access-Control-Request-Headers": asked,
                },
            )
            assert (
                pre.status_code == 403
                and "with GET and an Authorization header only" in pre.json()["message"]
            ), (method, asked)
        # every other route stays same-origin, even with the secret
        assert c.get("/v1/status", headers={"Origin": PAGE}).status_code == 403
        secret = bearer(service.secret.reveal())
        assert (
            c.post(
                "/v1/lookup", json={"ids": ["a"]}, headers={**secret, "Origin": PAGE}
            ).status_code
            == 403
        )
        pre = c.options(
            "/v1/commit", headers={"Origin": PAGE, "Access-Control-Request-Method": "POST"}
        )
        assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers


def test_the_in_process_client_answers_the_same_figures():
    with InProcessRegistryClient() as reg:
        reg.commit_many([("a", "t", 1_000), ("b", "t", 1_000)])
        stats = reg.stats(3)
        assert (
            stats["totals"]["committed"] == 2
            and stats["totals"]["group_items"] == 2
            and len(stats["history"]["t"]) == 3
        )
        for bad in (0, 601):
            with pytest.raises(InvalidRequestError, match=r"seconds must be in \[1, 600\]"):
                reg.stats(bad)
