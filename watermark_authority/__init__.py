"""The central low-watermark authority (MillWheel §7.2), its client and its dashboard.

A separate process, started with ``millwheel authority serve``, that keeps per computation
an interval map of the oldest pending work reported by the owners of its key intervals,
fences zombie owners with sequencer tokens (§6.2), aggregates injector low watermarks
(§5.2), journals everything to RocksDB, and publishes low watermarks that never go back.
Workers and the harness talk to it through a :class:`WatermarkClient`:

* :class:`HttpWatermarkClient` — the service over HTTP/JSON, with retries and timeouts;
* :class:`InProcessWatermarkClient` — the same core in this process, for tests;
* :func:`embedded_authority` — start the real service on a free loopback port;
* :func:`open_authority` — a URL if one is given (cluster), else an embedded service (local).

See ``docs/authority.md`` for the HTTP API, the percentile definition and the dashboard.
"""

from watermark_authority._core import Authority, weighted_percentile
from watermark_authority._errors import (
    AuthorityError,
    AuthorityUnavailableError,
    ConflictError,
    InvalidRequestError,
    StaleTokenError,
    UnknownNameError,
)
from watermark_authority._journal import MemoryJournal, RocksJournal
from watermark_authority.client import (
    EmbeddedAuthority,
    HttpWatermarkClient,
    InProcessWatermarkClient,
    WatermarkClient,
    embedded_authority,
    open_authority,
)

__all__ = [
    "Authority",
    "AuthorityError",
    "AuthorityUnavailableError",
    "ConflictError",
    "EmbeddedAuthority",
    "HttpWatermarkClient",
    "InProcessWatermarkClient",
    "InvalidRequestError",
    "MemoryJournal",
    "RocksJournal",
    "StaleTokenError",
    "UnknownNameError",
    "WatermarkClient",
    "embedded_authority",
    "open_authority",
    "weighted_percentile",
]
