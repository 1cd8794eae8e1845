"""Exceptions of the IdRegistry, shared by the core, the server and the clients.

Every error derives from :class:`RegistryError`, itself a :class:`servicekit.ServiceError`
(the registry imports nothing from ``millwheel``)::

    ServiceError (servicekit)
    └── RegistryError                root of the registry's errors
        ├── InvalidRequestError      malformed or refused request: a missing field, a wrong type or value,
        │                            a body too large, a host or origin not allowed (HTTP 400, 403, 413, 415, 421)
        ├── AuthenticationError      no bearer secret, or the wrong one (HTTP 401)
        ├── GcBackwardsError         the garbage-collection boundary only moves forward (HTTP 409)
        ├── ReshardError             a shard configuration that would re-shard the past (HTTP 409)
        ├── ThrottledError           too much in flight: retry after ``retry_after_ms`` (HTTP 429)
        ├── BackendUnavailableError  the store behind the registry (etcd) did not answer (HTTP 503)
        └── RegistryUnavailableError the client could not reach the service, or it kept failing, even after retries

A conditional commit that loses (``CONFLICT``) or comes too late (``TOO_OLD``) is not an
error: it is a per-item result (:class:`id_registry.CommitResult`). Every error above means
the request changed nothing, except :class:`BackendUnavailableError` and
:class:`RegistryUnavailableError` after a commit was sent: it may or may not have been
applied, and sending it again with the same tokens is safe (that is what tokens are for).
The invalid-request, authentication and unavailable errors are also servicekit's
``BadRequestError``, ``UnauthorizedError`` and ``ServiceUnavailableError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servicekit import (
    BadRequestError,
    ErrorSet,
    ServiceError,
    ServiceUnavailableError,
    UnauthorizedError,
)


class RegistryError(ServiceError):
    """Root of the IdRegistry's errors."""

    code = "registry_error"
    status = 500


class InvalidRequestError(BadRequestError, RegistryError):
    """The request is malformed or refused; the message names the field and the fix. Nothing changed."""


class AuthenticationError(UnauthorizedError, RegistryError):
    """The service wants its bearer secret (every request but the status and the health check)."""


class GcBackwardsError(RegistryError):
    """``advance_gc`` was asked to move the boundary back: refused, nothing changed (Photon §2.3)."""

    code = "gc_backwards"
    status = 409

    def __init__(self, message: str, boundary_ms: int | None = None) -> None:
        super().__init__(message)
        self.boundary_ms = boundary_ms

    def extra(self) -> dict[str, Any]:
        return {"boundary_ms": self.boundary_ms}

    @classmethod
    def from_answer(cls, message: str, body: Mapping[str, Any]) -> GcBackwardsError:
        return cls(message, body.get("boundary_ms"))


class ReshardError(RegistryError):
    """A shard configuration that would move ids already decided (Photon §2.2.2): refused."""

    code = "reshard_refused"
    status = 409


class ThrottledError(RegistryError):
    """Too many requests or items in flight (Photon §3.3.2): nothing was done; retry later."""

    code = "throttled"
    status = 429

    def __init__(self, message: str, retry_after_ms: int = 100) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms

    def extra(self) -> dict[str, Any]:
        return {"retry_after_ms": self.retry_after_ms}

    @classmethod
    def from_answer(cls, message: str, body: Mapping[str, Any]) -> ThrottledError:
        return cls(message, int(body.get("retry_after_ms") or 0))


class BackendUnavailableError(RegistryError):
    """The store behind the registry did not answer in time; a commit may or may not be applied."""

    code = "backend_unavailable"
    status = 503


class RegistryUnavailableError(ServiceUnavailableError, RegistryError):
    """The HTTP client could not reach the registry, or it kept answering 5xx, even after its retries."""


#: the registry's errors, for its HTTP client (servicekit's refusals are invalid requests)
ERRORS = ErrorSet(
    RegistryError,
    InvalidRequestError,
    AuthenticationError,
    RegistryUnavailableError,
    (GcBackwardsError, ReshardError, ThrottledError, BackendUnavailableError),
)
#: error code -> class
ERRORS_BY_CODE = ERRORS.by_code()
