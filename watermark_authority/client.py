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
import os
import socket
import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from servicekit import Secret, service
from servicekit import client as _client
from servicekit.service import ServiceInfo, ServiceProcess
from watermark_authority._core import Authority, Report
from watermark_authority._errors import ERRORS, AuthenticationError, AuthorityUnavailableError

#: the authority as servicekit sees it: its name, module and command, and the environment variables
#: naming a running one (cluster runs), holding its bearer secret, and naming a file that holds it
SERVICE = ServiceInfo(
    "watermark authority",
    "watermark_authority",
    "millwheel authority",
    url_env="MILLWHEEL_AUTHORITY_URL",
    secret_env="MILLWHEEL_AUTHORITY_SECRET",
    secret_file_env="MILLWHEEL_AUTHORITY_SECRET_FILE",
)
#: the same as constants; ``SECRET_FILE_NAME``: the file in a data directory where a generated secret is kept
URL_ENV, SECRET_ENV, SECRET_FILE_ENV, SECRET_FILE_NAME = (
    SERVICE.url_env,
    SERVICE.secret_env,
    SERVICE.secret_file_env,
    SERVICE.secret_file_name,
)


def default_owner() -> str:
    """How this process names itself to the authority: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def client_secret(
    secret: str | Secret | None = None, *, data_dir: str | None = None
) -> Secret | None:
    """The secret a client sends: ``secret``, else ``$MILLWHEEL_AUTHORITY_SECRET``, else the
    file named by ``$MILLWHEEL_AUTHORITY_SECRET_FILE``, else ``DATA_DIR/secret`` if it
    exists; ``None`` if there is none (reads still work)."""
    return _client.client_secret(secret, SERVICE, data_dir=data_dir, error=AuthenticationError)


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
    def report(
        self,
        computation: str,
        interval: str,
        token: int,
        oldest_work: int,
        pending: int | None = None,
    ) -> None:
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

    def note(self, computation: str, text: str) -> None:
        """A note about ``computation`` for the dashboard (why its key intervals were
        split or merged); a client that cannot send one drops it."""
        return None

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

    def note(self, computation: str, text: str) -> None:
        with self._lock:
            self.authority.note(computation, text)

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


class HttpWatermarkClient(_client.JsonHttpClient, WatermarkClient):
    """The authority service over HTTP/JSON (see ``docs/authority.md`` for the API), on
    :class:`servicekit.client.JsonHttpClient`.

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

    info = SERVICE
    errors = ERRORS
    not_retried_hint = "check the authority's state (GET /v1/status) before trying again"

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
        super().__init__(
            url,
            secret=secret,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            transport=transport,
        )
        self.owner = owner or default_owner()

    # -- the interface
    def acquire_many(self, computation: str, intervals: Sequence[str]) -> dict[str, int]:
        body = {"computation": computation, "intervals": list(intervals), "owner": self.owner}
        out = self._call("POST", "/v1/acquire", body)
        return {k: int(v) for k, v in out["tokens"].items()}

    def check_token(self, computation: str, interval: str, token: int) -> None:
        self._call(
            "POST",
            "/v1/token/check",
            {"computation": computation, "interval": interval, "token": token},
        )

    def report_batch(self, computation: str, reports: Iterable[ReportLike]) -> None:
        batch = [list(r) for r in _normalize(reports)]
        self._call("POST", "/v1/report", {"computation": computation, "reports": batch})

    def split(self, computation: str, interval: str, into: Sequence[str]) -> dict[str, int]:
        body = {
            "computation": computation,
            "interval": interval,
            "into": list(into),
            "owner": self.owner,
        }
        return {
            k: int(v)
            for k, v in self._call("POST", "/v1/split", body, idempotent=False)["tokens"].items()
        }

    def merge(self, computation: str, intervals: Sequence[str], into: str) -> int:
        body = {
            "computation": computation,
            "intervals": list(intervals),
            "into": into,
            "owner": self.owner,
        }
        return int(self._call("POST", "/v1/merge", body, idempotent=False)["token"])

    def note(self, computation: str, text: str) -> None:
        self._call("POST", "/v1/note", {"computation": computation, "text": text})

    def expect_injector_processes(self, injector: str, processes: Sequence[str]) -> None:
        self._call(
            "POST", "/v1/injectors/expect", {"injector": injector, "processes": list(processes)}
        )

    def report_injector(self, injector: str, process: str, low_watermark: int) -> None:
        body = {"injector": injector, "process": process, "low_watermark": low_watermark}
        self._call("POST", "/v1/injectors/report", body)

    def watermark(self, computation_or_injector: str) -> int:
        return int(
            self._call("GET", "/v1/watermark", params={"name": computation_or_injector})[
                "low_watermark"
            ]
        )

    def watermarks(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._call("GET", "/v1/watermarks")["watermarks"].items()}

    def percentile_watermark(self, name: str, pct: float) -> int:
        return int(
            self._call("GET", "/v1/watermark", params={"name": name, "pct": str(pct)})["watermark"]
        )

    # -- extras over HTTP only
    def status(self) -> dict[str, Any]:
        """What the dashboard shows: per name the watermark, what holds it, percentiles."""
        return self._call("GET", "/v1/status")

    def intervals(self, computation: str) -> dict[str, dict[str, Any]]:
        """The interval map of ``computation``, tokens included (needs the secret)."""
        return self._call("GET", "/v1/intervals", params={"computation": computation})["intervals"]


# ---------------------------------------------------------------------------- embedded service


class EmbeddedAuthority(ServiceProcess):
    """A running authority service started by this process (see :func:`start_authority`):
    ``.url``, ``.secret`` (which :meth:`client` passes to its clients), ``.pid``, ``.kill()``
    (kill -9), ``.stop()``, ``.log()``."""

    def client(self, **options: Any) -> HttpWatermarkClient:
        """A new HTTP client of this service, holding its secret (closed when the service is stopped)."""
        return self._client(HttpWatermarkClient, **options)


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
    returned handle holds it and gives it to its clients. Its output goes to
    ``DATA_DIR/authority.log``. The caller stops the service
    (:meth:`EmbeddedAuthority.stop`); prefer :func:`embedded_authority`, which does.
    """
    return EmbeddedAuthority.start(
        SERVICE,
        data_dir,
        log_name="authority.log",
        host=host,
        port=port,
        startup_timeout=startup_timeout,
        extra_args=extra_args,
        unavailable=AuthorityUnavailableError,
    )


def embedded_authority(
    data_dir: str | None = None, **options: Any
) -> AbstractContextManager[EmbeddedAuthority]:
    """Run the real authority service for the duration of a ``with`` block (local runs).

    It listens on a free loopback port; ``data_dir=None`` journals to a temporary directory
    removed afterwards. Options go to :func:`start_authority`. Yields an
    :class:`EmbeddedAuthority` (``.url``, ``.secret``, ``.client()``)::

        with embedded_authority() as service:
            wm = service.client()                  # holds the service's secret
            token = wm.acquire("WindowCounter", "interval-0")
    """
    return service.running(
        lambda path: start_authority(path, **options), data_dir, temp_prefix="millwheel-authority-"
    )


def open_authority(
    url: str | None = None,
    *,
    data_dir: str | None = None,
    secret: str | Secret | None = None,
    **client_options: Any,
) -> AbstractContextManager[WatermarkClient]:
    """A client for the runtime: of the service at ``url`` (or ``$MILLWHEEL_AUTHORITY_URL``)
    for cluster runs, else of an embedded service started for the ``with`` block.

    With a URL, the secret is ``secret``, else ``$MILLWHEEL_AUTHORITY_SECRET``, else the file
    named by ``$MILLWHEEL_AUTHORITY_SECRET_FILE``, else ``DATA_DIR/secret`` (the one an
    embedded authority on that data directory generated). The URL itself carries nothing secret.
    """
    return _client.open_client(
        HttpWatermarkClient,
        url,
        embed=embedded_authority,
        data_dir=data_dir,
        secret=secret,
        **client_options,
    )
