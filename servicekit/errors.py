"""The errors of servicekit; every service's own errors derive from :class:`ServiceError`.

::

    ServiceError                    root: a ``code`` for machines, an HTTP ``status``, a message for people
    ├── BadRequestError             400 invalid_request: malformed JSON, a missing field, a bad value
    ├── UnauthorizedError           401 unauthorized: no bearer secret, or the wrong one
    ├── ForbiddenError              403 forbidden: a cross-site request (Origin, Sec-Fetch-Site)
    ├── PayloadTooLargeError        413 payload_too_large: the body is over the service's limit
    ├── UnsupportedMediaTypeError   415 unsupported_media_type: a body that is not JSON
    ├── MisdirectedRequestError     421 misdirected_request: a Host the service does not serve
    ├── ServiceUnavailableError     503 unavailable: a client could not reach the service, even after retries
    └── ConfigurationError          the service cannot start as configured (a bad secret file, ...)

A service answers an error with ``{"error": code, "message": text}`` (and whatever
:meth:`ServiceError.extra` adds) and the error's status; see :func:`servicekit.http.error_response`.
Messages never echo large inputs: build them with :func:`servicekit.describe`.
A client turns the answer back into the same class (:meth:`ServiceError.from_answer`,
:class:`ErrorSet`), so in-process and HTTP callers catch the same errors.

A service's errors derive from its own root, and from the servicekit class of the same
meaning where there is one (``class InvalidRequestError(BadRequestError, MyServiceError)``),
which gives them its code and status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ServiceError(Exception):
    """Root of the errors a service answers with; subclasses set ``code`` and ``status``."""

    #: the machine-readable code sent as ``"error"``
    code = "service_error"
    #: the HTTP status the error is answered with
    status = 500

    def extra(self) -> dict[str, Any]:
        """More JSON fields for the error body (none by default)."""
        return {}

    @classmethod
    def from_answer(cls, message: str, body: Mapping[str, Any]) -> ServiceError:
        """The error a client raises for an answer of this class: the inverse of :meth:`extra`."""
        return cls(message)


class BadRequestError(ServiceError):
    """The request is malformed; the message names what is wrong and how to fix it."""

    code = "invalid_request"
    status = 400


class UnauthorizedError(ServiceError):
    """The request needs the service's bearer secret and did not carry it (or a wrong one)."""

    code = "unauthorized"
    status = 401


class ForbiddenError(ServiceError):
    """The request came from another site (a browser page elsewhere): refused."""

    code = "forbidden"
    status = 403


class PayloadTooLargeError(ServiceError):
    """The request body is larger than the service accepts."""

    code = "payload_too_large"
    status = 413


class UnsupportedMediaTypeError(ServiceError):
    """The request body is not declared as JSON (``Content-Type: application/json``)."""

    code = "unsupported_media_type"
    status = 415


class MisdirectedRequestError(ServiceError):
    """The request named a ``Host`` this service does not answer for (e.g. DNS rebinding)."""

    code = "misdirected_request"
    status = 421


class ServiceUnavailableError(ServiceError):
    """A client could not reach the service, or it kept answering 5xx, even after its retries."""

    code = "unavailable"
    status = 503


class ConfigurationError(ServiceError):
    """The service cannot run as configured; raised at start-up, never sent to a client."""

    code = "configuration"
    status = 500


@dataclass(frozen=True)
class ErrorSet:
    """A service's error classes, as its HTTP client maps answers back to them.

    ``root`` for an unknown code; ``invalid``, ``authentication``, ``unavailable`` for the
    meanings every service has; ``others`` the service's own. servicekit's refusals (403,
    413, 415, 421: the guard's answers) map to ``invalid``.

    >>> errors = ErrorSet(ServiceError, BadRequestError, UnauthorizedError, ServiceUnavailableError)
    >>> {code: cls.__name__ for code, cls in sorted(errors.by_code().items())}  # doctest: +NORMALIZE_WHITESPACE
    {'forbidden': 'BadRequestError', 'invalid_request': 'BadRequestError', 'misdirected_request': 'BadRequestError',
     'payload_too_large': 'BadRequestError', 'unauthorized': 'UnauthorizedError', 'unavailable': 'ServiceUnavailableError',
     'unsupported_media_type': 'BadRequestError'}
    """

    root: type[ServiceError]
    invalid: type[ServiceError]
    authentication: type[ServiceError]
    unavailable: type[ServiceError]
    others: tuple[type[ServiceError], ...] = ()

    def by_code(self) -> dict[str, type[ServiceError]]:
        """Error code -> class."""
        out: dict[str, type[ServiceError]] = {
            cls.code: cls
            for cls in (self.invalid, self.authentication, self.unavailable, *self.others)
        }
        for refusal in (
            ForbiddenError,
            PayloadTooLargeError,
            UnsupportedMediaTypeError,
            MisdirectedRequestError,
        ):
            out.setdefault(refusal.code, self.invalid)
        return out
