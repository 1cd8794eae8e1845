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
``--max-body-bytes``; the answers come back in the order of the items. A backlog therefore
never becomes a request the service refuses on every replay.
"""

from __future__ import annotations

import abc
import bisect
import dataclasses
import itertools
import json
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from id_registry._core import GcResult, Registry, Stats
from id_registry._errors import (
    ERRORS,
    AuthenticationError,
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
from id_registry._worker import RegistryWorker
from servicekit import Secret, service
from servicekit import client as _client
from servicekit.client import backoff_delay
from servicekit.service import DEFAULT_MAX_BODY_BYTES, ServiceInfo, ServiceProcess

T = TypeVar("T")
R = TypeVar("R")

#: the registry as servicekit sees it: its name, module and command, and the environment variables
#: naming a running one (cluster runs), holding its bearer secret, and naming a file that holds it
SERVICE = ServiceInfo(
    "id registry",
    "id_registry",
    "millwheel registry",
    url_env="MILLWHEEL_REGISTRY_URL",
    secret_env="MILLWHEEL_REGISTRY_SECRET",
    secret_file_env="MILLWHEEL_REGISTRY_SECRET_FILE",
)
#: the same as constants; ``SECRET_FILE_NAME``: the file in a data directory where a generated secret is kept
URL_ENV, SECRET_ENV, SECRET_FILE_ENV, SECRET_FILE_NAME = (
    SERVICE.url_env,
    SERVICE.secret_env,
    SERVICE.secret_file_env,
    SERVICE.secret_file_name,
)

_COMMIT_ANSWERS = {
    "committed": CommitResult(Status.COMMITTED),
    "too_old": CommitResult(Status.TOO_OLD),
}
#: JSON around one item beyond its strings: brackets, quotes, commas, a 20-character time or null
_ITEM_JSON_OVERHEAD = 40
#: JSON around the items of a request (the other fields, the braces)
_BODY_JSON_OVERHEAD = 4096
#: the ASCII characters JSON writes as they are
_UNESCAPED = bytes(c for c in range(0x20, 0x80) if c not in b'"\\')


def plain_size(texts: Sequence[str]) -> int | None:
    """The JSON size of ``texts`` (each string, quoted) if none needs escaping, as the usual ids and
    tokens do (measured at C speed); else ``None``.

    >>> plain_size(["click-1", "dc1/b7"]), plain_size(['a"b']), plain_size(["\u00e9"])
    (17, None, None)
    """
    joined = "".join(texts)
    if joined.isascii() and not joined.encode("ascii").translate(None, _UNESCAPED):
        return len(joined) + 2 * len(texts)
    return None


def json_lengths(texts: Sequence[str]) -> list[int]:
    """The length of each string as this client's JSON encodes it (``ensure_ascii``).

    >>> json_lengths(["click-1", 'a"b', "\u00e9"])
    [9, 6, 8]
    """
    if plain_size(texts) is not None:
        return [n + 2 for n in map(len, texts)]
    return [len(json.dumps(t)) for t in texts]


def spans(
    count: int,
    max_items: int,
    costs: Callable[[], list[int]] | None = None,
    budget: int | None = None,
) -> list[tuple[int, int]]:
    """``[start, end)`` ranges cutting ``count`` items into consecutive runs of at most ``max_items``
    items and, when ``costs`` (each item's bytes, computed only if needed) and ``budget`` are given,
    at most ``budget`` bytes (an item larger than the budget alone goes alone).

    >>> spans(5, 2)
    [(0, 2), (2, 4), (4, 5)]
    >>> spans(4, 10, lambda: [3, 3, 3, 3], budget=7)
    [(0, 2), (2, 4)]
    """
    if count == 0:
        return []
    if costs is None or budget is None:
        return [(i, min(i + max_items, count)) for i in range(0, count, max_items)]
    cumulative = list(itertools.accumulate(costs()))
    if count <= max_items and cumulative[-1] <= budget:
        return [(0, count)]
    out, start = [], 0
    while start < count:
        before = cumulative[start - 1] if start else 0
        end = min(start + max_items, bisect.bisect_right(cumulative, before + budget, lo=start))
        end = max(end, start + 1)
        out.append((start, end))
        start = end
    return out


def in_spans(call: Callable[[int, int], list[R]], ranges: list[tuple[int, int]]) -> list[R]:
    """``call(start, end)`` for each range in turn, the answers joined in order."""
    if len(ranges) == 1:
        return call(*ranges[0])
    return [answer for start, end in ranges for answer in call(start, end)]


def split_clear(
    ids: Sequence[str],
    only_if_token: str | Sequence[str | None] | None,
    clear: Callable[[list[str], str | list[str | None] | None], list[ClearResult]],
    ranges: Callable[[list[str], list[str | None] | None], list[tuple[int, int]]],
) -> list[ClearResult]:
    """``clear_many`` cut into requests: the ids once each (the first of a repeated id decides, as
    in one call), each request ``clear(ids, tokens)``, the answers given back to every repeat."""
    ids = list(ids)
    per_id = list(only_if_token) if isinstance(only_if_token, (list, tuple)) else None
    if (per_id is None and only_if_token is not None and not isinstance(only_if_token, str)) or (
        per_id is not None and len(per_id) != len(ids)
    ):
        return clear(ids, only_if_token)  # type: ignore[arg-type]  # refused by the registry, with its message
    first: dict[str, int] = {}
    for i, event_id in enumerate(ids):
        first.setdefault(event_id, i)
    unique = list(first) if len(first) < len(ids) else ids
    tokens = (
        None
        if per_id is None
        else (per_id if unique is ids else [per_id[i] for i in first.values()])
    )
    cuts = ranges(unique, tokens)
    if len(cuts) == 1 and unique is ids:
        return clear(ids, only_if_token if per_id is None else per_id)

    def part(start: int, end: int) -> list[ClearResult]:
        return clear(unique[start:end], only_if_token if tokens is None else tokens[start:end])  # type: ignore[arg-type]

    answers = dict(zip(unique, in_spans(part, cuts), strict=True))
    return [answers[event_id] for event_id in ids]


@dataclass(frozen=True)
class Outage:
    """A client waiting for the service (``HttpRegistryClient(patience=...)``): since when, how often it tried, the last error."""

    url: str
    #: wall time of the first failure (ms since the epoch)
    since_ms: int
    #: the same on this process's monotonic clock (seconds)
    started: float
    attempts: int
    last_error: str

    def since_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since_ms / 1000))

    def text(self) -> str:
        """``waiting on the id registry at URL since ... (N attempts; last: ...)``."""
        return f"waiting on {SERVICE.the} at {self.url} since {self.since_text()} ({self.attempts} attempts; last: {self.last_error})"


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


def client_secret(
    secret: str | Secret | None = None, *, data_dir: str | None = None
) -> Secret | None:
    """``secret``, else ``$MILLWHEEL_REGISTRY_SECRET``, else the file named by
    ``$MILLWHEEL_REGISTRY_SECRET_FILE``, else ``DATA_DIR/secret`` if it exists, else ``None``."""
    return _client.client_secret(secret, SERVICE, data_dir=data_dir, error=AuthenticationError)


def dashboard_link(
    authority_url: str,
    registry_url: str,
    secret: str | Secret | None = None,
    *,
    data_dir: str | None = None,
) -> str:
    """The address of the watermark authority's dashboard with the panel of the registry at
    ``registry_url``: ``AUTHORITY/#registry=URL&registry_key=KEY``, where KEY is the read key of
    the registry's secret (found as :func:`client_secret` finds it): it reads ``/v1/stats`` and
    nothing else. :class:`AuthenticationError` if there is no secret.

    >>> dashboard_link("http://127.0.0.1:7300", "http://127.0.0.1:7310", "registry-secret-for-a-doctest")
    'http://127.0.0.1:7300/#registry=http://127.0.0.1:7310&registry_key=...'
    """
    found = client_secret(secret, data_dir=data_dir)
    if found is None:
        msg = f"the registry panel needs the read key of {SERVICE.the}'s secret; {SERVICE.secret_hint()}"
        raise AuthenticationError(msg)
    return _client.fragment_url(
        authority_url.rstrip("/") + "/",
        registry=registry_url.rstrip("/"),
        registry_key=found.read_key().reveal(),
    )


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
        if max_body_bytes < 2 * _BODY_JSON_OVERHEAD:
            msg = f"max_body_bytes must be at least {2 * _BODY_JSON_OVERHEAD}, got {max_body_bytes}"
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

        count, budget = len(columns[0]), self.max_body_bytes - _BODY_JSON_OVERHEAD
        if count <= MAX_ITEMS_PER_CALL:  # the usual call: one request, its size measured at C speed
            sizes = [plain_size(c) for c in columns]
            if None not in sizes and sum(sizes) + count * _ITEM_JSON_OVERHEAD <= budget:  # type: ignore[arg-type]
                return [(0, count)] if count else []

        def costs() -> list[int]:
            return [
                sum(c) + _ITEM_JSON_OVERHEAD for c in zip(*map(json_lengths, columns), strict=True)
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
