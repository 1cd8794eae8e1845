"""The authority's HTTP/JSON service (Starlette on uvicorn): a thin, locked-down shell over the core.

Before a request reaches a route, :class:`servicekit.http.GuardMiddleware` checks its
``Host`` (421), its ``Origin`` (403), the bearer secret on every mutation and on
``GET /v1/intervals`` (401: it reveals sequencer tokens), and its body size from
``Content-Length`` and while it streams (413). See ``docs/authority.md`` for the threat
model and the routes.

Two threads share the work, so that a read never queues behind a write:

* the **event loop** parses HTTP, runs the guard, reads request bodies, and answers the
  reads of published watermarks (``/v1/watermarks``, ``/v1/watermark`` without ``pct``,
  ``/v1/history``) from :meth:`Authority.published`, an immutable snapshot that every
  write replaces after journaling it (§7.2: a value is revealed only once durable);
* one **writer thread** decodes and validates JSON bodies and calls the core for every
  mutation and for the reads that journal or walk the interval maps (percentiles,
  ``/v1/status``, ``/v1/intervals``), one at a time, so the core needs no locks.

A background task samples the published watermarks every ``sample_interval`` seconds for
the dashboard's lag chart (kept in memory only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from servicekit import Secret, check_fields, describe, parse_json, parse_number, service
from servicekit.http import (
    Guard,
    GuardMiddleware,
    json_endpoint,
)
from servicekit.service import ServeFlags
from watermark_authority._core import Authority, check_percentile, summarize, wall_ms
from watermark_authority._errors import InvalidRequestError
from watermark_authority.client import SERVICE

STATIC_DIR = Path(__file__).parent / "static"
#: the authority's documents nest at most 3 levels ({"reports": [[...]]}); allow some slack
MAX_JSON_DEPTH = 8
#: reads that reveal sequencer tokens: served only with the secret
PRIVATE_READS = frozenset({"/v1/intervals"})
#: what a 401 tells the client about where the secret comes from
SECRET_HINT = SERVICE.secret_hint()
HOST_HINT = "start the authority with --allow-host NAME"
#: where the dashboard's page may read from besides its own origin: services on this machine's
#: loopback (an IdRegistry's /v1/stats for its panel; CSP cannot name [::1]), and --dashboard-source
DASHBOARD_CONNECT = (
    "http://127.0.0.1:*",
    "http://localhost:*",
    "https://127.0.0.1:*",
    "https://localhost:*",
)
#: an origin --dashboard-source takes: a scheme, a host name or IPv4 address, a port
_SOURCE = re.compile(r"https?://[a-z0-9.-]{1,253}(:[0-9]{1,5})?")
#: the longest history a client may ask for (the sampler keeps at most --history seconds anyway)
MAX_HISTORY_SECONDS = 7 * 24 * 3600.0

log = logging.getLogger("watermark_authority")
T = TypeVar("T")


class History:
    """The last ``seconds`` of watermark samples: ``(wall_ms, {name: low_watermark})``.

    ``clock`` returns wall time in milliseconds (tests pass their own).

    >>> now = [10_000]
    >>> h = History(seconds=2, interval=1, clock=lambda: now[0])
    >>> for t in (10_000, 11_000, 12_000, 13_000):
    ...     now[0] = t
    ...     h.sample({"c": t - 500})
    >>> [s["t"] for s in h.since(11_500)], h.since(13_000)
    ([12000, 13000], [{'t': 13000, 'w': {'c': 12500}}])
    """

    def __init__(
        self, seconds: float = 600.0, interval: float = 1.0, *, clock: Callable[[], int] = wall_ms
    ) -> None:
        self.interval = interval
        self.clock = clock
        self.samples: deque[tuple[int, Mapping[str, int]]] = deque(
            maxlen=max(2, int(seconds / interval) + 1)
        )

    def sample(self, published: Mapping[str, int]) -> None:
        """Record ``published`` (an immutable snapshot, kept as is) at the current wall time."""
        self.samples.append((self.clock(), published))

    def since(self, start_ms: int) -> list[dict[str, Any]]:
        return [{"t": t, "w": dict(w)} for t, w in self.samples if t >= start_ms]


def dashboard_csp(sources: Sequence[str] = ()) -> str:
    """The dashboard page's Content-Security-Policy: scripts and styles from this origin only, never
    framed; it may read this origin, loopback services and ``sources`` (origins, see :func:`check_source`).

    >>> dashboard_csp(["https://registry.example.com"]).split("; ")[1]
    "connect-src 'self' http://127.0.0.1:* http://localhost:* https://127.0.0.1:* https://localhost:* https://registry.example.com"
    """
    connect = " ".join(["'self'", *DASHBOARD_CONNECT, *(check_source(s) for s in sources)])
    return f"default-src 'self'; connect-src {connect}; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def check_source(origin: str) -> str:
    """``origin`` (``https://registry.example.com[:port]``) lower-cased, or :class:`ValueError` naming the form."""
    value = origin.strip().rstrip("/").lower()
    if not _SOURCE.fullmatch(value):
        msg = f"--dashboard-source takes an origin such as https://registry.example.com:7310 (a scheme, a host, a port), got {describe(origin, 80)}"
        raise ValueError(msg)
    return value


def authority_guard(secret: Secret, **flags: Any) -> Guard:
    """The :class:`~servicekit.http.Guard` of an authority; ``flags``: ``bind_host``,
    ``allow_hosts``, ``allow_origins``, ``max_body_bytes`` (see :meth:`Guard.for_bind <servicekit.http.Guard.for_bind>`)."""
    return Guard.for_bind(
        secret,
        private_reads=PRIVATE_READS,
        secret_hint=SECRET_HINT,
        host_hint=HOST_HINT,
        service=SERVICE.the,
        **flags,
    )


def _body(raw: bytes, path: str, fields: dict[str, bool]) -> dict[str, Any]:
    """The JSON object in ``raw`` with the required (True) and optional (False) fields."""
    value = parse_json(raw, max_depth=MAX_JSON_DEPTH, error=InvalidRequestError)
    return check_fields(value, fields, where=path, error=InvalidRequestError)


def _reports(value: Any) -> list[tuple[Any, Any, Any, Any]]:
    if not isinstance(value, list):
        msg = f"'reports' must be a list of [interval, token, oldest_work, pending] or objects, got {type(value).__name__}"
        raise InvalidRequestError(msg)
    out = []
    for i, r in enumerate(value):
        if isinstance(r, list) and len(r) in (3, 4):
            out.append((r[0], r[1], r[2], r[3] if len(r) == 4 else None))
        elif isinstance(r, dict):
            extra = set(r) - {"interval", "token", "oldest_work", "pending"}
            if extra or not {"interval", "token", "oldest_work"} <= set(r):
                shown = sorted(describe(k, 40) for k in list(r)[:8])
                msg = f"report #{i} must have fields interval, token, oldest_work and optionally pending; got {shown}"
                raise InvalidRequestError(msg)
            out.append((r["interval"], r["token"], r["oldest_work"], r.get("pending")))
        else:
            msg = f"report #{i} must be [interval, token, oldest_work(, pending)] or an object, got {describe(r)}"
            raise InvalidRequestError(msg)
    return out


def _query(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if value is None:
        msg = f"{request.url.path}: missing query parameter {name!r}"
        raise InvalidRequestError(msg)
    return value


def create_app(
    authority: Authority,
    *,
    guard: Guard,
    history: History | None = None,
    dashboard_sources: Sequence[str] = (),
) -> Starlette:
    """The Starlette application serving ``authority`` (and its dashboard) behind ``guard``;
    ``dashboard_sources``: origins the dashboard may read beyond loopback (``--dashboard-source``)."""
    history = history if history is not None else History()
    csp = dashboard_csp(dashboard_sources)
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="authority-writer")

    async def on_writer(fn: Callable[[], T]) -> T:
        """Run ``fn`` on the writer thread: the only thread that calls the core's mutations."""
        return await asyncio.get_running_loop().run_in_executor(writer, fn)

    def endpoint(fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
        return json_endpoint(fn, logger=log)

    def mutation(
        fields: dict[str, bool], apply: Callable[[dict[str, Any]], Any]
    ) -> Callable[[Request], Any]:
        """A POST route: the body is read on the loop, decoded and applied on the writer."""

        async def route(request: Request) -> Any:
            raw = await request.body()
            path = request.url.path
            return await on_writer(lambda: apply(_body(raw, path, fields)))

        return endpoint(route)

    def report(b: dict[str, Any]) -> Any:
        reports = _reports(b["reports"])
        authority.report(b["computation"], reports)
        return {"accepted": len(reports)}

    def check_token(b: dict[str, Any]) -> Any:
        authority.check_token(b["computation"], b["interval"], b["token"])
        return {"ok": True}

    def expect(b: dict[str, Any]) -> Any:
        authority.expect_injector_processes(b["injector"], b["processes"])
        return {"ok": True}

    def report_injector(b: dict[str, Any]) -> Any:
        authority.report_injector(b["injector"], b["process"], b["low_watermark"])
        return {"ok": True}

    async def watermarks(request: Request) -> Any:
        return {"watermarks": dict(authority.published())}

    async def watermark(request: Request) -> Any:
        name = _query(request, "name")
        pct = request.query_params.get("pct")
        if pct is None:
            return {"name": name, "low_watermark": authority.watermark(name)}
        try:
            value = float(pct)
        except ValueError:
            msg = f"query parameter 'pct' must be a number in (0, 100], got {describe(pct)}"
            raise InvalidRequestError(msg) from None
        check_percentile(value)
        return {
            "name": name,
            "pct": value,
            "watermark": await on_writer(lambda: authority.percentile_watermark(name, value)),
        }

    async def status(request: Request) -> Any:
        return await on_writer(authority.status)

    async def intervals(request: Request) -> Any:
        computation = _query(request, "computation")
        return {"intervals": await on_writer(lambda: authority.intervals(computation))}

    async def get_history(request: Request) -> Any:
        text = request.query_params.get("seconds", "600")
        span = parse_number(
            "query parameter 'seconds'",
            text,
            lo=0,
            hi=MAX_HISTORY_SECONDS,
            error=InvalidRequestError,
        )
        now = wall_ms()
        return {
            "now": now,
            "interval": history.interval,
            "samples": history.since(now - int(span * 1000)),
        }

    async def health(request: Request) -> Any:
        return {"ok": True}

    async def dashboard(request: Request) -> Response:
        return FileResponse(
            STATIC_DIR / "dashboard.html",
            headers={"Cache-Control": "no-store", "Content-Security-Policy": csp},
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def sampler() -> None:
            while True:
                try:
                    history.sample(authority.published())
                except Exception:  # keep sampling; the error is logged
                    log.exception("sampling watermarks failed")
                await asyncio.sleep(history.interval)

        task = asyncio.create_task(sampler())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            writer.shutdown(wait=True)
            authority.close()

    acquire_fields = {"computation": True, "intervals": True, "owner": False}
    split_fields = {"computation": True, "interval": True, "into": True, "owner": False}
    merge_fields = {"computation": True, "intervals": True, "into": True, "owner": False}
    routes = [
        Route("/", dashboard),
        Route("/healthz", endpoint(health)),
        Route(
            "/v1/acquire",
            mutation(
                acquire_fields,
                lambda b: {
                    "tokens": authority.acquire(
                        b["computation"], b["intervals"], owner=b.get("owner")
                    )
                },
            ),
            methods=["POST"],
        ),
        Route(
            "/v1/report", mutation({"computation": True, "reports": True}, report), methods=["POST"]
        ),
        Route(
            "/v1/token/check",
            mutation({"computation": True, "interval": True, "token": True}, check_token),
            methods=["POST"],
        ),
        Route(
            "/v1/split",
            mutation(
                split_fields,
                lambda b: {
                    "tokens": authority.split(
                        b["computation"], b["interval"], b["into"], owner=b.get("owner")
                    )
                },
            ),
            methods=["POST"],
        ),
        Route(
            "/v1/note",
            mutation(
                {"computation": True, "text": True},
                lambda b: authority.note(b["computation"], b["text"]) or {"ok": True},
            ),
            methods=["POST"],
        ),
        Route(
            "/v1/merge",
            mutation(
                merge_fields,
                lambda b: {
                    "token": authority.merge(
                        b["computation"], b["intervals"], b["into"], owner=b.get("owner")
                    )
                },
            ),
            methods=["POST"],
        ),
        Route(
            "/v1/injectors/expect",
            mutation({"injector": True, "processes": True}, expect),
            methods=["POST"],
        ),
        Route(
            "/v1/injectors/report",
            mutation({"injector": True, "process": True, "low_watermark": True}, report_injector),
            methods=["POST"],
        ),
        Route("/v1/watermarks", endpoint(watermarks)),
        Route("/v1/watermark", endpoint(watermark)),
        Route("/v1/status", endpoint(status)),
        Route("/v1/intervals", endpoint(intervals)),
        Route("/v1/history", endpoint(get_history)),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, middleware=[Middleware(GuardMiddleware, guard=guard)]
    )


def serve(
    flags: ServeFlags,
    *,
    sync: bool = False,
    sample_interval: float = 1.0,
    history_seconds: float = 600.0,
    dashboard_sources: Sequence[str] = (),
) -> int:
    """Run the service until SIGINT/SIGTERM; returns the exit code."""
    from watermark_authority._journal import RocksJournal

    logging.basicConfig(
        level=flags.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    secret = service.server_secret(SERVICE, flags)
    if secret is None:
        return 2
    journal_dir = os.path.join(flags.data_dir, "journal")
    try:
        journal = RocksJournal(journal_dir, sync=sync)
    except Exception as exc:
        print(
            f"watermark authority: cannot open the journal at {journal_dir} ({exc}); is another authority using this --data-dir?",
            file=sys.stderr,
        )
        return 2
    authority = Authority(journal)
    sock, url = service.listen(SERVICE, flags)
    # a read waits for the writer thread's interpreter lock at most this long (default 5 ms)
    sys.setswitchinterval(0.001)

    def banner() -> str:
        known = authority.watermarks()
        return f"watermark authority listening on {url} (journal {journal_dir}; secret from {secret.source}; {len(known)} names: {summarize(known)[:200]})"

    guard = authority_guard(secret, **flags.guard_options(sock))
    app = create_app(
        authority,
        guard=guard,
        history=History(history_seconds, sample_interval),
        dashboard_sources=dashboard_sources,
    )
    service.run_app(app, sock, banner=banner, graceful_timeout=3, **flags.run_options())
    print("watermark authority stopped", flush=True)
    return 0
