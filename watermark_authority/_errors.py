"""Exceptions of the low-watermark authority, shared by the core, the server and the clients.

Every error derives from :class:`AuthorityError`, itself a :class:`servicekit.ServiceError`
(the base layer of millwheel's services; the authority imports nothing from ``millwheel``)::

    ServiceError (servicekit)
    └── AuthorityError              root of the authority's errors
        ├── InvalidRequestError     malformed or refused request: a missing field, a wrong type or value,
        │                           a body too large, a host or origin not allowed (HTTP 400, 403, 413, 415, 421)
        ├── AuthenticationError     no bearer secret, or the wrong one (HTTP 401)
        ├── UnknownNameError        no such computation, interval or injector (HTTP 404)
        ├── StaleTokenError         the sequencer token was invalidated by a newer owner (HTTP 409)
        ├── ConflictError           the request contradicts the authority's state (HTTP 409)
        └── AuthorityUnavailableError   the client could not reach the service, or it kept failing, even after retries

The server answers each 4xx with ``{"error": CODE, "message": TEXT}``; the HTTP client turns
``CODE`` back into the same class, so in-process and HTTP callers catch the same errors.
In every case the request changed nothing. The invalid-request, authentication and
unavailable errors are also servicekit's ``BadRequestError``, ``UnauthorizedError`` and
``ServiceUnavailableError`` (whose codes and statuses they take).
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


class AuthorityError(ServiceError):
    """Root of the watermark authority's errors."""

    #: the machine-readable code the server sends with the error
    code = "authority_error"
    #: the HTTP status the server answers with
    status = 500


class InvalidRequestError(BadRequestError, AuthorityError):
    """The request is malformed or refused; the message names the field and the fix. Nothing changed."""


class AuthenticationError(UnauthorizedError, AuthorityError):
    """The service wants its bearer secret for this request (every mutation, and reads that
    reveal sequencer tokens) and did not get it. Nothing changed."""


class UnknownNameError(AuthorityError):
    """No computation, interval or injector of that name is known. Nothing changed."""

    code = "unknown_name"
    status = 404


class StaleTokenError(AuthorityError):
    """A report or write carried a sequencer token that a newer acquire invalidated (§6.2, §7.2).

    The caller is a zombie for that interval: it must stop writing for it. Nothing changed.
    ``intervals`` lists the ``(computation, interval)`` pairs whose tokens were stale.
    """

    code = "stale_token"
    status = 409

    def __init__(self, message: str, intervals: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.intervals = list(intervals or [])

    def extra(self) -> dict[str, Any]:
        return {"intervals": [list(x) for x in self.intervals]}

    @classmethod
    def from_answer(cls, message: str, body: Mapping[str, Any]) -> StaleTokenError:
        return cls(message, [tuple(x) for x in body.get("intervals", [])])


class ConflictError(AuthorityError):
    """The request contradicts the authority's state (e.g. a name in use as another kind)."""

    code = "conflict"
    status = 409


class AuthorityUnavailableError(ServiceUnavailableError, AuthorityError):
    """The HTTP client could not reach the authority, or it kept answering 5xx, even after its retries."""


#: the authority's errors, for its HTTP client (servicekit's refusals are invalid requests)
ERRORS = ErrorSet(
    AuthorityError,
    InvalidRequestError,
    AuthenticationError,
    AuthorityUnavailableError,
    (UnknownNameError, StaleTokenError, ConflictError),
)
#: error code -> class
ERRORS_BY_CODE = ERRORS.by_code()
