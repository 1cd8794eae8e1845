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
import contextlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from id_registry import _service
from id_registry._core import GcResult, Registry
from id_registry._errors import (
    ERRORS_BY_CODE,
    AuthenticationError,
    GcBackwardsError,
    InvalidRequestError,
    RegistryError,
    RegistryUnavailableError,
    ThrottledError,
)
from id_registry._model import ClearResult, CommitResult, Item, LookupResult, ShardConfig, Status
from id_registry._worker import RegistryWorker
from servicekit import Secret

#: environment variable naming a running registry
URL_ENV = "MILLWHEEL_REGISTRY_URL"
#: environment variable holding the registry's bearer secret
SECRET_ENV = "MILLWHEEL_REGISTRY_SECRET"
#: environment variable naming a file that holds it
SECRET_FILE_ENV = "MILLWHEEL_REGISTRY_SECRET_FILE"
#: the file in a registry's data directory where its generated secret is kept
SECRET_FILE_NAME = "secret"

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

    def close(self) -> None:
        self.worker.close()
        if self._owned:
            self.registry.close()


def client_secret(secret: str | Secret | None = None, *, data_dir: str | None = None) -> Secret | None:
    """``secret``, else ``$MILLWHEEL_REGISTRY_SECRET``, else the file named by
    ``$MILLWHEEL_REGISTRY_SECRET_FILE``, else ``DATA_DIR/secret`` if it exists, else ``None``."""
    return _service.client_secret(secret, env=SECRET_ENV, env_file=SECRET_FILE_ENV, data_dir=data_dir, secret_file_name=SECRET_FILE_NAME, error=AuthenticationError)


class HttpRegistryClient(RegistryClient):
    """The registry service over HTTP/JSON (see ``docs/registry.md`` for the routes).

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
        import httpx

        if retries < 0 or timeout <= 0 or backoff < 0 or throttle_timeout < 0:
            msg = f"HttpRegistryClient: need timeout > 0, retries >= 0, backoff >= 0, throttle_timeout >= 0; got {timeout}, {retries}, {backoff}, {throttle_timeout}"
            raise InvalidRequestError(msg)
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.throttle_timeout = throttle_timeout
        self.secret = client_secret(secret)
        #: requests the service throttled and this client sent again
        self.throttled = 0
        self._httpx = httpx
        headers = self.secret.header() if self.secret is not None else {}
        self._client = httpx.Client(base_url=self.url, timeout=timeout, transport=transport, headers=headers)
        self._random = random.Random()

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

    def healthy(self) -> bool:
        """True if the service answers its health check (one attempt)."""
        try:
            return self._client.get("/healthz").status_code == 200
        except self._httpx.HTTPError:
            return False

    def close(self) -> None:
        self._client.close()

    # -- the transport
    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        httpx = self._httpx
        failures = 0  # attempts that failed on the way or with a 5xx
        answered = 0  # of which the service answered 5xx
        throttled_until: float | None = None
        throttles = 0
        last = ""
        # ASCII JSON: a lone surrogate travels as an escape and is refused by the service, by name
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode("ascii")
        headers = None if body is None else {"Content-Type": "application/json"}
        while True:
            try:
                response = self._client.request(method, path, content=content, headers=headers)
            except httpx.TransportError as exc:  # every call is safe to repeat, even if it arrived
                last = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if status < 400:
                    return response.json()  # type: ignore[no-any-return]
                if status == 429:
                    throttles += 1
                    self.throttled += 1
                    now = time.monotonic()
                    throttled_until = throttled_until if throttled_until is not None else now + self.throttle_timeout
                    if now >= throttled_until:
                        raise self._error(response)
                    wait = max(self._retry_after(response), self.backoff * 2 ** min(throttles, 6))
                    time.sleep(min(wait, 5.0, max(0.0, throttled_until - now)) * (0.75 + self._random.random() / 2))
                    continue
                if status < 500:
                    raise self._error(response)
                answered += 1
                last = f"HTTP {status}: {_service.error_message(response)}"
            failures += 1
            if failures > self.retries:
                break
            time.sleep(min(2.0, self.backoff * 2 ** (failures - 1)) * (0.5 + self._random.random() / 2))
        if answered:
            msg = f"{method} {path}: the id registry at {self.url} is running but failed {answered} of {failures} attempts (last: {last}); see the service's log"
        else:
            msg = f"{method} {path}: the id registry at {self.url} is unreachable after {failures} attempts ({last}); is `millwheel registry serve` running there?"
        raise RegistryUnavailableError(msg)

    @staticmethod
    def _retry_after(response: Any) -> float:
        """Seconds the service asked to wait: ``retry_after_ms`` in the body, else ``Retry-After``."""
        try:
            ms = response.json().get("retry_after_ms")
            if isinstance(ms, int) and 0 <= ms <= 60_000:
                return ms / 1000
        except (ValueError, AttributeError):
            pass
        header = response.headers.get("retry-after", "")
        return min(60.0, float(header)) if header.isdigit() else 1.0

    def _error(self, response: Any) -> RegistryError:
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        message = _service.error_message(response)
        cls = ERRORS_BY_CODE.get(str(body.get("error", "")), RegistryError)
        if response.status_code == 401:
            cls = AuthenticationError
            if self.secret is None:
                message += f" (this client sent no secret: pass secret=..., or set ${SECRET_ENV} or ${SECRET_FILE_ENV})"
            else:
                message += f" (this client sent the secret from {self.secret.source})"
        if cls is GcBackwardsError:
            return GcBackwardsError(message, body.get("boundary_ms"))
        if cls is ThrottledError:
            return ThrottledError(message, int(body.get("retry_after_ms") or 0))
        return cls(message)


# ---------------------------------------------------------------------------- embedded service


class EmbeddedRegistry(_service.ServiceProcess):
    """A registry service started by this process (see :func:`start_registry`): ``.url``,
    ``.secret``, ``.pid``, ``.kill()`` (kill -9), ``.stop()``, ``.log()``."""

    def client(self, **options: Any) -> HttpRegistryClient:
        """A new HTTP client of this service holding its secret (closed when the service stops)."""
        options.setdefault("secret", self.secret)
        c = HttpRegistryClient(self.url, **options)
        self.closing.append(c)
        return c


def start_registry(data_dir: str, *, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 30.0, extra_args: Sequence[str] = ()) -> EmbeddedRegistry:
    """Start ``python -m id_registry serve`` on ``data_dir`` and wait until it is healthy.

    ``port=0`` lets the service pick a free port. Its secret is ``DATA_DIR/secret``,
    generated (mode 0600) on the first start and reused after; the handle holds it and
    gives it to its clients. ``extra_args`` go to ``serve`` (e.g. ``["--backend", "etcd",
    "--etcd-endpoint", URL]``). The caller stops it; prefer :func:`embedded_registry`.
    """
    started = _service.start_process(
        "id_registry", data_dir, name="id registry", secret_file_name=SECRET_FILE_NAME, host=host, port=port,
        startup_timeout=startup_timeout, extra_args=extra_args, unavailable=RegistryUnavailableError,
    )  # fmt: skip
    return EmbeddedRegistry(started.url, started.process, started.data_dir, started.log_path, started.secret)


@contextlib.contextmanager
def embedded_registry(data_dir: str | None = None, **options: Any) -> Iterator[EmbeddedRegistry]:
    """Run the real registry service for a ``with`` block on a free loopback port.

    ``data_dir=None`` keeps its store in a temporary directory removed afterwards.
    Options go to :func:`start_registry`. Yields an :class:`EmbeddedRegistry`
    (``.url``, ``.secret``, ``.client()``).
    """
    path = tempfile.mkdtemp(prefix="millwheel-registry-") if data_dir is None else data_dir
    try:
        service = start_registry(path, **options)
        try:
            yield service
        finally:
            service.stop()
    finally:
        if data_dir is None:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def open_registry(url: str | None = None, *, data_dir: str | None = None, secret: str | Secret | None = None, **client_options: Any) -> Iterator[RegistryClient]:
    """A client of the service at ``url`` (or ``$MILLWHEEL_REGISTRY_URL``), else of an embedded
    service started for the ``with`` block (its secret generated and handed to the client).

    With a URL, the secret is ``secret``, else ``$MILLWHEEL_REGISTRY_SECRET``, else the file
    named by ``$MILLWHEEL_REGISTRY_SECRET_FILE``, else ``DATA_DIR/secret``.
    """
    url = url or os.environ.get(URL_ENV) or None
    if url:
        with HttpRegistryClient(url, secret=client_secret(secret, data_dir=data_dir), **client_options) as client:
            yield client
        return
    with embedded_registry(data_dir) as service, service.client(**client_options) as client:
        yield client
