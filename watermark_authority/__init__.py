"""The central low-watermark authority (MillWheel §7.2), its client and its dashboard.

A separate process, started with ``millwheel authority serve``, that keeps per computation
an interval map of the oldest pending work reported by the owners of its key intervals,
fences zombie owners with sequencer tokens (§6.2), aggregates injector low watermarks
(§5.2), journals everything to RocksDB, and publishes low watermarks that never go back.
Every mutation needs the service's bearer secret (see ``docs/authority.md``). Workers and
the harness talk to it through a :class:`WatermarkClient`:

* :class:`HttpWatermarkClient` — the service over HTTP/JSON, with retries and timeouts;
* :class:`InProcessWatermarkClient` — the same core in this process, for tests;
* :func:`embedded_authority` — start the real service on a free loopback port;
* :func:`open_authority` — a URL if one is given (cluster), else an embedded service (local).

The package imports nothing from ``millwheel`` (the user API): the service stands alone,
on :mod:`servicekit`. See ``docs/authority.md`` for the HTTP API, the threat model, the
percentile definition and the dashboard.
"""

from watermark_authority._core import Authority, weighted_percentile
from watermark_authority._errors import (
    AuthenticationError,
    AuthorityError,
    AuthorityUnavailableError,
    ConflictError,
    InvalidRequestError,
    StaleTokenError,
    UnknownNameError,
)
from watermark_authority._journal import MemoryJournal, RocksJournal, WatermarkPublished
from watermark_authority._time import MAX_TIMESTAMP, MIN_TIMESTAMP
from watermark_authority.client import (
    EmbeddedAuthority,
    HttpWatermarkClient,
    InProcessWatermarkClient,
    WatermarkClient,
    embedded_authority,
    open_authority,
)

__all__ = [
    "AuthenticationError",
    "Authority",
    "AuthorityError",
    "AuthorityUnavailableError",
    "ConflictError",
    "EmbeddedAuthority",
    "HttpWatermarkClient",
    "InProcessWatermarkClient",
    "InvalidRequestError",
    "MAX_TIMESTAMP",
    "MIN_TIMESTAMP",
    "MemoryJournal",
    "RocksJournal",
    "StaleTokenError",
    "UnknownNameError",
    "WatermarkClient",
    "WatermarkPublished",
    "embedded_authority",
    "open_authority",
    "weighted_percentile",
]
