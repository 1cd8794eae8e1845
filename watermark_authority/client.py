"""Clients of the low-watermark authority, for the runtime and the harness (MillWheel §7.2).

One interface, :class:`WatermarkClient`, three ways to get one:

* :class:`InProcessWatermarkClient` — the authority's core in this process (unit tests,
  the harness); the same :class:`~watermark_authority.Authority` the service runs;
* :class:`HttpWatermarkClient` — the service over HTTP/JSON, with timeouts and retries;
* :func:`embedded_authority` — starts the real service as a subprocess on a free loopback
  port and stops it afterwards (local runs); :func:`open_authority` picks a URL when one
  is given (``url=`` or ``$MILLWHEEL_AUTHORITY_URL``, cluster runs) and an embedded
  service otherwise.

Every mutation over HTTP carries the service's bearer secret. An HTTP client takes it from
``secret=``, else ``$MILLWHEEL_AUTHORITY_SECRET`` (the secret itself), else the file named
by ``$MILLWHEEL_AUTHORITY_SECRET_FILE``; :func:`open_authority` also looks in
``DATA_DIR/secret``, where an embedded authority keeps the secret it generated (mode 0600),
so a second driver on the same run directory finds it. Reads need no secret. Each client
names its process (``owner``, default ``host:pid``) when it acquires key intervals, so the
dashboard can say which process holds a watermark back.

A worker's life, in the interface's words::

    >>> from watermark_authority import InProcessWatermarkClient
    >>> wm = InProcessWatermarkClient()
    >>> tokens = wm.acquire_many("WindowCounter", ["interval-0", "interval-1"])   # own the key intervals
    >>> wm.report_batch("WindowCounter", [("interval-0", tokens["interval-0"], 1_000), ("interval-1", tokens["interval-1"], 2_000)])
    >>> wm.report_injector("queries", "reader-0", 5_000)
    >>> wm.watermark("WindowCounter"), wm.watermarks()
    (1000, {'WindowCounter': 1000, 'queries': 5000})

Timestamps are int milliseconds since the epoch; ``MIN_TIMESTAMP`` means "nothing known",
``MAX_TIMESTAMP`` "finished". A consumer's input low watermark is the minimum over the
watermarks of the computations and injectors it reads from: take it yourself (§7.2).

Errors are the same classes on every client (:mod:`watermark_authority._errors`): a report
with a fenced token raises :class:`StaleTokenError`; 4xx answers are never retried.
"""

from __future__ import annotations

import abc
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from servicekit import ConfigurationError, Secret, describe, load_secret
from watermark_authority._core import Authority, Report
from watermark_authority._errors import (
    ERRORS_BY_CODE,
    AuthenticationError,
    AuthorityError,
    AuthorityUnavailableError,
    InvalidRequestError,
    StaleTokenError,
)

#: environment variable naming a running authority (cluster runs)
URL_ENV = "MILLWHEEL_AUTHORITY_URL"
#: environment variable holding the authority's bearer secret
SECRET_ENV = "MILLWHEEL_AUTHORITY_SECRET"
#: environment variable naming a file that holds the authority's bearer secret
SECRET_FILE_ENV = "MILLWHEEL_AUTHORITY_SECRET_FILE"
#: the file in an authority's data directory where its generated secret is kept
SECRET_FILE_NAME = "secret"


def default_owner() -> str:
    """How this process names itself to the authority: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def client_secret(secret: str | Secret | None = None, *, data_dir: str | None = None) -> Secret | None:
    """The secret a client sends: ``secret``, else ``$MILLWHEEL_AUTHORITY_SECRET``, else the
    file named by ``$MILLWHEEL_AUTHORITY_SECRET_FILE``, else ``DATA_DIR/secret`` if it
    exists; ``None`` if there is none (reads still work)."""
    if isinstance(secret, Secret):
        return secret
    if secret is not None:
        return Secret(secret, source="secret= of the client")
    default = os.path.join(data_dir, SECRET_FILE_NAME) if data_dir else None
    try:
        return load_secret(env=SECRET_ENV, env_file=SECRET_FILE_ENV, default_file=default)
    except ConfigurationError as exc:
        raise AuthenticationError(str(exc)) from None

#: a report as given to :meth:`WatermarkClient.report_batch`: ``(interval, token, oldest_work)``
#: or ``(interval, token, oldest_work, pending)``
ReportLike = tuple[Any, ...]


def _normalize(reports: Iterable[ReportLike]) -> list[Report]:
    out: list[Report] = []
    for r in reports:
        if isinstance(r, tuple | list) and len(r) == 3:
            out.append((r[0], r[1], r[2], None))
        else:
            out.append(r)  # type: ignore[arg-type]  # validated by the authority
    return out


class WatermarkClient(abc.ABC):
    """What the runtime and the harness need from the authority; see the module docstring.

    Abstract: :meth:`acquire_many`, :meth:`report_batch`, :meth:`check_token`,
    :meth:`split`, :meth:`merge`, :meth:`expect_injector_processes`,
    :meth:`report_injector`, :meth:`watermark`, :meth:`watermarks`,
    :meth:`percentile_watermark`, :meth:`close`. A client is a context manager.
    """

    # -- sequencers (§6.2, §7.2)
    def acquire(self, computation: str, interval: str) -> int:
        """Own ``interval`` of ``computation``; invalidates the previous owner's token."""
        return self.acquire_many(computation, [interval])[interval]

    @abc.abstractmethod
    def acquire_many(self, computation: str, intervals: Sequence[str]) -> dict[str, int]:
        """Own several intervals at once: ``{interval: token}``."""

    @abc.abstractmethod
    def check_token(self, computation: str, interval: str, token: int) -> None:
        """Raise :class:`StaleTokenError` unless ``token`` is current (fencing stream-log writes)."""

    # -- reports (§7.2)
    def report(self, computation: str, interval: str, token: int, oldest_work: int, pending: int | None = None) -> None:
        """Report the oldest pending work of one interval; :class:`StaleTokenError` if fenced."""
        self.report_batch(computation, [(interval, token, oldest_work, pending)])

    @abc.abstractmethod
    def report_batch(self, computation: str, reports: Iterable[ReportLike]) -> None:
        """Report many intervals at once, all or nothing: ``(interval, token, oldest_work[, pending])``."""

    # -- ownership moves (§7.1)
    @abc.abstractmethod
    def split(self, computation: str, interval: str, into: Sequence[str]) -> dict[str, int]:
        """Split an interval; the new ones inherit its last value and get fresh tokens."""

    @abc.abstractmethod
    def merge(self, computation: str, intervals: Sequence[str], into: str) -> int:
        """Merge intervals into one (min of their values); returns its fresh token."""

    # -- injectors (§5.2)
    @abc.abstractmethod
    def expect_injector_processes(self, injector: str, processes: Sequence[str]) -> None:
        """Declare an injector's processes; one that has not reported holds its watermark."""

    @abc.abstractmethod
    def report_injector(self, injector: str, process: str, low_watermark: int) -> None:
        """Report one injector process's low watermark."""

    # -- broadcast (§7.2)
    @abc.abstractmethod
    def watermark(self, computation_or_injector: str) -> int:
        """The published low watermark of one computation or injector."""

    @abc.abstractmethod
    def watermarks(self) -> dict[str, int]:
        """Every published low watermark by name."""

    @abc.abstractmethod
    def percentile_watermark(self, name: str, pct: float) -> int:
        """The ``pct`` percent watermark: stragglers stripped, for speed over completeness."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections (the in-process client closes nothing)."""

    def __enter__(self) -> WatermarkClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessWatermarkClient(WatermarkClient):
    """The authority's core in this process, behind a lock; identical semantics to the service.

    Pass an :class:`~watermark_authority.Authority` to share one (e.g. with a
    :class:`~watermark_authority.MemoryJournal` to test restarts), or get a fresh one.
    """

    def __init__(self, authority: Authority | None = None, *, owner: str | None = None) -> None:
        self.authority = authority if authority is not None else Authority()
        self.owner = owner or default_owner()
        self._lock = threading.Lock()

    def acquire_many(self, computation: str, intervals: Sequence[str]) -> dict[str, int]:
        with self._lock:
            return self.authority.acquire(computation, intervals, owner=self.owner)

    def check_token(self, computation: str, interval: str, token: int) -> None:
        with self._lock:
            self.authority.check_token(computation, interval, token)

    def report_batch(self, computation: str, reports: Iterable[ReportLike]) -> None:
        batch = _normalize(reports)
        with self._lock:
            self.authority.report(computation, batch)

    def split(self, computation: str, interval: str, into: Sequence[str]) -> dict[str, int]:
        with self._lock:
            return self.authority.split(computation, interval, into, owner=self.owner)

    def merge(self, computation: str, intervals: Sequence[str], into: str) -> int:
        with self._lock:
            return self.authority.merge(computation, intervals, into, owner=self.owner)

    def expect_injector_processes(self, injector: str, processes: Sequence[str]) -> None:
        with self._lock:
            self.authority.expect_injector_processes(injector, list(processes))

    def report_injector(self, injector: str, process: str, low_watermark: int) -> None:
        with self._lock:
            self.authority.report_injector(injector, process, low_watermark)

    def watermark(self, computation_or_injector: str) -> int:
        return self.authority.watermark(computation_or_injector)  # a snapshot read: no lock

    def watermarks(self) -> dict[str, int]:
        return self.authority.watermarks()

    def percentile_watermark(self, name: str, pct: float) -> int:
        with self._lock:
            return self.authority.percentile_watermark(name, pct)

    def close(self) -> None:
        return None


class HttpWatermarkClient(WatermarkClient):
    """The authority service over HTTP/JSON (see ``docs/authority.md`` for the API).

    * ``secret`` — the service's bearer secret, sent with every request (see
      :func:`client_secret` for where it is looked up when not given); without one,
      reads work and mutations raise :class:`AuthenticationError`;
    * ``owner`` — how this process names itself when it acquires (default ``host:pid``);
    * ``timeout`` — seconds for each attempt (connect, read, write);
    * ``retries`` — extra attempts after a connection failure or a 5xx answer, with
      exponential backoff from ``backoff`` seconds (jittered, capped at 2 s). A request that
      may have reached the service is retried only if repeating it is harmless (reports,
      reads, acquire: a repeated acquire only fences the token nobody received); split and
      merge are retried only when the connection was never made. A 4xx is never retried:
      it raises the matching :class:`~watermark_authority.AuthorityError` at once (401:
      :class:`AuthenticationError`, saying where this client looked for the secret);
    * ``transport`` — an ``httpx`` transport, e.g. ``httpx.MockTransport`` in tests.

    After the retries, :class:`AuthorityUnavailableError`. Thread-safe (one connection pool).
    """

    def __init__(
        self,
        url: str,
        *,
        secret: str | Secret | None = None,
        owner: str | None = None,
        timeout: float = 5.0,
        retries: int = 5,
        backoff: float = 0.05,
        transport: Any = None,
    ) -> None:
        import httpx

        if retries < 0 or timeout <= 0 or backoff < 0:
            msg = f"HttpWatermarkClient: need timeout > 0, retries >= 0, backoff >= 0; got {timeout}, {retries}, {backoff}"
            raise InvalidRequestError(msg)
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.owner = owner or default_owner()
        self.secret = client_secret(secret)
        self._httpx = httpx
        headers = self.secret.header() if self.secret is not None else {}
        self._client = httpx.Client(base_url=self.url, timeout=timeout, transport=transport, headers=headers)
        self._random = random.Random(0)

    # -- the interface
    def acquire_many(self, computation: str, intervals: Sequence[str]) -> dict[str, int]:
        body = {"computation": computation, "intervals": list(intervals), "owner": self.owner}
        out = self._call("POST", "/v1/acquire", body)
        return {k: int(v) for k, v in out["tokens"].items()}

    def check_token(self, computation: str, interval: str, token: int) -> None:
        self._call("POST", "/v1/token/check", {"computation": computation, "interval": interval, "token": token})

    def report_batch(self, computation: str, reports: Iterable[ReportLike]) -> None:
        batch = [list(r) for r in _normalize(reports)]
        self._call("POST", "/v1/report", {"computation": computation, "reports": batch})

    def split(self, computation: str, interval: str, into: Sequence[str]) -> dict[str, int]:
        body = {"computation": computation, "interval": interval, "into": list(into), "owner": self.owner}
        return {k: int(v) for k, v in self._call("POST", "/v1/split", body, idempotent=False)["tokens"].items()}

    def merge(self, computation: str, intervals: Sequence[str], into: str) -> int:
        body = {"computation": computation, "intervals": list(intervals), "into": into, "owner": self.owner}
        return int(self._call("POST", "/v1/merge", body, idempotent=False)["token"])

    def expect_injector_processes(self, injector: str, processes: Sequence[str]) -> None:
        self._call("POST", "/v1/injectors/expect", {"injector": injector, "processes": list(processes)})

    def report_injector(self, injector: str, process: str, low_watermark: int) -> None:
        body = {"injector": injector, "process": process, "low_watermark": low_watermark}
        self._call("POST", "/v1/injectors/report", body)

    def watermark(self, computation_or_injector: str) -> int:
        return int(self._call("GET", "/v1/watermark", params={"name": computation_or_injector})["low_watermark"])

    def watermarks(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._call("GET", "/v1/watermarks")["watermarks"].items()}

    def percentile_watermark(self, name: str, pct: float) -> int:
        return int(self._call("GET", "/v1/watermark", params={"name": name, "pct": str(pct)})["watermark"])

    # -- extras over HTTP only
    def status(self) -> dict[str, Any]:
        """What the dashboard shows: per name the watermark, what holds it, percentiles."""
        return self._call("GET", "/v1/status")

    def intervals(self, computation: str) -> dict[str, dict[str, Any]]:
        """The interval map of ``computation``, tokens included (needs the secret)."""
        return self._call("GET", "/v1/intervals", params={"computation": computation})["intervals"]

    def healthy(self) -> bool:
        """True if the service answers its health check (one attempt, no retries)."""
        try:
            return self._client.get("/healthz").status_code == 200
        except self._httpx.HTTPError:
            return False

    def close(self) -> None:
        self._client.close()

    # -- the transport
    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, str] | None = None,
        idempotent: bool = True,
    ) -> dict[str, Any]:
        httpx = self._httpx
        last = ""
        answered = 0  # attempts answered with a 5xx (the service is up, but failing)
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(2.0, self.backoff * 2 ** (attempt - 1)) * (0.5 + self._random.random() / 2)
                time.sleep(delay)
            try:
                response = self._client.request(method, path, json=body, params=params)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue  # the request never left: always safe to retry
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                if idempotent:
                    continue
                msg = (
                    f"{method} {path} to the watermark authority at {self.url} failed after it may "
                    f"have been received ({last}); not retried because repeating it is not harmless: "
                    "check the authority's state (GET /v1/status) before trying again"
                )
                raise AuthorityUnavailableError(msg) from exc
            status = response.status_code
            if status < 400:
                return response.json()
            if status < 500:
                raise self._error(response)
            answered += 1
            last = f"HTTP {status}: {self._message(response)}"
            if not idempotent:
                raise self._error(response)
        if answered:
            msg = (
                f"{method} {path}: the watermark authority at {self.url} is running but failed "
                f"{answered} of {self.retries + 1} attempts (last: {last}); see the service's log"
            )
        else:
            msg = (
                f"{method} {path}: the watermark authority at {self.url} is unreachable after "
                f"{self.retries + 1} attempts ({last}); is `millwheel authority serve` running there?"
            )
        raise AuthorityUnavailableError(msg)

    @staticmethod
    def _message(response: Any) -> str:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            return str(body["message"])[:500]
        return f"HTTP {response.status_code}: {describe(response.text, 200)}"

    def _error(self, response: Any) -> AuthorityError:
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        message = self._message(response)
        cls = ERRORS_BY_CODE.get(str(body.get("error", "")), AuthorityError)
        if response.status_code == 401:
            cls = AuthenticationError
            if self.secret is None:
                message += f" (this client sent no secret: pass secret=..., or set ${SECRET_ENV} or ${SECRET_FILE_ENV})"
            else:
                message += f" (this client sent the secret from {self.secret.source})"
        if cls is StaleTokenError:
            return StaleTokenError(message, [tuple(x) for x in body.get("intervals", [])])
        return cls(message)


# ---------------------------------------------------------------------------- embedded service


@dataclass
class EmbeddedAuthority:
    """A running authority service started by this process (see :func:`start_authority`)."""

    url: str
    process: subprocess.Popen[bytes]
    data_dir: str
    log_path: str
    #: the service's bearer secret, which :meth:`client` passes to its clients
    secret: Secret | None = None
    _clients: list[HttpWatermarkClient] = field(default_factory=list, repr=False)

    def client(self, **options: Any) -> HttpWatermarkClient:
        """A new HTTP client of this service, holding its secret (closed when the service is stopped)."""
        options.setdefault("secret", self.secret)
        c = HttpWatermarkClient(self.url, **options)
        self._clients.append(c)
        return c

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """kill -9: no shutdown of any kind (for crash tests)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self._close_clients()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM), or kill after ``timeout`` seconds."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._close_clients()

    def log(self) -> str:
        """The service's output so far."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _close_clients(self) -> None:
        for c in self._clients:
            c.close()
        self._clients.clear()


def start_authority(
    data_dir: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = 30.0,
    extra_args: Sequence[str] = (),
) -> EmbeddedAuthority:
    """Start ``python -m watermark_authority serve`` on ``data_dir`` and wait until it is healthy.

    ``port=0`` lets the service pick a free port and report it back. The service's secret
    is ``DATA_DIR/secret``, generated (mode 0600) on the first start and reused after; the
    returned handle holds it and gives it to its clients. The caller stops the service
    (:meth:`EmbeddedAuthority.stop`); prefer :func:`embedded_authority`, which does.
    """
    import httpx

    os.makedirs(data_dir, exist_ok=True)
    secret_file = os.path.join(data_dir, SECRET_FILE_NAME)
    secret = load_secret(default_file=secret_file, create=True)
    fd, ready_file = tempfile.mkstemp(prefix="authority-ready-", suffix=".url")
    os.close(fd)
    os.unlink(ready_file)
    log_path = os.path.join(data_dir, "authority.log")
    cmd = [
        sys.executable, "-m", "watermark_authority", "serve",
        "--host", host, "--port", str(port), "--data-dir", data_dir, "--ready-file", ready_file,
        "--secret-file", secret_file, *extra_args,
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    handle = EmbeddedAuthority("", process, data_dir, log_path, secret)
    deadline = time.monotonic() + startup_timeout
    try:
        while True:
            if process.poll() is not None:
                msg = f"the watermark authority exited with code {process.returncode} while starting:\n{handle.log()[-2000:]}"
                raise AuthorityUnavailableError(msg)
            if os.path.exists(ready_file):
                with open(ready_file, encoding="utf-8") as f:
                    url = f.read().strip()
                if url:
                    try:
                        if httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                            handle.url = url
                            return handle
                    except httpx.HTTPError:
                        pass
            if time.monotonic() > deadline:
                msg = f"the watermark authority did not become healthy within {startup_timeout}s:\n{handle.log()[-2000:]}"
                raise AuthorityUnavailableError(msg)
            time.sleep(0.02)
    except BaseException:
        handle.stop(timeout=2.0)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(ready_file)


@contextlib.contextmanager
def embedded_authority(data_dir: str | None = None, **options: Any) -> Iterator[EmbeddedAuthority]:
    """Run the real authority service for the duration of a ``with`` block (local runs).

    It listens on a free loopback port; ``data_dir=None`` journals to a temporary directory
    removed afterwards. Options go to :func:`start_authority`. Yields an
    :class:`EmbeddedAuthority` (``.url``, ``.secret``, ``.client()``)::

        with embedded_authority() as service:
            wm = service.client()                  # holds the service's secret
            token = wm.acquire("WindowCounter", "interval-0")
    """
    temporary = data_dir is None
    path = tempfile.mkdtemp(prefix="millwheel-authority-") if data_dir is None else data_dir
    try:
        service = start_authority(path, **options)
        try:
            yield service
        finally:
            service.stop()
    finally:
        if temporary:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def open_authority(
    url: str | None = None, *, data_dir: str | None = None, secret: str | Secret | None = None, **client_options: Any
) -> Iterator[WatermarkClient]:
    """A client for the runtime: of the service at ``url`` (or ``$MILLWHEEL_AUTHORITY_URL``)
    for cluster runs, else of an embedded service started for the ``with`` block.

    With a URL, the secret is ``secret``, else ``$MILLWHEEL_AUTHORITY_SECRET``, else the file
    named by ``$MILLWHEEL_AUTHORITY_SECRET_FILE``, else ``DATA_DIR/secret`` (the one an
    embedded authority on that data directory generated). The URL itself carries nothing secret.
    """
    url = url or os.environ.get(URL_ENV) or None
    if url:
        with HttpWatermarkClient(url, secret=client_secret(secret, data_dir=data_dir), **client_options) as client:
            yield client
        return
    with embedded_authority(data_dir) as service, service.client(**client_options) as client:
        yield client
