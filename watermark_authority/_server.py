"""The authority's HTTP/JSON service (Starlette on uvicorn): a thin shell over the core.

Every request is parsed and checked here (a malformed one gets a 4xx with a reason),
handed to :class:`~watermark_authority.Authority` on the event-loop thread (so the core
sees one caller at a time), and answered after the journal write. The routes are listed
in ``docs/authority.md``. A background task samples every watermark each
``sample_interval`` seconds for the dashboard's lag chart (kept in memory only).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from watermark_authority._core import Authority, summarize, wall_ms
from watermark_authority._errors import AuthorityError, InvalidRequestError, StaleTokenError

STATIC_DIR = Path(__file__).parent / "static"
MAX_BODY_BYTES = 64 * 1024 * 1024

log = logging.getLogger("watermark_authority")


class History:
    """The last ``seconds`` of watermark samples: ``(wall_ms, {name: low_watermark})``."""

    def __init__(self, seconds: float = 600.0, interval: float = 1.0) -> None:
        self.interval = interval
        self.samples: deque[tuple[int, dict[str, int]]] = deque(maxlen=max(2, int(seconds / interval) + 1))

    def sample(self, authority: Authority) -> None:
        self.samples.append((wall_ms(), authority.watermarks()))

    def since(self, start_ms: int) -> list[dict[str, Any]]:
        return [{"t": t, "w": w} for t, w in self.samples if t >= start_ms]


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status_code=status, media_type="application/json")


def _error(exc: AuthorityError) -> Response:
    body: dict[str, Any] = {"error": exc.code, "message": str(exc)}
    if isinstance(exc, StaleTokenError):
        body["intervals"] = [list(x) for x in exc.intervals]
    return _json(body, exc.status)


async def _body(request: Request, fields: dict[str, bool]) -> dict[str, Any]:
    """The JSON object in the request, with the required (True) and optional (False) fields."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        msg = f"request body is {len(raw)} bytes, more than {MAX_BODY_BYTES}; send smaller batches"
        raise InvalidRequestError(msg)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        msg = f"request body is not valid JSON ({exc}); send a JSON object with fields {sorted(fields)}"
        raise InvalidRequestError(msg) from None
    if not isinstance(body, dict):
        msg = f"request body must be a JSON object with fields {sorted(fields)}, got {type(body).__name__}"
        raise InvalidRequestError(msg)
    missing = [f for f, required in fields.items() if required and f not in body]
    unexpected = [f for f in body if f not in fields]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing field(s) {missing}")
        if unexpected:
            parts.append(f"unexpected field(s) {unexpected}")
        msg = f"{request.url.path}: {' and '.join(parts)}; expected {sorted(fields)}"
        raise InvalidRequestError(msg)
    return body


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
                msg = f"report #{i} must have fields interval, token, oldest_work and optionally pending; got {sorted(r)}"
                raise InvalidRequestError(msg)
            out.append((r["interval"], r["token"], r["oldest_work"], r.get("pending")))
        else:
            msg = f"report #{i} must be [interval, token, oldest_work(, pending)] or an object, got {r!r}"
            raise InvalidRequestError(msg)
    return out


def _query(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if value is None:
        msg = f"{request.url.path}: missing query parameter {name!r}"
        raise InvalidRequestError(msg)
    return value


def create_app(authority: Authority, *, history: History | None = None) -> Starlette:
    """The Starlette application serving ``authority`` (and its dashboard)."""
    history = history if history is not None else History()

    def handler(fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                return _json(await fn(request))
            except AuthorityError as exc:
                return _error(exc)
            except Exception as exc:  # a bug, or the journal failed: nothing was acknowledged
                log.exception("internal error on %s %s", request.method, request.url.path)
                return _json({"error": "internal", "message": f"{type(exc).__name__}: {exc}"}, 500)

        return endpoint

    async def acquire(request: Request) -> Any:
        b = await _body(request, {"computation": True, "intervals": True})
        return {"tokens": authority.acquire(b["computation"], b["intervals"])}

    async def report(request: Request) -> Any:
        b = await _body(request, {"computation": True, "reports": True})
        reports = _reports(b["reports"])
        authority.report(b["computation"], reports)
        return {"accepted": len(reports)}

    async def check_token(request: Request) -> Any:
        b = await _body(request, {"computation": True, "interval": True, "token": True})
        authority.check_token(b["computation"], b["interval"], b["token"])
        return {"ok": True}

    async def split(request: Request) -> Any:
        b = await _body(request, {"computation": True, "interval": True, "into": True})
        return {"tokens": authority.split(b["computation"], b["interval"], b["into"])}

    async def merge(request: Request) -> Any:
        b = await _body(request, {"computation": True, "intervals": True, "into": True})
        return {"token": authority.merge(b["computation"], b["intervals"], b["into"])}

    async def expect(request: Request) -> Any:
        b = await _body(request, {"injector": True, "processes": True})
        authority.expect_injector_processes(b["injector"], b["processes"])
        return {"ok": True}

    async def report_injector(request: Request) -> Any:
        b = await _body(request, {"injector": True, "process": True, "low_watermark": True})
        authority.report_injector(b["injector"], b["process"], b["low_watermark"])
        return {"ok": True}

    async def watermarks(request: Request) -> Any:
        return {"watermarks": authority.watermarks()}

    async def watermark(request: Request) -> Any:
        name = _query(request, "name")
        pct = request.query_params.get("pct")
        if pct is None:
            return {"name": name, "low_watermark": authority.watermark(name)}
        try:
            value = float(pct)
        except ValueError:
            msg = f"query parameter 'pct' must be a number in (0, 100], got {pct!r}"
            raise InvalidRequestError(msg) from None
        return {"name": name, "pct": value, "watermark": authority.percentile_watermark(name, value)}

    async def status(request: Request) -> Any:
        return authority.status()

    async def intervals(request: Request) -> Any:
        return {"intervals": authority.intervals(_query(request, "computation"))}

    async def get_history(request: Request) -> Any:
        seconds = request.query_params.get("seconds", "600")
        try:
            span = float(seconds)
        except ValueError:
            msg = f"query parameter 'seconds' must be a number, got {seconds!r}"
            raise InvalidRequestError(msg) from None
        now = wall_ms()
        return {"now": now, "interval": history.interval, "samples": history.since(now - int(span * 1000))}

    async def health(request: Request) -> Any:
        return {"ok": True}

    async def dashboard(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "dashboard.html", headers={"Cache-Control": "no-store"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def sampler() -> None:
            while True:
                try:
                    history.sample(authority)
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
            authority.close()

    routes = [
        Route("/", dashboard),
        Route("/healthz", handler(health)),
        Route("/v1/acquire", handler(acquire), methods=["POST"]),
        Route("/v1/report", handler(report), methods=["POST"]),
        Route("/v1/token/check", handler(check_token), methods=["POST"]),
        Route("/v1/split", handler(split), methods=["POST"]),
        Route("/v1/merge", handler(merge), methods=["POST"]),
        Route("/v1/injectors/expect", handler(expect), methods=["POST"]),
        Route("/v1/injectors/report", handler(report_injector), methods=["POST"]),
        Route("/v1/watermarks", handler(watermarks)),
        Route("/v1/watermark", handler(watermark)),
        Route("/v1/status", handler(status)),
        Route("/v1/intervals", handler(intervals)),
        Route("/v1/history", handler(get_history)),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections (else Nagle + delayed
    # ACK add 40 ms to every response on a kept-alive connection)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        msg = f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port (0 for any free one)"
        raise SystemExit(msg) from None
    sock.set_inheritable(True)
    return sock


def serve(
    *,
    host: str,
    port: int,
    data_dir: str,
    sync: bool = False,
    ready_file: str | None = None,
    sample_interval: float = 1.0,
    history_seconds: float = 600.0,
    log_level: str = "warning",
) -> int:
    """Run the service until SIGINT/SIGTERM; returns the exit code."""
    import uvicorn

    from watermark_authority._journal import RocksJournal

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    journal_dir = os.path.join(data_dir, "journal")
    try:
        journal = RocksJournal(journal_dir, sync=sync)
    except Exception as exc:
        print(
            f"watermark authority: cannot open the journal at {journal_dir} ({exc}); "
            "is another authority using this --data-dir?",
            file=sys.stderr,
        )
        return 2
    authority = Authority(journal)
    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    url = f"http://{url_host}:{bound_port}"
    if bound_host not in ("127.0.0.1", "::1", "localhost"):
        print(f"watermark authority: listening on {bound_host}, not loopback: it has no authentication", file=sys.stderr)

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                known = authority.watermarks()
                print(f"watermark authority listening on {url} (journal {journal_dir}; {len(known)} names: {summarize(known)[:200]})", flush=True)
                if ready_file:
                    tmp = f"{ready_file}.tmp"
                    with open(tmp, "w", encoding="utf-8") as f:
                        f.write(url)
                    os.replace(tmp, ready_file)

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            # SIGTERM/SIGINT mean "shut down cleanly and exit 0": uvicorn would re-raise them
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    app = create_app(authority, history=History(history_seconds, sample_interval))
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on", timeout_graceful_shutdown=3)
    server = _Server(config)
    server.run(sockets=[sock])
    print("watermark authority stopped", flush=True)
    return 0
