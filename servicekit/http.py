"""The HTTP side of servicekit: one ASGI guard in front of a Starlette app, and JSON endpoints.

:class:`GuardMiddleware` checks every request before the app sees it, cheapest first,
and answers a refusal itself as ``{"error": code, "message": text}``:

1. ``Host`` must be one of :attr:`Guard.allowed_hosts` (port ignored) or an IP address,
   else **421**: a page on ``evil.example`` whose name was re-pointed at this machine
   (DNS rebinding) names ``evil.example`` in ``Host``, while an address typed as such
   can never be the origin of another site's page;
2. a request from a browser page of another origin is refused with **403**: an
   ``Origin`` header that is not this service's own origin (or one of
   :attr:`Guard.allowed_origins`), ``Origin: null``, or ``Sec-Fetch-Site`` other than
   ``same-origin``/``none`` (a top-level navigation, e.g. following a link to a
   dashboard, is let through when it is a ``GET``);
3. every request other than ``GET``/``HEAD`` (every mutation), and a ``GET`` of one of
   :attr:`Guard.private_reads`, must carry ``Authorization: Bearer <secret>``, compared
   in constant time, else **401** with a message saying where the secret comes from;
   a ``GET`` of one of :attr:`Guard.keyed_reads` needs the secret or its read key
   (:meth:`Secret.read_key <servicekit.secret.Secret.read_key>`);
4. a body over :attr:`Guard.max_body_bytes` is refused with **413** from its
   ``Content-Length`` before a byte of it is read, and while it streams in when it has
   none; a body not declared ``application/json`` gets **415**. These answers close the
   connection, so the rest of the body is never read.

**Keyed reads**, the one cross-origin pattern: a ``GET`` of a path in
:attr:`Guard.keyed_reads` (read-only figures, e.g. the IdRegistry's ``/v1/stats`` that the
authority's dashboard plots) may come from a browser page of a loopback origin
(``http(s)://127.0.0.1``, ``localhost`` or ``[::1]``, any port) or of
:attr:`Guard.allowed_origins`, with the secret or its read key; its answers, refusals
included, carry ``Access-Control-Allow-Origin`` (that origin; never credentials), and its
CORS preflight (``OPTIONS`` asking for ``GET`` with at most an ``Authorization`` header) is
answered **204** by the guard. Any other origin, method or header is refused (403) as above.

Every response also gets ``X-Content-Type-Options: nosniff`` and ``X-Frame-Options:
DENY``. Endpoints wrapped in :func:`json_endpoint` turn a :class:`ServiceError` into its
status and an unexpected exception into a 500 whose message is cut short and names
the route. The JSON body itself is checked by :mod:`servicekit.checks` (depth, NaN,
required and unexpected fields).

::

    guard = Guard(secret=load_secret(...), allowed_hosts=hosts_for_bind("127.0.0.1"))
    app = Starlette(routes=[Route("/v1/thing", json_endpoint(thing), methods=["POST"])],
                    middleware=[Middleware(GuardMiddleware, guard=guard)])
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servicekit.checks import describe, truncate
from servicekit.errors import (
    BadRequestError,
    ForbiddenError,
    MisdirectedRequestError,
    PayloadTooLargeError,
    ServiceError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)
from servicekit.secret import Secret
from servicekit.service import DEFAULT_MAX_BODY_BYTES

#: names that always mean this machine
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})
_SAFE_METHODS = frozenset({"GET", "HEAD"})
_ALWAYS_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY")]
#: what the CORS preflight of a keyed read allows, and how long a browser may remember it
_PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "GET, HEAD",
    "Access-Control-Allow-Headers": "Authorization",
    "Access-Control-Max-Age": "600",
}

log = logging.getLogger("servicekit")


def hosts_for_bind(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` names a service bound to ``bind_host`` answers: loopback names, the bound
    address itself (unless it is a wildcard such as ``0.0.0.0``), and ``extra``.

    >>> sorted(hosts_for_bind("0.0.0.0", ["authority.example.com"]))
    ['127.0.0.1', '::1', 'authority.example.com', 'localhost']
    """
    hosts = set(LOOPBACK_HOSTS)
    if bind_host.strip("[]") not in _WILDCARDS:
        hosts.add(normalize_host(bind_host))
    hosts.update(normalize_host(h) for h in extra)
    return frozenset(hosts)


def is_loopback_origin(origin: str) -> bool:
    """True for the origin of a page served by this machine's loopback: ``http(s)://`` and
    ``localhost``, ``127.0.0.1`` or ``[::1]``, any port.

    >>> is_loopback_origin("http://127.0.0.1:7300"), is_loopback_origin("https://localhost"), is_loopback_origin("http://localhost.evil.example")
    (True, True, False)
    """
    try:
        parts = urlsplit(origin.strip().lower())
        bare = (
            parts.username is None
            and not parts.path.strip("/")
            and not parts.query
            and not parts.fragment
        )
        return (
            parts.scheme in ("http", "https")
            and parts.hostname in LOOPBACK_HOSTS
            and bare
            and parts.port != 0
        )
    except ValueError:
        return False


def normalize_host(host: str) -> str:
    """``Host`` header or name -> lower-case name without port, brackets or trailing dot.

    >>> normalize_host("LocalHost.:7300"), normalize_host("[::1]:80"), normalize_host("10.0.0.5")
    ('localhost', '::1', '10.0.0.5')
    """
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


@dataclass(frozen=True)
class Guard:
    """What a service lets in; see the module docstring for the order of the checks.

    * ``secret`` — the bearer secret every mutation (and every private read) must carry;
    * ``allowed_hosts`` — ``Host`` names served (see :func:`hosts_for_bind`); IP
      addresses are always served unless ``ip_hosts=False``;
    * ``allowed_origins`` — other browser origins allowed to call (``"https://ops.example.com"``);
    * ``max_body_bytes`` — the request body limit;
    * ``private_reads`` — ``GET`` paths that need the secret (those that reveal credentials);
    * ``keyed_reads`` — ``GET`` paths that need the secret or its read key, readable by pages of
      loopback origins and ``allowed_origins`` too (CORS; see the module docstring);
    * ``secret_hint`` — where a client finds the secret, for the 401 message;
    * ``host_hint`` — how an operator allows another host name, for the 421 message;
    * ``service`` — the service's name in messages and in ``WWW-Authenticate``.
    """

    secret: Secret
    allowed_hosts: frozenset[str] = LOOPBACK_HOSTS
    allowed_origins: frozenset[str] = frozenset()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    private_reads: frozenset[str] = frozenset()
    keyed_reads: frozenset[str] = frozenset()
    secret_hint: str = "ask the operator of the service for it"
    host_hint: str = "ask the operator to allow it"
    service: str = "the service"
    ip_hosts: bool = True
    _origins: frozenset[str] = field(init=False, repr=False, default=frozenset())
    _read_key: Secret | None = field(init=False, repr=False, default=None)

    @classmethod
    def for_bind(
        cls,
        secret: Secret,
        *,
        bind_host: str = "127.0.0.1",
        allow_hosts: Iterable[str] = (),
        allow_origins: Iterable[str] = (),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        **options: Any,
    ) -> Guard:
        """The guard of a service bound to ``bind_host`` that also answers for ``allow_hosts``
        and lets pages of ``allow_origins`` call it (its ``--allow-host``/``--allow-origin``);
        ``options``: the other fields (``private_reads``, the hints, ``service``)."""
        return cls(
            secret=secret,
            allowed_hosts=hosts_for_bind(bind_host, allow_hosts),
            allowed_origins=frozenset(allow_origins),
            max_body_bytes=max_body_bytes,
            **options,
        )

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            msg = f"{self.service}: max_body_bytes must be >= 1, got {self.max_body_bytes}"
            raise ValueError(msg)
        object.__setattr__(
            self, "_origins", frozenset(o.rstrip("/").lower() for o in self.allowed_origins)
        )
        object.__setattr__(self, "_read_key", self.secret.read_key() if self.keyed_reads else None)

    # -- the checks, each raising the ServiceError it is answered with
    def check_host(self, headers: Headers) -> None:
        raw = headers.get("host")
        if raw is None:
            msg = f"the request has no Host header; {self.service} answers for {sorted(self.allowed_hosts)}"
            raise BadRequestError(msg)
        host = normalize_host(raw)
        if host not in self.allowed_hosts and not (self.ip_hosts and _is_ip(host)):
            msg = (
                f"{self.service} does not answer for host {describe(raw, 60)} (it answers for "
                f"{', '.join(sorted(self.allowed_hosts))}); if that name is really this service, {self.host_hint}"
            )
            raise MisdirectedRequestError(msg)

    def reader_origin(self, path: str, headers: Headers) -> str | None:
        """The ``Origin`` of a browser page allowed to make a keyed read of ``path`` (its own,
        a loopback one, or one of :attr:`allowed_origins`), as sent; ``None`` otherwise."""
        origin = headers.get("origin")
        if origin is None or path not in self.keyed_reads:
            return None
        return origin if self._known_origin(origin, headers) or is_loopback_origin(origin) else None

    def _known_origin(self, origin: str, headers: Headers) -> bool:
        """``origin`` is this service's own or one of :attr:`allowed_origins`."""
        normalized = origin.strip().rstrip("/").lower()
        try:
            netloc = urlsplit(normalized).netloc
        except ValueError:
            netloc = ""
        return (
            netloc != "" and netloc == headers.get("host", "").strip().lower()
        ) or normalized in self._origins

    def check_origin(self, method: str, headers: Headers, path: str = "") -> None:
        origin = headers.get("origin")
        if origin is not None:
            keyed = method in _SAFE_METHODS and self.reader_origin(path, headers) is not None
            if not keyed and not self._known_origin(origin, headers):
                msg = (
                    f"{self.service} refuses requests from pages of another site (Origin {describe(origin, 60)}); "
                    "open its own page, or have the operator allow that origin"
                )
                raise ForbiddenError(msg)
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none") and origin is None:
            navigation = method in _SAFE_METHODS and headers.get("sec-fetch-mode") == "navigate"
            if not navigation:
                msg = f"{self.service} refuses requests from pages of another site (Sec-Fetch-Site: {describe(site, 30)}); open its own page"
                raise ForbiddenError(msg)

    def check_secret(self, method: str, path: str, headers: Headers) -> None:
        keyed = method in _SAFE_METHODS and path in self.keyed_reads
        if method in _SAFE_METHODS and path not in self.private_reads and not keyed:
            return
        what = f"{method} {path if len(path) <= 80 else describe(path, 80)}"
        needed = f"{self.service}'s secret or its read key" if keyed else f"{self.service}'s secret"
        auth = headers.get("authorization")
        if auth is None:
            msg = f"{what} needs {needed}: send the header 'Authorization: Bearer <secret>'; {self.secret_hint}"
            raise UnauthorizedError(msg)
        scheme, _, presented = auth.partition(" ")
        presented = presented.strip()
        accepted = self.secret.matches(presented) or (
            keyed and self._read_key is not None and self._read_key.matches(presented)
        )
        if scheme.lower() != "bearer" or not accepted:
            msg = f"{what}: the bearer credential sent is not {needed}; {self.secret_hint}"
            raise UnauthorizedError(msg)

    def check_preflight(self, path: str, headers: Headers) -> dict[str, str]:
        """A CORS preflight (``OPTIONS`` with ``Access-Control-Request-Method``) of a keyed read from
        a reader origin, asking for ``GET`` with at most ``Authorization``: the headers of its 204
        answer; anything else raises :class:`ForbiddenError`."""
        if self.reader_origin(path, headers) is None:
            msg = f"{self.service} refuses requests from pages of another site (Origin {describe(headers.get('origin', 'none'), 60)}); open its own page"
            raise ForbiddenError(msg)
        method = headers.get("access-control-request-method", "")
        asked = {
            h.strip().lower()
            for h in headers.get("access-control-request-headers", "").split(",")
            if h.strip()
        }
        if method not in _SAFE_METHODS or not asked <= {"authorization"}:
            msg = f"{describe(path, 80)} may be read from another page with GET and an Authorization header only, not {describe(method, 20)} with {sorted(asked)[:5]}"
            raise ForbiddenError(msg)
        return dict(_PREFLIGHT_HEADERS)

    def check_body(self, method: str, headers: Headers) -> None:
        length = headers.get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                msg = f"Content-Length must be a number of bytes, got {describe(length, 30)}"
                raise BadRequestError(msg)
            if int(length) > self.max_body_bytes:
                msg = f"the request body is {int(length):,} bytes, more than the {self.max_body_bytes:,} {self.service} accepts; send smaller batches"
                raise PayloadTooLargeError(msg)
        has_body = (length is not None and int(length) > 0) or "chunked" in headers.get(
            "transfer-encoding", ""
        ).lower()
        if has_body:
            ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if ctype != "application/json" and not ctype.endswith("+json"):
                msg = f"the request body must be JSON sent with 'Content-Type: application/json', got {describe(ctype or 'no Content-Type', 60)}"
                raise UnsupportedMediaTypeError(msg)

    def check(self, method: str, path: str, headers: Headers) -> None:
        """Every check, in order; raises the first refusal."""
        self.check_host(headers)
        self.check_origin(method, headers, path)
        self.check_secret(method, path, headers)
        self.check_body(method, headers)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` as compact JSON (``NaN`` is never sent: it is not JSON)."""
    body = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def error_response(exc: ServiceError, *, close: bool = False, realm: str = "service") -> Response:
    """The answer to ``exc``: its status and ``{"error", "message", **extra}``, the message cut short.

    ``close=True`` (always for 413) adds ``Connection: close``, so a body the service did
    not read is never read.
    """
    body: dict[str, Any] = {"error": exc.code, "message": truncate(str(exc)), **exc.extra()}
    headers: dict[str, str] = {"Cache-Control": "no-store"}
    if isinstance(exc, UnauthorizedError):
        headers["WWW-Authenticate"] = f'Bearer realm="{realm}"'
    if close or isinstance(exc, PayloadTooLargeError):
        headers["Connection"] = "close"
    return json_response(body, exc.status, headers)


def json_endpoint(
    fn: Callable[[Request], Awaitable[Any]], *, logger: logging.Logger | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint from ``fn(request) -> JSON-able data`` (or a Response).

    A :class:`ServiceError` becomes its status; any other exception is logged with its
    traceback and answered 500 ``internal`` with a short message naming the route (the
    request was not acknowledged, so a client may retry).
    """
    logger = logger or log

    async def endpoint(request: Request) -> Response:
        try:
            data = await fn(request)
        except ServiceError as exc:
            return error_response(exc)
        except (
            ClientDisconnect
        ):  # the client left while sending its body: nothing was done, nobody to tell
            return Response(status_code=400)
        except Exception as exc:
            logger.exception("internal error on %s %s", request.method, request.url.path)
            message = f"{request.method} {request.url.path} failed inside the service ({type(exc).__name__}: {truncate(str(exc), 300)}); see the service's log"
            return json_response({"error": "internal", "message": message}, 500)
        return data if isinstance(data, Response) else json_response(data)

    return endpoint


class GuardMiddleware:
    """ASGI middleware applying a :class:`Guard` to every HTTP request (see the module docstring)."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        method, path = scope["method"], scope["path"]
        send_with_headers = _with_headers(send, _cors_headers(self.guard, path, headers))
        try:
            if (
                method == "OPTIONS"
                and path in self.guard.keyed_reads
                and "access-control-request-method" in headers
            ):
                self.guard.check_host(headers)
                allowed = self.guard.check_preflight(path, headers)
                await Response(status_code=204, headers={**allowed, "Cache-Control": "no-store"})(
                    scope, receive, send_with_headers
                )
                return
            self.guard.check(method, path, headers)
        except ServiceError as exc:
            # the body (if any) was not read: close, so the client's upload stops here
            close = method not in _SAFE_METHODS or headers.get("content-length", "0") != "0"
            await error_response(exc, close=close, realm=self.guard.service)(
                scope, receive, send_with_headers
            )
            return
        limit = self.guard.max_body_bytes
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    msg = f"the request body is more than the {limit:,} bytes {self.guard.service} accepts; send smaller batches"
                    raise PayloadTooLargeError(msg)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send_with_headers(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except PayloadTooLargeError as exc:  # raised while an app that is not a json_endpoint read
            if started:
                raise
            await error_response(exc)(scope, receive, send_with_headers)


def _cors_headers(guard: Guard, path: str, headers: Headers) -> list[tuple[bytes, bytes]]:
    """``Access-Control-Allow-Origin`` for a keyed read from a reader origin (refusals included, so
    the page can show them), and ``Vary: Origin`` on every answer of a keyed read."""
    if path not in guard.keyed_reads:
        return []
    origin = guard.reader_origin(path, headers)
    allow = [] if origin is None else [(b"access-control-allow-origin", origin.encode("latin-1"))]
    return [*allow, (b"vary", b"Origin")]


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]] | None = None) -> Send:
    added = [*_ALWAYS_HEADERS, *(extra or [])]

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *added]}
        await send(message)

    return wrapped
