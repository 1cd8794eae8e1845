"""The client side of a service: its secret, and a JSON-over-HTTP client base with retries.

:func:`client_secret` finds the secret a client sends (an argument, ``$ENV``, the file
named by ``$ENV_FILE``, or ``DATA_DIR/secret``). :class:`JsonHttpClient` is what each
service's HTTP client derives from; the subclass names the service and its errors in
class attributes and writes its methods with :meth:`JsonHttpClient._call`, which

* sends the body as ASCII JSON (a lone surrogate travels as an escape, and the service
  refuses it by name) and the bearer secret on every request;
* retries connection failures, timeouts and 5xx answers ``retries`` times with jittered
  exponential backoff from ``backoff`` seconds (capped at 2 s); a request that may have
  reached the service is retried only if it is ``idempotent``;
* with ``throttle_timeout`` set, retries a 429 for that long, waiting what the service
  asks (``retry_after_ms`` in the body, else ``Retry-After``);
* raises a 4xx at once as the service's own error class (:class:`~servicekit.ErrorSet`,
  :meth:`~servicekit.ServiceError.from_answer`), a 401 saying where this client looked
  for the secret; and after the retries, the service's unavailable error saying whether
  the service is down (and which command starts it) or up and failing (see its log).

:meth:`JsonHttpClient.healthy` checks ``/healthz`` once; :meth:`JsonHttpClient.close`
releases the connection pool. ``httpx`` is imported when a client is made.

:func:`open_client` gives a client of the service at a URL when there is one (an argument
or the service's ``$..._URL``), else of one started for the ``with`` block.
:func:`fragment_url` writes a page's address with its other sources in the fragment (the
authority's dashboard: ``#metrics=URL``, ``#registry=URL&registry_key=KEY``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Self, TypeVar
from urllib.parse import quote

from servicekit.checks import describe
from servicekit.errors import (
    BadRequestError,
    ConfigurationError,
    ErrorSet,
    ServiceError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from servicekit.secret import Secret, load_secret
from servicekit.service import ServiceInfo, ServiceProcess


def backoff_delay(first: float, doublings: int, cap: float, rng: Any) -> float:
    """A capped exponential backoff's next wait, jittered: ``first`` doubled ``doublings``
    times, at most ``cap`` seconds, then scaled by a random factor in [0.5, 1) from ``rng``
    (a ``random.Random``) so that callers that failed together do not retry together.

    >>> class Top:
    ...     def random(self): return 1.0
    >>> backoff_delay(0.5, 0, 30.0, Top()), backoff_delay(0.5, 3, 30.0, Top()), backoff_delay(0.5, 99, 30.0, Top())
    (0.5, 4.0, 30.0)
    """
    return min(cap, first * 2 ** min(doublings, 60)) * (0.5 + rng.random() / 2)


def client_secret(
    secret: str | Secret | None,
    info: ServiceInfo,
    *,
    data_dir: str | None = None,
    error: type[Exception] = ConfigurationError,
) -> Secret | None:
    """``secret``, else ``$ENV``, else the file named by ``$ENV_FILE`` (``info.secret_env``,
    ``info.secret_file_env``), else ``DATA_DIR/secret`` if it exists; ``None`` if there is
    none. A bad secret raises ``error``."""
    if isinstance(secret, Secret):
        return secret
    if secret is not None:
        return Secret(secret, source="secret= of the client")
    default = os.path.join(data_dir, info.secret_file_name) if data_dir else None
    try:
        return load_secret(env=info.secret_env, env_file=info.secret_file_env, default_file=default)
    except ConfigurationError as exc:
        raise error(str(exc)) from None


def fragment_url(url: str, **params: str | None) -> str:
    """``url`` with ``#name=value&...`` (``None`` values left out): how a page is told where its
    other sources are (the authority's dashboard: ``#metrics=URL``, ``#registry=URL&registry_key=KEY``).
    A fragment never reaches a server, not even in ``Referer``.

    >>> fragment_url("http://127.0.0.1:7300/", metrics="http://127.0.0.1:9464/metrics", registry=None)
    'http://127.0.0.1:7300/#metrics=http://127.0.0.1:9464/metrics'
    """
    pairs = [
        f"{name}={quote(value, safe=':/[]@')}"
        for name, value in params.items()
        if value is not None
    ]
    return f"{url}#{'&'.join(pairs)}" if pairs else url


def error_message(response: Any) -> str:
    """The ``message`` of a JSON error answer (cut to 500 characters), else a short description."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])[:500]
    return f"HTTP {response.status_code}: {describe(response.text, 200)}"


class JsonHttpClient:
    """A service over HTTP/JSON: see the module docstring. Thread-safe (one connection pool).

    * ``secret`` — the bearer secret, else looked up by :func:`client_secret` where
      :attr:`info` says;
    * ``timeout`` — seconds for each attempt (connect, read, write);
    * ``retries``, ``backoff`` — extra attempts after a failure, and the first delay;
    * ``throttle_timeout`` — how long to retry a 429 (``None``: a 429 is raised like any 4xx);
    * ``transport`` — an ``httpx`` transport, e.g. ``httpx.MockTransport`` in tests.
    """

    #: the service: its name in messages, the command that runs it, where its secret is
    info: ClassVar[ServiceInfo] = ServiceInfo(
        "service", "service", "service", "SERVICE_URL", "SERVICE_SECRET", "SERVICE_SECRET_FILE"
    )
    #: the service's errors, which answers are turned back into
    errors: ClassVar[ErrorSet] = ErrorSet(
        ServiceError, BadRequestError, UnauthorizedError, ServiceUnavailableError
    )
    #: what to do after a request that was not retried because it may have been applied
    not_retried_hint: ClassVar[str] = "check the service's state before trying again"

    def __init__(
        self,
        url: str,
        *,
        secret: str | Secret | None = None,
        timeout: float = 5.0,
        retries: int = 5,
        backoff: float = 0.05,
        throttle_timeout: float | None = None,
        transport: Any = None,
    ) -> None:
        import httpx

        if (
            retries < 0
            or timeout <= 0
            or backoff < 0
            or (throttle_timeout is not None and throttle_timeout < 0)
        ):
            shown = f"timeout={timeout}, retries={retries}, backoff={backoff}" + (
                "" if throttle_timeout is None else f", throttle_timeout={throttle_timeout}"
            )
            msg = f"{type(self).__name__}: need timeout > 0, retries >= 0, backoff >= 0, throttle_timeout >= 0; got {shown}"
            raise self.errors.invalid(msg)
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.throttle_timeout = throttle_timeout
        self.secret = client_secret(secret, self.info, error=self.errors.authentication)
        #: requests the service throttled and this client sent again
        self.throttled = 0
        self._httpx = httpx
        headers = self.secret.header() if self.secret is not None else {}
        self._client = httpx.Client(
            base_url=self.url, timeout=timeout, transport=transport, headers=headers
        )
        self._random = random.Random()

    def healthy(self) -> bool:
        """True if the service answers its health check (one attempt, no retries)."""
        try:
            return self._client.get("/healthz").status_code == 200
        except self._httpx.HTTPError:
            return False

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the transport
    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, str] | None = None,
        idempotent: bool = True,
    ) -> Any:
        """``method path`` with ``body`` as JSON; the decoded answer, or the service's error."""
        httpx = self._httpx
        failures = 0  # attempts that failed on the way or with a 5xx
        answered = 0  # of which the service answered 5xx
        throttled_until: float | None = None
        throttles = 0
        last = ""
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode("ascii")
        headers = None if body is None else {"Content-Type": "application/json"}
        while True:
            try:
                response = self._client.request(
                    method, path, content=content, headers=headers, params=params
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                last = (
                    f"{type(exc).__name__}: {exc}"  # the request never left: always safe to retry
                )
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                if not idempotent:
                    msg = (
                        f"{method} {path} to {self.info.the} at {self.url} failed after it may have been "
                        f"received ({last}); not retried because repeating it is not harmless: {self.not_retried_hint}"
                    )
                    raise self.errors.unavailable(msg) from exc
            else:
                status = response.status_code
                if status < 400:
                    return response.json()
                if status == 429 and self.throttle_timeout is not None:
                    throttles += 1
                    self.throttled += 1
                    now = time.monotonic()
                    throttled_until = (
                        throttled_until
                        if throttled_until is not None
                        else now + self.throttle_timeout
                    )
                    if now >= throttled_until:
                        raise self._error(response)
                    wait = max(self._retry_after(response), self.backoff * 2 ** min(throttles, 6))
                    time.sleep(
                        min(wait, 5.0, max(0.0, throttled_until - now))
                        * (0.75 + self._random.random() / 2)
                    )
                    continue
                if status < 500 or not idempotent:
                    raise self._error(response)
                answered += 1
                last = f"HTTP {status}: {error_message(response)}"
            failures += 1
            if failures > self.retries:
                break
            time.sleep(backoff_delay(self.backoff, failures - 1, 2.0, self._random))
        where = f"{method} {path}: {self.info.the} at {self.url}"
        if answered:
            msg = f"{where} is running but failed {answered} of {failures} attempts (last: {last}); see the service's log"
        else:
            msg = f"{where} is unreachable after {failures} attempts ({last}); is `{self.info.serve_command}` running there?"
        raise self.errors.unavailable(msg)

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

    def _error(self, response: Any) -> ServiceError:
        """The service's error for a 4xx (or a 5xx not retried), by its code; a 401 says where
        this client looked for the secret."""
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        message = error_message(response)
        cls = self.errors.by_code().get(str(body.get("error", "")), self.errors.root)
        if response.status_code == 401:
            cls = self.errors.authentication
            if self.secret is None:
                message += f" (this client sent no secret: pass secret=..., or set ${self.info.secret_env} or ${self.info.secret_file_env})"
            else:
                message += f" (this client sent the secret from {self.secret.source})"
        return cls.from_answer(message, body)


J = TypeVar("J", bound=JsonHttpClient)


@contextlib.contextmanager
def open_client(
    client_class: type[J],
    url: str | None = None,
    *,
    embed: Callable[[str | None], AbstractContextManager[ServiceProcess]],
    data_dir: str | None = None,
    secret: str | Secret | None = None,
    **client_options: Any,
) -> Iterator[J]:
    """A ``client_class`` of the service at ``url`` (or ``$URL_ENV`` of ``client_class.info``),
    else of the service ``embed(data_dir)`` runs for the ``with`` block (with the secret it
    generated). With a URL, the secret is ``secret``, else the environment's, else
    ``DATA_DIR/secret`` (see :func:`client_secret`)."""
    info = client_class.info
    url = url or os.environ.get(info.url_env) or None
    with contextlib.ExitStack() as stack:
        if url:
            found = client_secret(
                secret, info, data_dir=data_dir, error=client_class.errors.authentication
            )
        else:
            service = stack.enter_context(embed(data_dir))
            url, found = service.url, service.secret
        client = client_class(url, secret=found, **client_options)
        stack.callback(client.close)  # before the service stops
        yield client
