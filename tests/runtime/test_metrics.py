"""The Prometheus endpoint of a run: what it serves, and what it refuses (loopback, read-only, bounded)."""

from __future__ import annotations

import http.client

import pytest

from millwheel import MAX_TIMESTAMP
from millwheel.runtime._metrics import MAX_CONNECTIONS, MetricsServer, render
from millwheel.runtime._status import Row, Snapshot

T0 = 1_700_000_000_000
SNAPSHOT = Snapshot(
    42.0,
    T0 + 10_000,
    (
        Row("queries", "injector", None, 1_000, 3, None, None, MAX_TIMESTAMP),
        Row(
            'Odd "name"',
            "computation",
            990,
            99,
            0,
            7,
            2,
            T0,
            timers_fired=99,
            batches=12,
            lag_ms=10_000,
            event_lag_ms=1_500,
            batch_ms=250,
        ),
    ),
)


@pytest.fixture
def server():
    with MetricsServer(lambda: SNAPSHOT, "demo") as s:
        yield s


def _get(server, path="/metrics", method="GET", headers=None, body=None):
    host, port = server.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read().decode()
    conn.close()
    return resp, data


def test_the_text_format_has_counters_and_gauges_per_computation():
    text = render(SNAPSHOT, "demo")
    labels = 'topology="demo",name="Odd \\"name\\"",kind="computation"'
    for line in (
        f"millwheel_records_in_total{{{labels}}} 990",
        f"millwheel_records_out_total{{{labels}}} 99",
        f"millwheel_duplicates_total{{{labels}}} 7",
        f"millwheel_late_records_total{{{labels}}} 2",
        f"millwheel_timers_fired_total{{{labels}}} 99",
        f"millwheel_batch_duration_seconds{{{labels}}} 0.25",
        f"millwheel_low_watermark_seconds{{{labels}}} 1700000000.0",
        f"millwheel_lag_seconds{{{labels}}} 10.0",
        f"millwheel_event_time_lag_seconds{{{labels}}} 1.5",
        'millwheel_dead_letters_total{topology="demo",name="queries",kind="injector"} 3',
        'millwheel_low_watermark_seconds{topology="demo",name="queries",kind="injector"} +Inf',
        "# TYPE millwheel_records_in_total counter",
        "# TYPE millwheel_lag_seconds gauge",
    ):
        assert line in text.splitlines(), line
    assert (
        'millwheel_records_in_total{topology="demo",name="queries"' not in text
    )  # injectors have no input
    assert (
        render(None, "demo").splitlines()[-1] == 'millwheel_up{topology="demo"} 1'
    )  # before the first snapshot


def test_the_endpoint_serves_on_loopback_only_what_it_is_asked(server):
    assert server.httpd.server_address[0] == "127.0.0.1"
    resp, text = _get(server)
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    assert resp.getheader("X-Content-Type-Options") == "nosniff"
    assert "millwheel_records_in_total" in text
    assert "/" not in "".join(
        line for line in text.splitlines() if not line.startswith("#")
    )  # no paths in samples
    resp, _ = _get(server, method="HEAD")
    assert resp.status == 200


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status"),
    [
        ("GET", "/metrics", {"Host": "evil.example"}, None, 421),  # DNS rebinding
        (
            "GET",
            "/metrics",
            {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
            None,
            403,
        ),  # another site's page
        ("POST", "/metrics", {}, b"x", 405),
        ("DELETE", "/metrics", {}, None, 405),
        ("GET", "/metrics", {"Content-Length": "3"}, b"abc", 413),
        ("GET", "/secrets", {}, None, 404),
    ],
)
def test_the_endpoint_refuses_what_is_not_a_read_of_the_metrics(
    server, method, path, headers, body, status
):
    resp, text = _get(server, path, method, headers, body)
    assert resp.status == status
    assert text.strip()  # says what is wrong


def test_the_endpoint_is_bounded(server):
    for _ in range(MAX_CONNECTIONS):
        assert server.slots.acquire(blocking=False)
    try:
        resp, _ = _get(server)
        assert resp.status == 503 and resp.getheader("Retry-After") == "1"
    finally:
        for _ in range(MAX_CONNECTIONS):
            server.slots.release()
    assert _get(server)[0].status == 200


def test_a_taken_port_is_named_with_the_fix():
    with MetricsServer(lambda: None, "demo") as first:
        port = first.httpd.server_address[1]
        with pytest.raises(
            OSError, match=f"cannot serve metrics on 127.0.0.1:{port}.*--metrics-port"
        ):
            MetricsServer(lambda: None, "demo", port=port)
