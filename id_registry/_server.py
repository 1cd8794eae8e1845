"""The IdRegistry's HTTP/JSON service (Starlette on uvicorn), locked down by servicekit.

Before a request reaches a route, :class:`servicekit.http.GuardMiddleware` checks its
``Host`` (421), its ``Origin`` and ``Sec-Fetch-Site`` (403), the bearer secret on every
``POST`` (401: every route but ``/v1/status``, ``/v1/stats`` and ``/healthz`` is a POST,
lookups included, since they reveal joiners' tokens) and the body size (413). ``GET
/v1/stats``, the second-by-second figures the authority's dashboard plots, is a *keyed read*:
it needs the secret or its read key, and pages of loopback origins (and ``--allow-origin``
ones) may read it (CORS). See ``docs/registry.md``.

Work is shared as in Photon's Fig. 3: the event loop reads request bodies; a small pool of
threads decodes and checks them (JSON, ids, tokens, times) and encodes the answers; the
registry thread (:class:`~id_registry._worker.RegistryWorker`) coalesces waiting commits
into one durable write and answers each request once it is durable. A request beyond the
in-flight limits is answered **429** with ``Retry-After`` (seconds) and ``retry_after_ms``
at once, before its body is decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from id_registry._core import Registry, Stats
from id_registry._errors import InvalidRequestError, ThrottledError
from id_registry._model import (
    COMMITTED,
    ClearResult,
    CommitResult,
    LookupResult,
    check_items,
    check_time,
)
from id_registry._worker import RegistryWorker
from id_registry.client import SERVICE
from servicekit import Secret, check_fields, parse_json, parse_number, service
from servicekit.http import (
    Guard,
    GuardMiddleware,
    error_response,
    json_endpoint,
)
from servicekit.service import ServeFlags

#: the registry's documents nest at most 3 levels ({"items": [[...]]}); allow some slack
MAX_JSON_DEPTH = 6
SECRET_HINT = SERVICE.secret_hint("the registry") + "; GET /v1/stats also takes its read key"
#: reads that take the secret or its read key, from pages of loopback origins too (the dashboard's registry panel)
KEYED_READS = frozenset({"/v1/stats"})
#: the window ``/v1/stats`` answers when the query does not say
DEFAULT_STATS_SECONDS = 300

log = logging.getLogger("id_registry")


def registry_guard(secret: Secret, **flags: Any) -> Guard:
    """The :class:`~servicekit.http.Guard` of a registry; ``flags``: ``bind_host``,
    ``allow_hosts``, ``allow_origins``, ``max_body_bytes`` (see :meth:`Guard.for_bind <servicekit.http.Guard.for_bind>`)."""
    return Guard.for_bind(
        secret,
        keyed_reads=KEYED_READS,
        secret_hint=SECRET_HINT,
        host_hint="start the registry with --allow-host NAME",
        service=SERVICE.the,
        **flags,
    )


def _body(raw: bytes, path: str, fields: dict[str, bool]) -> dict[str, Any]:
    value = parse_json(raw, max_depth=MAX_JSON_DEPTH, error=InvalidRequestError)
    return check_fields(value, fields, where=path, error=InvalidRequestError)


def _json(data: Any) -> Response:
    """``data`` as JSON; a ``str`` is JSON already."""
    return Response(
        data if isinstance(data, str) else json.dumps(data, separators=(",", ":")),
        media_type="application/json",
    )


_COMMITTED_JSON = json.dumps([COMMITTED.status.value, None], separators=(",", ":"))


def encode_commit(results: Sequence[CommitResult]) -> str:
    """``{"results": [[status, holder], ...]}``, the common answer pasted in as is."""
    parts = [
        _COMMITTED_JSON if r is COMMITTED else json.dumps([r.status.value, r.holder])
        for r in results
    ]
    return '{"results":[' + ",".join(parts) + "]}"


def encode_lookup(results: Sequence[LookupResult]) -> list[list[Any]]:
    return [[r.status.value, r.token, r.event_time_ms] for r in results]


def encode_clear(results: Sequence[ClearResult]) -> list[list[Any]]:
    return [[r.status.value, r.holder] for r in results]


def throttled_response(exc: ThrottledError, *, close: bool = False) -> Response:
    """429 with ``Retry-After`` in whole seconds (the header's unit) and ``retry_after_ms`` in the body;
    ``close``: the body was not read, so the connection is closed (servicekit's rule)."""
    response = error_response(exc, close=close)
    response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_ms / 1000)))
    return response


def create_app(worker: RegistryWorker, *, guard: Guard, parsers: int = 2) -> Starlette:
    """The Starlette application serving ``worker``'s registry behind ``guard``."""
    registry = worker.registry
    pool = ThreadPoolExecutor(max_workers=parsers, thread_name_prefix="id-registry-http")
    in_progress = [0]  # requests between arrival and answer

    async def off_loop(fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    def route(
        handler: Callable[[dict[str, Any]], Awaitable[Any]],
        fields: dict[str, bool],
        prepare: Callable[[dict[str, Any]], dict[str, Any]] = lambda body: body,
    ) -> Callable[[Request], Awaitable[Response]]:
        """A POST route: admitted if not too busy; the body decoded and ``prepare``-d (checked) in one
        trip off the loop; the answer encoded off the loop."""

        async def endpoint(request: Request) -> Any:
            if (
                in_progress[0] >= worker.max_inflight_requests
            ):  # refused before a byte of the body is read
                registry.stats.throttled += 1
                msg = f"the registry is busy ({in_progress[0]} requests in progress): nothing was done; retry shortly"
                return throttled_response(ThrottledError(msg, 50), close=True)
            in_progress[0] += 1
            try:
                raw = await request.body()
                path = request.url.path
                body = await off_loop(lambda: prepare(_body(raw, path, fields)))
                data = await handler(body)
            except ThrottledError as exc:
                return throttled_response(exc)
            finally:
                in_progress[0] -= 1
            if isinstance(data, str):  # encoded already
                return _json(data)
            return await off_loop(lambda: _json(data))

        return json_endpoint(endpoint, logger=log)

    def check_commit(body: dict[str, Any]) -> dict[str, Any]:
        return {"items": check_items(body["items"])}

    async def commit(body: dict[str, Any]) -> Any:
        results = await asyncio.wrap_future(worker.submit_commit(body["items"]))
        return encode_commit(
            results
        )  # mostly the COMMITTED answer pasted in: cheaper than a trip off the loop

    async def lookup(body: dict[str, Any]) -> Any:
        results = await asyncio.wrap_future(worker.call(lambda: registry.lookup_many(body["ids"])))
        return {"results": encode_lookup(results)}

    async def clear(body: dict[str, Any]) -> Any:
        def run() -> list[ClearResult]:
            return registry.clear_many(
                body["ids"],
                only_if_token=body.get("only_if_token"),
                keep_id=body.get("keep_id", False),
            )

        return {"results": encode_clear(await asyncio.wrap_future(worker.call(run)))}

    async def gc(body: dict[str, Any]) -> Any:
        result = await asyncio.wrap_future(
            worker.advance_gc(check_time("boundary_ms", body["boundary_ms"]))
        )
        return {"boundary_ms": result.boundary_ms, "deleted": result.deleted}

    async def shards(body: dict[str, Any]) -> Any:
        configs = await asyncio.wrap_future(
            worker.call(lambda: registry.reshard(body["effective_from_ms"], body["shard_count"]))
        )
        return {"shards": [[c.effective_from_ms, c.shard_count] for c in configs]}

    async def status(request: Request) -> Any:
        return await off_loop(worker.status)

    async def stats(request: Request) -> Any:
        text = request.query_params.get("seconds", str(DEFAULT_STATS_SECONDS))
        seconds = parse_number(
            "query parameter 'seconds'",
            text,
            lo=1,
            hi=Stats.HISTORY_SECONDS,
            error=InvalidRequestError,
        )
        return worker.stats(int(seconds))

    async def health(request: Request) -> Any:
        return {"ok": True}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            worker.close()
            pool.shutdown(wait=True)
            registry.close()

    routes = [
        Route("/healthz", json_endpoint(health, logger=log)),
        Route("/v1/status", json_endpoint(status, logger=log)),
        Route("/v1/stats", json_endpoint(stats, logger=log)),
        Route("/v1/commit", route(commit, {"items": True}, check_commit), methods=["POST"]),
        Route("/v1/lookup", route(lookup, {"ids": True}), methods=["POST"]),
        Route(
            "/v1/clear",
            route(clear, {"ids": True, "only_if_token": False, "keep_id": False}),
            methods=["POST"],
        ),
        Route("/v1/gc", route(gc, {"boundary_ms": True}), methods=["POST"]),
        Route(
            "/v1/shards",
            route(shards, {"effective_from_ms": True, "shard_count": True}),
            methods=["POST"],
        ),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, middleware=[Middleware(GuardMiddleware, guard=guard)]
    )


def open_backend(
    data_dir: str,
    *,
    backend: str = "rocksdb",
    sync: bool = True,
    etcd_endpoints: Sequence[str] = (),
    etcd_prefix: str | None = None,
    etcd_max_txn_ops: int | None = None,
) -> Any:
    """The backend ``serve`` runs on: RocksDB in ``DATA_DIR/entries``, or etcd."""
    if backend == "etcd":
        from id_registry._etcd import DEFAULT_MAX_TXN_OPS, DEFAULT_PREFIX, EtcdBackend

        return EtcdBackend(
            etcd_endpoints,
            prefix=etcd_prefix or DEFAULT_PREFIX,
            max_txn_ops=etcd_max_txn_ops or DEFAULT_MAX_TXN_OPS,
        )
    from id_registry._backend import RocksBackend

    return RocksBackend(os.path.join(data_dir, "entries"), sync=sync)


def serve(
    flags: ServeFlags,
    *,
    backend_options: dict[str, Any] | None = None,
    registry_options: dict[str, Any] | None = None,
    worker_options: dict[str, Any] | None = None,
) -> int:
    """Run the service until SIGINT/SIGTERM; returns the exit code."""
    logging.basicConfig(
        level=flags.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    secret = service.server_secret(SERVICE, flags)
    if secret is None:
        return 2
    try:
        store = open_backend(flags.data_dir, **(backend_options or {}))
        registry = Registry(store, **(registry_options or {}))
    except Exception as exc:
        print(
            f"id registry: cannot open its store ({type(exc).__name__}: {exc}); is another registry using this --data-dir, or is etcd down?",
            file=sys.stderr,
        )
        return 2
    worker = RegistryWorker(registry, **(worker_options or {}))
    sock, url = service.listen(SERVICE, flags)
    sys.setswitchinterval(
        0.001
    )  # the loop thread gets the interpreter back quickly from the registry thread
    service.run_app(
        create_app(worker, guard=registry_guard(secret, **flags.guard_options(sock))),
        sock,
        banner=lambda: (
            f"id registry listening on {url} ({store.kind} store; secret from {secret.source}; shards {registry.meta.shards.to_json()})"
        ),
        **flags.run_options(),
    )
    print("id registry stopped", flush=True)
    return 0
