"""The HTTP service: malformed requests get a 4xx with a reason and change nothing.

(Attacks, as opposed to mistakes, are in ``test_authority_security``.)
"""

from __future__ import annotations

import json

JSON = {"Content-Type": "application/json"}


def bad_requests(c, inj, tokens):
    a, b = tokens["a"], tokens["b"]
    return [
        ("POST", "/v1/report", b"{not json", 400, "not valid JSON"),
        ("POST", "/v1/report", b"[1, 2]", 400, "must be a JSON object"),
        ("POST", "/v1/report", {"computation": c}, 400, "missing field(s) ['reports']"),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [], "extra": 1},
            400,
            "unexpected field(s) ['extra']",
        ),
        ("POST", "/v1/report", {"computation": c, "reports": "a"}, 400, "must be a list"),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["b", b]]},
            400,
            "report #1",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["b", b, "soon"]]},
            400,
            "integer timestamp",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["b", b, 1.5]]},
            400,
            "integer timestamp",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["b", b, 2**64]]},
            400,
            "MAX_TIMESTAMP",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["b", b, 6_000, -3]]},
            400,
            "pending must be an integer in [0, 9223372036854775807] (a count of pending work) or null",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["b", b, 6_000, True]]},
            400,
            "pending must be an integer in [0, 9223372036854775807] (a count of pending work) or null",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["b", 2**63, 6_000]]},
            400,
            "token must be",
        ),
        (
            "POST",
            "/v1/acquire",
            {"computation": c, "intervals": ["x"], "owner": ""},
            400,
            "owner must be a non-empty string",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["b", "x", 6_000]]},
            400,
            "token must be",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], {"interval": "b", "token": b}]},
            400,
            "oldest_work",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["zz", b, 6_000]]},
            404,
            "acquire an interval before reporting",
        ),
        (
            "POST",
            "/v1/report",
            {"computation": c, "reports": [["a", a, 5_000], ["b", b + 1000, 6_000]]},
            409,
            "stale sequencer token",
        ),
        ("POST", "/v1/report", {"computation": "", "reports": []}, 400, "non-empty string"),
        ("POST", "/v1/acquire", {"computation": c, "intervals": "a"}, 400, "non-empty list"),
        ("POST", "/v1/acquire", {"computation": c, "intervals": ["x", "x"]}, 400, "twice"),
        (
            "POST",
            "/v1/acquire",
            {"computation": c, "intervals": ["x", "bad\x00name"]},
            400,
            "printable",
        ),
        ("POST", "/v1/acquire", {"computation": inj, "intervals": ["x"]}, 409, "namespace"),
        (
            "POST",
            "/v1/split",
            {"computation": c, "interval": "a", "into": ["b", "a2"]},
            409,
            "already intervals",
        ),
        (
            "POST",
            "/v1/merge",
            {"computation": c, "intervals": ["a", "nope"], "into": "ab"},
            404,
            "no interval 'nope'",
        ),
        (
            "POST",
            "/v1/injectors/report",
            {"injector": inj, "process": "p9", "low_watermark": 9_000},
            404,
            "expected set",
        ),
        (
            "POST",
            "/v1/injectors/report",
            {"injector": inj, "process": "p0", "low_watermark": "9000"},
            400,
            "integer timestamp",
        ),
        ("POST", "/v1/injectors/expect", {"injector": inj, "processes": []}, 400, "non-empty list"),
        (
            "POST",
            "/v1/token/check",
            {"computation": c, "interval": "a", "token": 0},
            400,
            "token must be an integer in [1, 9223372036854775807] (the token that acquire returned), got 0",
        ),
        ("GET", "/v1/watermark", None, 400, "missing query parameter 'name'"),
        (
            "GET",
            "/v1/watermark?name=nobody-at-all",
            None,
            404,
            "no computation or injector named 'nobody-at-all'",
        ),
        ("GET", f"/v1/watermark?name={c}&pct=abc", None, 400, "(0, 100]"),
        ("GET", f"/v1/watermark?name={c}&pct=0", None, 400, "(0, 100]"),
        ("GET", f"/v1/watermark?name={c}&pct=nan", None, 400, "(0, 100]"),
        (
            "GET",
            "/v1/intervals?computation=nobody-at-all",
            None,
            404,
            "no computation named 'nobody-at-all'",
        ),
    ]


def test_malformed_requests_get_a_4xx_with_a_reason_and_change_nothing(http, seeded):
    c, inj, tokens, snapshot = seeded
    before = snapshot()
    for method, path, body, status, reason in bad_requests(c, inj, tokens):
        if isinstance(body, bytes):
            r = http.request(method, path, content=body, headers=JSON)
        else:
            r = http.request(method, path, json=body)
        assert r.status_code == status, (path, body, r.status_code, r.text)
        payload = r.json()
        assert reason in payload["message"], (path, body, payload)
        assert payload["error"] in {"invalid_request", "unknown_name", "stale_token", "conflict"}
        assert snapshot() == before, f"{path} {body!r} changed the authority's state"


def test_reports_accept_arrays_and_objects(http, seeded):
    c, _, tokens, _ = seeded
    r = http.post(
        "/v1/report",
        json={
            "computation": c,
            "reports": [
                ["a", tokens["a"], 1_500, 2],
                {"interval": "b", "token": tokens["b"], "oldest_work": 1_700},
            ],
        },
    )
    assert r.json() == {"accepted": 2}
    assert http.get("/v1/watermark", params={"name": c}).json() == {
        "name": c,
        "low_watermark": 1_500,
    }
    assert (
        http.get("/v1/intervals", params={"computation": c}).json()["intervals"]["a"]["pending"]
        == 2
    )


def test_status_names_what_holds_each_watermark_and_its_owner(http, seeded):
    c, inj, _, _ = seeded
    status = http.get("/v1/status").json()
    holding = status["computations"][c]["holding"]
    assert holding["interval"] == "a" and holding["value"] == 1_000
    assert holding["owner"] is None  # acquired over raw HTTP without an owner
    assert "token" not in holding  # status is served without the secret: it never shows tokens
    assert status["injectors"][inj]["holding"] == {
        "process": "p0",
        "value": 3_000,
        "reported": True,
    }
    assert set(status["computations"][c]["percentiles"]) == {"99.000"}


def test_history_samples_watermarks_for_the_chart(http, seeded):
    c = seeded[0]
    hist = http.get("/v1/history", params={"seconds": "60"}).json()
    assert hist["interval"] > 0 and isinstance(hist["samples"], list)
    assert all(set(s) == {"t", "w"} for s in hist["samples"])
    for bad in ("x", "nan", "inf", "-1", "1e30"):
        r = http.get("/v1/history", params={"seconds": bad})
        assert r.status_code == 400 and "finite number" in r.json()["message"], (bad, r.text)
    # the sampler publishes what it samples, so the value seen in a later sample is c's watermark
    import time

    # a sample taken between the acquire and the report shows c with no watermark yet (the
    # minimum): wait for one taken after the report
    deadline = (
        time.monotonic() + 30
    )  # the session's service samples every 0.2 s; a loaded machine may be slower
    seen: list[int] = []
    while time.monotonic() < deadline:
        samples = http.get("/v1/history", params={"seconds": "60"}).json()["samples"]
        seen = [s["w"][c] for s in samples if c in s["w"]]
        if seen and seen[-1] == 1_000:
            break
        time.sleep(0.05)
    assert seen and seen[-1] == 1_000, seen
    assert set(seen) <= {-(2**63), 1_000}, (
        seen
    )  # nothing but "not reported yet" (the minimum), then its watermark


def test_the_dashboard_and_its_chart_library_are_served(http):
    page = http.get("/")
    assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
    js = http.get("/static/uPlot.iife.min.js")
    assert js.status_code == 200 and "uPlot" in js.text
    assert http.get("/static/dashboard.js").status_code == 200


def test_the_error_body_is_json_with_a_code(http):
    r = http.post(
        "/v1/acquire", content=json.dumps({"computation": 5, "intervals": ["a"]}), headers=JSON
    )
    assert r.status_code == 400
    assert r.json() == {
        "error": "invalid_request",
        "message": "computation must be a non-empty string, got 5",
    }


def test_the_client_names_its_process_as_the_owner(service, http, ns):
    c = f"{ns}c"
    with service.client(owner="worker-7:4242") as wm:
        t = wm.acquire(c, "interval-0")
        assert (
            http.get("/v1/intervals", params={"computation": c}).json()["intervals"]["interval-0"][
                "owner"
            ]
            == "worker-7:4242"
        )
        wm.report(c, "interval-0", t, 5)
        assert (
            http.get("/v1/status").json()["computations"][c]["holding"]["owner"] == "worker-7:4242"
        )
        wm.split(c, "interval-0", ["interval-0a", "interval-0b"])
    with service.client() as wm:  # the default owner: host:pid
        wm.acquire(c, "interval-0a")
    import os
    import socket

    owners = {
        iv: v["owner"]
        for iv, v in http.get("/v1/intervals", params={"computation": c})
        .json()["intervals"]
        .items()
    }
    assert owners == {
        "interval-0a": f"{socket.gethostname()}:{os.getpid()}",
        "interval-0b": "worker-7:4242",
    }
