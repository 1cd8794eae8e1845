"""Photon's IdRegistry (SIGMOD 2013, §2): the set of event ids already joined, with conditional commits.

A joiner commits ``(event_id, token, event_time_ms)`` before it writes a joined event out:
the first token to commit an id holds it (``COMMITTED``), the same token again is
``COMMITTED`` again (a retry after a lost answer, a replayed micro-batch), any other token
gets ``CONFLICT`` with the holder, and an event before the garbage-collection boundary
gets ``TOO_OLD``. Commits arriving together are written as one durable write
(server-side batching, §2.2.1); ids are spread over shards by a time-based configuration
(§2.2.2); old entries are deleted behind a boundary that only moves forward (§2.3); too
much in flight is refused with 429 and ``Retry-After`` (§3.3.2); lookups and clears serve
verification and recovery (§3.3.3).

* :class:`Registry` — the logic, over a backend: :class:`RocksBackend` (embedded, fsync'd
  write batches), :class:`EtcdBackend` (replicated, Raft) or :class:`MemoryBackend`;
* :class:`InProcessRegistryClient`, :class:`HttpRegistryClient`, :func:`embedded_registry`,
  :func:`open_registry` — the clients (:class:`RegistryClient`);
* ``millwheel registry serve`` — the service (loopback, bearer secret, servicekit's guard).

The package imports nothing from ``millwheel``: it stands on :mod:`servicekit`. See
``docs/registry.md``.
"""

from id_registry._backend import Backend, MemoryBackend, RocksBackend
from id_registry._core import GcResult, Registry
from id_registry._errors import (
    AuthenticationError,
    BackendUnavailableError,
    GcBackwardsError,
    InvalidRequestError,
    RegistryError,
    RegistryUnavailableError,
    ReshardError,
    ThrottledError,
)
from id_registry._etcd import EtcdBackend
from id_registry._model import (
    ClearResult,
    CommitResult,
    LookupResult,
    ShardConfig,
    ShardMap,
    Status,
)
from id_registry._worker import RegistryWorker
from id_registry.client import (
    EmbeddedRegistry,
    HttpRegistryClient,
    InProcessRegistryClient,
    RegistryClient,
    embedded_registry,
    open_registry,
    start_registry,
)

__all__ = [
    "AuthenticationError",
    "Backend",
    "BackendUnavailableError",
    "ClearResult",
    "CommitResult",
    "EmbeddedRegistry",
    "EtcdBackend",
    "GcBackwardsError",
    "GcResult",
    "HttpRegistryClient",
    "InProcessRegistryClient",
    "InvalidRequestError",
    "LookupResult",
    "MemoryBackend",
    "Registry",
    "RegistryClient",
    "RegistryError",
    "RegistryUnavailableError",
    "RegistryWorker",
    "ReshardError",
    "RocksBackend",
    "ShardConfig",
    "ShardMap",
    "Status",
    "ThrottledError",
    "embedded_registry",
    "open_registry",
    "start_registry",
]
