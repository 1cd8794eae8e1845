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
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from id_registry._core import GcResult, Registry, Stats
from id_registry._errors import (
    ERRORS,
    AuthenticationError,
    InvalidRequestError,
    RegistryUnavailableError,
)
from id_registry._model import ClearResult, CommitResult, Item, LookupResult, ShardConfig, Status
from id_registry._worker import RegistryWorker
from servicekit import Secret, service
from servicekit import client as _client
from servicekit.service import ServiceInfo, ServiceProcess

#: the registry as servicekit sees it: its name, module and command, and the environment variables
#: naming a running one (cluster runs), holding its bearer secret, and naming a file that holds it
SERVICE = ServiceInfo(
    "id registry", "id_registry", "millwheel registry",
    url_env="MILLWHEEL_REGISTRY_URL", secret_env="MILLWHEEL_REGISTRY_SECRET", secret_file_env="MILLWHEEL_REGISTRY_SECRET_FILE",
)  # fmt: skip
#: the same as constants; ``SECRET_FILE_NAME``: the file in a data directory where a generated secret is kept
URL_ENV, SECRET_ENV, SECRET_FILE_ENV, SECRET_FILE_NAME = SERVICE.url_env, SERVICE.secret_env, SERVICE.secret_file_env, SERVICE.secret_file_name

_COMMIT_ANSWERS = {"committed": CommitResult(Status.COMMITTED), "too_old": CommitResult(Status.TOO_OLD)}


class RegistryClient(abc.ABC):
    """What a joiner, a dispatcher and the verifier need from the IdRegistry (Photon §2, §3)."""

    @abc.abstractmethod
    def commit_many(self, items: Iterable[Item]) -> list[CommitResult]:
        """Conditionally commit each ``(event_id, token, event_time_ms)``: ``COMMITTED`` (first,
        or again with the same token), ``CONFLICT`` (another token holds it: ``holder``), or
        ``TOO_OLD`` (before the GC boundary). Send a whole micro-batch in one call."""

    def commit(self, event_id: str, token: str, event_time_ms: int) -> CommitResult:
        return self.commit_many([(event_id, token, event_time_ms)])[0]

    @abc.abstractmethod
    def lookup_many(self, ids: Sequence[str]) -> list[LookupResult]:
        """``FOUND`` (token, event time), ``NOT_FOUND`` or ``TOO_OLD`` for each id."""

    @abc.abstractmethod
    def clear_many(self, ids: Sequence[str], *, only_if_token: str | Sequence[str | None] | None = None, keep_id: bool = False) -> list[ClearResult]:
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
        return self.worker.commit(list(items)).result()

    def lookup_many(self, ids: Sequence[str]) -> list[LookupResult]:
        return self.worker.call(lambda: self.registry.lookup_many(ids)).result()

    def clear_many(self, ids: Sequence[str], *, only_if_token: str | Sequence[str | None] | None = None, keep_id: bool = False) -> list[ClearResult]:
        return self.worker.call(lambda: self.registry.clear_many(ids, only_if_token=only_if_token, keep_id=keep_id)).result()

    def advance_gc(self, boundary_ms: int) -> GcResult:
        return self.worker.advance_gc(boundary_ms).result()

    def reshard(self, effective_from_ms: int, shard_count: int) -> list[ShardConfig]:
        return self.worker.call(lambda: self.registry.reshard(effective_from_ms, shard_count)).result()

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


def client_secret(secret: str | Secret | None = None, *, data_dir: str | None = None) -> Secret | None:
    """``secret``, else ``$MILLWHEEL_REGISTRY_SECRET``, else the file named by
    ``$MILLWHEEL_REGISTRY_SECRET_FILE``, else ``DATA_DIR/secret`` if it exists, else ``None``."""
    return _client.client_secret(secret, SERVICE, data_dir=data_dir, error=AuthenticationError)


def dashboard_link(authority_url: str, registry_url: str, secret: str | Secret | None = None, *, data_dir: str | None = None) -> str:
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
    return _client.fragment_url(authority_url.rstrip("/") + "/", registry=registry_url.rstrip("/"), registry_key=found.read_key().reveal())


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
    * ``transport`` — an ``httpx`` transport, e.g. ``httpx.MockTransport`` in tests.

    After the retries, :class:`RegistryUnavailableError`. Thread-safe (one connection pool).
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
    ) -> None:
        super().__init__(url, secret=secret, timeout=timeout, retries=retries, backoff=backoff, throttle_timeout=throttle_timeout, transport=transport)

    def commit_many(self, items: Iterable[Item]) -> list[CommitResult]:
        body = {"items": items if isinstance(items, list) else list(items)}
        answers = _COMMIT_ANSWERS
        out = []
        for status, holder in self._call("POST", "/v1/commit", body)["results"]:
            known = answers.get(status) if holder is None else None
            out.append(known if known is not None else CommitResult(Status(status), holder))
        return out

    def lookup_many(self, ids: Sequence[str]) -> list[LookupResult]:
        results = self._call("POST", "/v1/lookup", {"ids": list(ids)})["results"]
        return [LookupResult(Status(s), token, t) for s, token, t in results]

    def clear_many(self, ids: Sequence[str], *, only_if_token: str | Sequence[str | None] | None = None, keep_id: bool = False) -> list[ClearResult]:
        tokens = only_if_token if only_if_token is None or isinstance(only_if_token, str) else list(only_if_token)
        body = {"ids": list(ids), "only_if_token": tokens, "keep_id": keep_id}
        return [ClearResult(Status(s), holder) for s, holder in self._call("POST", "/v1/clear", body)["results"]]

    def advance_gc(self, boundary_ms: int) -> GcResult:
        out = self._call("POST", "/v1/gc", {"boundary_ms": boundary_ms})
        return GcResult(int(out["boundary_ms"]), int(out["deleted"]))

    def reshard(self, effective_from_ms: int, shard_count: int) -> list[ShardConfig]:
        out = self._call("POST", "/v1/shards", {"effective_from_ms": effective_from_ms, "shard_count": shard_count})
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


def start_registry(data_dir: str, *, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 30.0, extra_args: Sequence[str] = ()) -> EmbeddedRegistry:
    """Start ``python -m id_registry serve`` on ``data_dir`` and wait until it is healthy.

    ``port=0`` lets the service pick a free port. Its secret is ``DATA_DIR/secret``,
    generated (mode 0600) on the first start and reused after; the handle holds it and
    gives it to its clients. ``extra_args`` go to ``serve`` (e.g. ``["--backend", "etcd",
    "--etcd-endpoint", URL]``). The caller stops it; prefer :func:`embedded_registry`.
    """
    return EmbeddedRegistry.start(
        SERVICE, data_dir, host=host, port=port,
        startup_timeout=startup_timeout, extra_args=extra_args, unavailable=RegistryUnavailableError,
    )  # fmt: skip


def embedded_registry(data_dir: str | None = None, **options: Any) -> AbstractContextManager[EmbeddedRegistry]:
    """Run the real registry service for a ``with`` block on a free loopback port.

    ``data_dir=None`` keeps its store in a temporary directory removed afterwards.
    Options go to :func:`start_registry`. Yields an :class:`EmbeddedRegistry`
    (``.url``, ``.secret``, ``.client()``).
    """
    return service.running(lambda path: start_registry(path, **options), data_dir, temp_prefix="millwheel-registry-")


def open_registry(url: str | None = None, *, data_dir: str | None = None, secret: str | Secret | None = None, **client_options: Any) -> AbstractContextManager[RegistryClient]:
    """A client of the service at ``url`` (or ``$MILLWHEEL_REGISTRY_URL``), else of an embedded
    service started for the ``with`` block (its secret generated and handed to the client).

    With a URL, the secret is ``secret``, else ``$MILLWHEEL_REGISTRY_SECRET``, else the file
    named by ``$MILLWHEEL_REGISTRY_SECRET_FILE``, else ``DATA_DIR/secret``.
    """
    return _client.open_client(HttpRegistryClient, url, embed=embedded_registry, data_dir=data_dir, secret=secret, **client_options)
