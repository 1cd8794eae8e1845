"""A Prometheus endpoint for a run: per-computation counters and gauges, in the text format.

``millwheel run`` serves ``GET /metrics`` on loopback (``--metrics-port``, default a free
port; ``--no-metrics`` turns it off) from the same snapshots as the live status
(``_status.py``); ``docs/deployment.md`` has an example scrape. Every sample is labelled
``topology`` and ``name`` (the injector or computation) and ``kind``.

Secure by default, like every millwheel service:

* it listens on ``127.0.0.1`` unless given another host, and answers only ``Host`` names
  of the address it is bound to (a re-pointed DNS name — DNS rebinding — gets 421) and no
  page of another site (403): servicekit's :class:`~servicekit.http.Guard` checks both, as
  for every millwheel service;
* it has two read-only resources (``/metrics``, ``/``); any other method gets 405, a
  request with a body 413, any other path 404;
* it reveals names and numbers, no path, no secret, no user data;
* it is bounded: at most :data:`MAX_CONNECTIONS` requests at once (503 beyond),
  :data:`REQUEST_TIMEOUT_S` to send a request, a response whose size is bounded by the
  topology's size, computed from the last snapshot (a scrape never calls Spark).

>>> from millwheel.runtime._status import Row, Snapshot
>>> snap = Snapshot(1.0, 1_700_000_010_000, (Row("Counter", "computation", 5, 2, 0, 1, 0, 1_700_000_000_000, lag_ms=10_000),))
>>> text = render(snap, "demo")
>>> 'millwheel_records_in_total{topology="demo",name="Counter",kind="computation"} 5' in text
True
>>> 'millwheel_lag_seconds{topology="demo",name="Counter",kind="computation"} 10.0' in text
True
>>> snap = Snapshot(1.0, 1_700_000_010_000, (Row("Counter", "computation", 5, 2, 0, 1, 0, 0, counters={"bloom_maybe": 3}),))
>>> 'millwheel_step_bloom_maybe_total{topology="demo",name="Counter"} 3' in render(snap, "demo")
True
"""

from __future__ import annotations

import http.server
import secrets
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers

from millwheel._counters import COUNTERS
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP
from millwheel.runtime._status import Row, Snapshot
from servicekit.errors import ServiceError
from servicekit.http import Guard, hosts_for_bind
from servicekit.secret import Secret

MAX_CONNECTIONS = 8
REQUEST_TIMEOUT_S = 5.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: (metric, type, help, value of a row or None to leave the sample out)
_METRICS: tuple[tuple[str, str, str, Callable[[Row], float | int | None]], ...] = (
    (
        "millwheel_records_in_total",
        "counter",
        "Records delivered to a computation's user code (after dedup and keying).",
        lambda r: r.records_in,
    ),
    (
        "millwheel_records_out_total",
        "counter",
        "Records published: a computation's productions, an injector's records.",
        lambda r: r.records_out,
    ),
    (
        "millwheel_duplicates_total",
        "counter",
        "Records dropped as duplicates by record id (MillWheel 6.1.1).",
        lambda r: r.duplicates,
    ),
    (
        "millwheel_late_records_total",
        "counter",
        "Records behind the low watermark when they arrived (4.5).",
        lambda r: r.late,
    ),
    (
        "millwheel_dead_letters_total",
        "counter",
        "Records and timers sent to the dead_letters stream.",
        lambda r: r.dead_letters,
    ),
    ("millwheel_timers_fired_total", "counter", "Timers fired.", lambda r: r.timers_fired),
    (
        "millwheel_batches_total",
        "counter",
        "Micro-batches published by this driver since it started.",
        lambda r: r.batches,
    ),
    (
        "millwheel_batch_duration_seconds",
        "gauge",
        "Duration of the last micro-batch of the query, from Spark's progress.",
        lambda r: None if r.batch_ms is None else r.batch_ms / 1000,
    ),
    (
        "millwheel_low_watermark_seconds",
        "gauge",
        "Low watermark, seconds since the epoch (+Inf once finished; absent while nothing is known).",
        lambda r: _watermark(r.low_watermark),
    ),
    (
        "millwheel_lag_seconds",
        "gauge",
        "Wall time minus the low watermark.",
        lambda r: None if r.lag_ms is None else r.lag_ms / 1000,
    ),
    (
        "millwheel_event_time_lag_seconds",
        "gauge",
        "Newest event time read by the injectors minus the computation's low watermark.",
        lambda r: None if r.event_lag_ms is None else r.event_lag_ms / 1000,
    ),
)


def _watermark(lw: int) -> float | None:
    if lw >= MAX_TIMESTAMP:
        return float("inf")
    if lw <= MIN_TIMESTAMP:
        return None
    return lw / 1000


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float | int) -> str:
    if isinstance(v, float):
        if v == float("inf"):
            return "+Inf"
        return repr(round(v, 3))
    return str(v)


def render(snapshot: Snapshot | None, topology: str) -> str:
    """The Prometheus text exposition of a snapshot."""
    rows = snapshot.rows if snapshot is not None else ()
    top = _label(topology)
    out = [
        "# HELP millwheel_up 1 while the run's driver is running.",
        "# TYPE millwheel_up gauge",
        f'millwheel_up{{topology="{top}"}} 1',
    ]
    if snapshot is not None:
        out += [
            "# HELP millwheel_run_seconds Seconds since the driver started the run.",
            "# TYPE millwheel_run_seconds gauge",
            f'millwheel_run_seconds{{topology="{top}"}} {_number(float(snapshot.elapsed_s))}',
        ]
    for metric, kind, text, value in _METRICS:
        samples = []
        for r in rows:
            v = value(r)
            if v is not None:
                samples.append(
                    f'{metric}{{topology="{top}",name="{_label(r.name)}",kind="{r.kind}"}} {_number(v)}'
                )
        if samples:
            out += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}", *samples]
    # every step counter (StepMetrics), the same names as the harness's Harness.metrics()
    for counter, text in COUNTERS.items():
        metric = f"millwheel_step_{counter}_total"
        samples = [
            f'{metric}{{topology="{top}",name="{_label(r.name)}"}} {r.counters.get(counter, 0)}'
            for r in rows
            if r.counters is not None
        ]
        if samples:
            out += [f"# HELP {metric} {text}", f"# TYPE {metric} counter", *samples]
    return "\n".join(out) + "\n"


class MetricsServer:
    """``GET /metrics`` in a daemon thread, from the last snapshot ``source()`` returns."""

    def __init__(
        self,
        source: Callable[[], Snapshot | None],
        topology: str,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.source = source
        self.topology = topology
        # the endpoint takes no writes: the guard's secret is a random one nobody is given
        self.guard = Guard(
            secret=Secret(
                secrets.token_urlsafe(32), source="nowhere (the metrics endpoint takes no writes)"
            ),
            allowed_hosts=hosts_for_bind(host),
            host_hint="scrape it by its address, http://127.0.0.1:PORT/metrics",
            service="the metrics endpoint",
        )
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        handler = _handler(self)
        try:
            self.httpd = _Server((host, port), handler)
        except OSError as exc:
            msg = f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}); pass another --metrics-port, or --no-metrics"
            raise OSError(msg) from exc
        bound_host, bound_port = (
            str(self.httpd.server_address[0]),
            int(self.httpd.server_address[1]),
        )
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.url = f"http://{shown}:{bound_port}/metrics"
        # stop() waits for the serving loop's next poll: a short one makes stopping prompt
        self.thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="millwheel-metrics",
            daemon=True,
        )

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)


def _handler(server: MetricsServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S
        server_version = "millwheel-metrics"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            pass

        def _send(
            self,
            status: int,
            body: str,
            content_type: str = "text/plain; charset=utf-8",
            extra: dict[str, str] | None = None,
        ) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("X-Frame-Options", "DENY")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            if status >= 400:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _refusal(self) -> tuple[int, str, dict[str, str]] | None:
            headers = Headers(
                raw=[
                    (k.lower().encode("latin-1"), v.encode("latin-1"))
                    for k, v in self.headers.items()
                ]
            )
            try:
                server.guard.check_host(headers)
                server.guard.check_origin("GET", headers)
            except ServiceError as exc:
                return exc.status, f"{exc}\n", {}
            if self.command not in ("GET", "HEAD"):
                return 405, "read-only: GET /metrics\n", {"Allow": "GET, HEAD"}
            length = self.headers.get("Content-Length")
            if (length not in (None, "", "0")) or self.headers.get("Transfer-Encoding"):
                return 413, "a metrics request has no body\n", {}
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                return 404, "not found: the metrics are at /metrics\n", {}
            return None

        def _answer(self) -> None:
            if not server.slots.acquire(blocking=False):
                self._send(503, "busy; try again\n", extra={"Retry-After": "1"})
                return
            try:
                refusal = self._refusal()
                if refusal is not None:
                    self._send(refusal[0], refusal[1], extra=refusal[2])
                elif self.path.split("?", 1)[0] == "/":
                    self._send(
                        200,
                        f"millwheel metrics of topology {server.topology}: GET /metrics (Prometheus text format)\n",
                    )
                else:
                    self._send(200, render(server.source(), server.topology), CONTENT_TYPE)
            finally:
                server.slots.release()

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _answer

    return Handler


def serve(
    source: Callable[[], Snapshot | None], topology: str, host: str, port: int
) -> MetricsServer | None:
    """Start a :class:`MetricsServer`; on failure, say why on stderr and return ``None`` (the run goes on)."""
    try:
        return MetricsServer(source, topology, host, port).start()
    except OSError as exc:
        print(f"millwheel: {exc}", file=sys.stderr)
        return None


__all__ = ["MetricsServer", "render", "serve"]
