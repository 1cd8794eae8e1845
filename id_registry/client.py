"""Clients of the IdRegistry: one interface, :class:`RegistryClient`, three ways to get one.

* :class:`InProcessRegistryClient` — a :class:`~id_registry.Registry` and its registry
  thread in this process (tests, embedded use); concurrent callers are batched exactly as
  in the service;
* :class:`HttpRegistryClient` — the service over HTTP/JSON: the secret on every request,
  timeouts, retries, and ``Retry-After`` honoured when the service throttles;
* :func:`embedded_registry` — starts the real service as a subprocess on a free loopback
  port with a generated secret, and stops it afterwards; :func:`open_registry` picks a
  URL when one is given (``url=`` or ``$MILLWHEEL_REGISTRY_URL``) and an embedded
  service otherwise.

A joiner's life (Photon §3.3), in the interface's words::

    >>> from id_registry import InProcessRegistryClient, Status
    >>> with InProcessRegistryClient() as reg:
    ...     [r.status for r in reg.commit_many([("click-1", "joiner-a/b7", 1_000), ("click-2", "joiner-a/b7", 1_000)])]
    ...     reg.commit_many([("click-1", "joiner-a/b7", 1_000)])[0].committed      # a retry: same token
    ...     reg.commit_many([("click-1", "joiner-b/b3", 1_000)])[0]                # joined elsewhere
    [Status.COMMITTED, Status.COMMITTED]
    True
    CommitResult(status=Status.CONFLICT, holder='joiner-a/b7')

Every call is safe to repeat: a commit with the same token is ``COMMITTED`` again, a lookup
reads, a clear of what is gone says ``NOT_FOUND``, a GC boundary or shard configuration
already in force is a no-op. So the HTTP client retries everything that fails on the
way (connection errors, timeouts, 5xx); a 4xx is never retried.

A call of any size is accepted: ``commit_many``, ``lookup_many`` and ``clear_many`` are sent
as consecutive requests of at most :data:`~id_registry._model.MAX_ITEMS_PER_CALL` items (the
bound the service enforces) and, over HTTP, of a JSON body under the service's
``--max-body-bytes``; the answers come back in the order of the items (``_requests.py``). A
backlog therefore never becomes a request the service refuses on every replay. The service's
name and environment, the secret a client sends and the dashboard link are in ``_service.py``.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from id_registry._core import GcResult, Registry, Stats
from id_registry._errors import (
    ERRORS,
    BackendUnavailableError,
    InvalidRequestError,
    RegistryUnavailableError,
    ThrottledError,
)
from id_registry._model import (
    EVENT_ID,
    MAX_ITEMS_PER_CALL,
    TOKEN,
    ClearResult,
    CommitResult,
    Item,
    LookupResult,
    ShardConfig,
    Status,
)
from id_registry._requests import (
    BODY_JSON_OVERHEAD,
    ITEM_JSON_OVERHEAD,
    in_spans,
    json_lengths,
    plain_size,
    spans,
    split_clear,
)
from id_registry._service import SERVICE, Outage, client_secret, dashboard_link
from id_registry._worker import RegistryWorker
from servicekit import Secret, service
from servicekit import client as _client
from servicekit.client import backoff_delay
from servicekit.service import DEFAULT_MAX_BODY_BYTES, ServiceProcess

__all__ = [
    "SERVICE",
    "EmbeddedRegistry",
    "HttpRegistryClient",
    "InProcessRegistryClient",
    "Outage",
    "RegistryClient",
    "client_secret",
    "dashboard_link",
    "embedded_registry",
    "open_registry",
    "start_registry",
]

T = TypeVar("T")

_COMMIT_ANSWERS = {
    "committed": CommitResult(Status.COMMITTED),
    "too_old": CommitResult(Status.TOO_OLD),
}


class RegistryClient(abc.ABC):
    """What a joiner, a dispatcher and the verifier need from the IdRegistry (Photon §2, §3)."""

    @abc.abstractmethod
    def commit_many(self, items: Iterable[Item]) -> list[CommitResult]:
        """Conditionally commit each ``(event_id, token, event_time_ms)``: ``COMMITTED`` (first,
        or again with the same token), ``CONFLICT`` (another token holds it: ``holder``), or
        ``TOO_OLD`` (before the GC boundary). Send a whole micro-batch in one call: a call larger
        than the service takes in one request is sent in several, answered in order."""

    def commit(self, event_id: str, token: str, event_time_ms: int) -> CommitResult:
        return self.commit_many([(event_id, token, event_time_ms)])[0]

    @abc.abstractmethod
    def lookup_many(self, ids: Sequence[str]) -> list[LookupResult]:
        """``FOUND`` (token, event time), ``NOT_FOUND`` or ``TOO_OLD`` for each id."""

    @abc.abstractmethod
    def clear_many(
        self,
        ids: Sequence[str],
        *,
        only_if_token: str | Sequence[str | None] | None = None,
        keep_id: bool = False,
    ) -> list[ClearResult]:
        """Recovery (§3.3.3): delete the entries (``keep_id=False``: the events may be joined again)
        or drop their tokens (``keep_id=True``), only where ``only_if_token`` holds them if given."""

    @abc.abstractmethod
    def advance_gc(self, boundary_ms: int) -> GcResult:
        """Move the GC boundary forward and delete older entries; :class:`GcBackwardsError` if it would go back."""

    @abc.abstractmethod
    def reshard(self, effective_from_ms: int, shard_count: int) -> list[ShardConfig]:
        """Add a shard configuration effective from a future event time; returns them all."""

    @abc.abstractmethod
    def status(self) -> dict[str, Any]:
        """The registry's figures (no ids, no tokens)."""

    @abc.abstractmethod
    def stats(self, seconds: int = 300) -> dict[str, Any]:
        """Its counters and the last ``seconds`` (1 to 600) of them second by second: commits,
        conflicts, too-old answers, requests and the durable writes' sizes (``GET /v1/stats``)."""

    def shard_configs(self) -> list[ShardConfig]:
        return [ShardConfig(a, b) for a, b in self.status()["shards"]]

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessRegistryClient(RegistryClient):
    """A registry and its registry thread in this process; thread-safe, batched like the service.

    ``registry`` defaults to a new one in memory; ``worker_options`` go to
    :class:`~id_registry._worker.RegistryWorker` (in-flight limits, group size).
    :meth:`close` stops the thread and closes a registry this client created.
    """

    def __init__(self, registry: Registry | None = None, **worker_options: Any) -> None:
        self._owned = registry is None
        self.registry = registry if registry is not None else Registry()
        self.worker = RegistryWorker(self.registry, **worker_options)

    def commit_many(self, items: Iterable[Item]) -> list[CommitResult]:
        listed = list(items)
        return in_spans(
            lambda a, b: self.worker.commit(listed[a:b]).result(),
            spans(len(listed), MAX_ITEMS_PER_CALL),
        )

    def lookup_many(self, ids: Sequence[str]) -> list[LookupResult]:
        listed = list(ids)
        return in_spans(
            lambda a, b: self.worker.call(lambda: self.registry.lookup_many(listed[a:b])).result(),
            spans(len(listed), MAX_ITEMS_PER_CALL),
        )

    def clear_many(
        self,
        ids: Sequence[str],
        *,
        only_if_token: str | Sequence[str | None] | None = None,
        keep_id: bool = False,
    ) -> list[ClearResult]:
        def clear(part: list[str], tokens: str | list[str | None] | None) -> list[ClearResult]:
            return self.worker.call(
                lambda: self.registry.clear_many(part, only_if_token=tokens, keep_id=keep_id)
            ).result()

        return split_clear(
            ids, only_if_token, clear, lambda unique, tokens: spans(len(unique), MAX_ITEMS_PER_CALL)
        )

    def advance_gc(self, boundary_ms: int) -> GcResult:
        return self.worker.advance_gc(boundary_ms).result()

    def reshard(self, effective_from_ms: int, shard_count: int) -> list[ShardConfig]:
        return self.worker.call(
            lambda: self.registry.reshard(effective_from_ms, shard_count)
        ).result()

    def status(self) -> dict[str, Any]:
        return self.worker.status()

    def stats(self, seconds: int = 300) -> dict[str, Any]:
        if not 1 <= seconds <= Stats.HISTORY_SECONDS:
            msg = f"seconds must be in [1, {Stats.HISTORY_SECONDS}], got {seconds}"
            raise InvalidRequestError(msg)
        return self.worker.stats(seconds)

    def close(self) -> None:
        self.worker.close()
        if self._owned:
            self.registry.close()


class HttpRegistryClient(_client.JsonHttpClient, RegistryClient):
    """The registry service over HTTP/JSON (see ``docs/registry.md`` for the routes), on
    :class:`servicekit.client.JsonHttpClient`.

    * ``secret`` — the service's bearer secret (see :func:`client_secret`); every route but
      the status needs it, so without one every call raises :class:`AuthenticationError`;
    * ``timeout`` — seconds for each attempt; ``retries`` — extra attempts after a connection
      failure, a timeout or a 5xx, with jittered exponential backoff from ``backoff`` seconds
      (capped at 2 s): every call is safe to repeat (see the module docstring);
    * ``throttle_timeout`` — how long to keep retrying a request the service throttles (429),
      waiting what its ``Retry-After`` says (growing, jittered) between attempts; then
      :class:`ThrottledError`;
    * ``transport`` — an ``httpx`` transport, e.g. ``httpx.MockTransport`` in tests;
    * ``max_body_bytes`` — the service's ``--max-body-bytes`` (its default unless it was
      lowered): ``commit_many``, ``lookup_many`` and ``clear_many`` are sent in requests of at
      most :data:`~id_registry._model.MAX_ITEMS_PER_CALL` items and a body under this size,
      one after another, the answers joined in order.

    * ``patience`` — seconds to keep waiting, beyond those retries, while the service is
      unreachable, answers 5xx, its store is unavailable or it throttles (a restart, a
      failover, an overload): calls are sent again with capped exponential backoff (from
      ``backoff``, doubling, at most ``max_backoff`` seconds, jittered) until it answers or
      ``patience`` has passed since the first failure; ``0`` (the default) waits no longer
      than the retries. Every call is safe to repeat, a commit with its token included.
      ``on_wait`` is told (an :class:`Outage`) on each failed attempt, and ``None`` once the
      service answers again: what a pipeline's live status shows.

    After the retries (and the patience), :class:`RegistryUnavailableError`. Thread-safe (one
    connection pool).
    """

    info = SERVICE
    errors = ERRORS

    def __init__(
        self,
        url: str,
        *,
        secret: str | Secret | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.05,
        throttle_timeout: float = 60.0,
        transport: Any = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        patience: float = 0.0,
        max_backoff: float = 10.0,
        on_wait: Callable[[Outage | None], None] | None = None,
    ) -> None:
        super().__init__(
            url,
            secret=secret,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            throttle_timeout=throttle_timeout,
            transport=transport,
        )
        if max_body_bytes < 2 * BODY_JSON_OVERHEAD:
            msg = f"max_body_bytes must be at least {2 * BODY_JSON_OVERHEAD}, got {max_body_bytes}"
            raise InvalidRequestError(msg)
        if not (patience >= 0 and max_backoff > 0):
            msg = f"HttpRegistryClient: need patience >= 0 and max_backoff > 0 (seconds), got patience={patience}, max_backoff={max_backoff}"
            raise InvalidRequestError(msg)
        self.max_body_bytes = max_body_bytes
        self.patience = patience
        self.max_backoff = max_backoff
        self.on_wait = on_wait

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, str] | None = None,
        idempotent: bool = True,
    ) -> Any:
        """servicekit's call (its retries), sent again while the service is out, for ``patience`` seconds."""
        if self.patience <= 0:
            return super()._call(method, path, body, params=params, idempotent=idempotent)
        outage: Outage | None = None
        while True:
            try:
                answer = super()._call(method, path, body, params=params, idempotent=idempotent)
            except (RegistryUnavailableError, BackendUnavailableError, ThrottledError) as exc:
                last = (
                    str(exc).strip().splitlines()[0][:300]
                    if str(exc).strip()
                    else type(exc).__name__
                )
                if outage is None:
                    outage = Outage(self.url, int(time.time() * 1000), time.monotonic(), 0, last)
                outage = dataclasses.replace(outage, attempts=outage.attempts + 1, last_error=last)
                waited = time.monotonic() - outage.started
                if waited >= self.patience:
                    msg = (
                        f"{method} {path}: {SERVICE.the} at {self.url} was unreachable for {self.patience:g}s "
                        f"({outage.attempts} attempts since {outage.since_text()}; last: {last}). Start it again "
                        f"(`{SERVICE.serve_command}` on the same store), or give the caller more patience; "
                        "what was sent is safe to send again with the same tokens"
                    )
                    raise RegistryUnavailableError(msg) from exc
                if self.on_wait is not None:
                    self.on_wait(outage)
                delay = backoff_delay(self.backoff, outage.attempts, self.max_backoff, self._random)
                time.sleep(min(delay, max(0.0, self.patience - waited)))
                continue
            if outage is not None and self.on_wait is not None:
                self.on_wait(None)
            return answer

    def _spans(self, *columns: Sequence[str]) -> list[tuple[int, int]]:
        """The requests a call's items go in: ``columns`` are their strings (ids, tokens)."""

        count, budget = len(columns[0]), self.max_body_bytes - BODY_JSON_OVERHEAD
        if count <= MAX_ITEMS_PER_CALL:  # the usual call: one request, its size measured at C speed
            sizes = [plain_size(c) for c in columns]
            if None not in sizes and sum(sizes) + count * ITEM_JSON_OVERHEAD <= budget:  # type: ignore[arg-type]
                return [(0, count)] if count else []

        def costs() -> list[int]:
            return [
                sum(c) + ITEM_JSON_OVERHEAD for c in zip(*map(json_lengths, columns), strict=True)
            ]

        return spans(count, MAX_ITEMS_PER_CALL, costs, budget)

    def commit_many(self, items: Iterable[Item]) -> list[CommitResult]:
        listed = items if isinstance(items, list) else list(items)
        try:
            ranges = self._spans(list(map(EVENT_ID, listed)), list(map(TOKEN, listed)))
        except (
            TypeError,
            IndexError,
            KeyError,
        ):  # not ids and tokens: one request, which the service refuses naming the bad item
            ranges = [(0, len(listed))]
        return in_spans(
            lambda a, b: self._commit(listed if (a, b) == (0, len(listed)) else listed[a:b]), ranges
        )

    def _commit(self, items: list[Item]) -> list[CommitResult]:
        answers = _COMMIT_ANSWERS
        out = []
        for status, holder in self._call("POST", "/v1/commit", {"items": items})["results"]:
            known = answers.get(status) if holder is None else None
            out.append(known if known is not None else CommitResult(Status(status), holder))
        return out

    def lookup_many(self, ids: Sequence[str]) -> list[LookupResult]:
        listed = list(ids)

        def lookup(a: int, b: int) -> list[LookupResult]:
            results = self._call("POST", "/v1/lookup", {"ids": listed[a:b]})["results"]
            return [LookupResult(Status(s), token, t) for s, token, t in results]

        try:
            ranges = self._spans(listed)
        except TypeError:
            ranges = [(0, len(listed))]
        return in_spans(lookup, ranges)

    def clear_many(
        self,
        ids: Sequence[str],
        *,
        only_if_token: str | Sequence[str | None] | None = None,
        keep_id: bool = False,
    ) -> list[ClearResult]:
        def clear(part: list[str], tokens: str | list[str | None] | None) -> list[ClearResult]:
            body = {"ids": part, "only_if_token": tokens, "keep_id": keep_id}
            return [
                ClearResult(Status(s), holder)
                for s, holder in self._call("POST", "/v1/clear", body)["results"]
            ]

        def ranges(unique: list[str], tokens: list[str | None] | None) -> list[tuple[int, int]]:
            try:
                return (
                    self._spans(unique)
                    if tokens is None
                    else self._spans(unique, [t or "" for t in tokens])
                )
            except TypeError:
                return [(0, len(unique))]

        return split_clear(ids, only_if_token, clear, ranges)

    def advance_gc(self, boundary_ms: int) -> GcResult:
        out = self._call("POST", "/v1/gc", {"boundary_ms": boundary_ms})
        return GcResult(int(out["boundary_ms"]), int(out["deleted"]))

    def reshard(self, effective_from_ms: int, shard_count: int) -> list[ShardConfig]:
        out = self._call(
            "POST",
            "/v1/shards",
            {"effective_from_ms": effective_from_ms, "shard_count": shard_count},
        )
        return [ShardConfig(int(a), int(b)) for a, b in out["shards"]]

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")

    def stats(self, seconds: int = 300) -> dict[str, Any]:
        return self._call("GET", "/v1/stats", params={"seconds": str(seconds)})


# ---------------------------------------------------------------------------- embedded service


class EmbeddedRegistry(ServiceProcess):
    """A registry service started by this process (see :func:`start_registry`): ``.url``,
    ``.secret``, ``.pid``, ``.kill()`` (kill -9), ``.stop()``, ``.log()``."""

    def client(self, **options: Any) -> HttpRegistryClient:
        """A new HTTP client of this service holding its secret (closed when the service stops)."""
        return self._client(HttpRegistryClient, **options)


def start_registry(
    data_dir: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = 30.0,
    extra_args: Sequence[str] = (),
) -> EmbeddedRegistry:
    """Start ``python -m id_registry serve`` on ``data_dir`` and wait until it is healthy.

    ``port=0`` lets the service pick a free port. Its secret is ``DATA_DIR/secret``,
    generated (mode 0600) on the first start and reused after; the handle holds it and
    gives it to its clients. ``extra_args`` go to ``serve`` (e.g. ``["--backend", "etcd",
    "--etcd-endpoint", URL]``). The caller stops it; prefer :func:`embedded_registry`.
    """
    return EmbeddedRegistry.start(
        SERVICE,
        data_dir,
        host=host,
        port=port,
        startup_timeout=startup_timeout,
        extra_args=extra_args,
        unavailable=RegistryUnavailableError,
    )


def embedded_registry(
    data_dir: str | None = None, **options: Any
) -> AbstractContextManager[EmbeddedRegistry]:
    """Run the real registry service for a ``with`` block on a free loopback port.

    ``data_dir=None`` keeps its store in a temporary directory removed afterwards.
    Options go to :func:`start_registry`. Yields an :class:`EmbeddedRegistry`
    (``.url``, ``.secret``, ``.client()``).
    """
    return service.running(
        lambda path: start_registry(path, **options), data_dir, temp_prefix="millwheel-registry-"
    )


def open_registry(
    url: str | None = None,
    *,
    data_dir: str | None = None,
    secret: str | Secret | None = None,
    **client_options: Any,
) -> AbstractContextManager[RegistryClient]:
    """A client of the service at ``url`` (or ``$MILLWHEEL_REGISTRY_URL``), else of an embedded
    service started for the ``with`` block (its secret generated and handed to the client).

    With a URL, the secret is ``secret``, else ``$MILLWHEEL_REGISTRY_SECRET``, else the file
    named by ``$MILLWHEEL_REGISTRY_SECRET_FILE``, else ``DATA_DIR/secret``.
    """
    return _client.open_client(
        HttpRegistryClient,
        url,
        embed=embedded_registry,
        data_dir=data_dir,
        secret=secret,
        **client_options,
    )
