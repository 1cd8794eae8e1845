"""The errors of servicekit; every service's own errors derive from :class:`ServiceError`.

::

    ServiceError                    root: a ``code`` for machines, an HTTP ``status``, a message for people
    ├── BadRequestError             400 invalid_request: malformed JSON, a missing field, a bad value
    ├── UnauthorizedError           401 unauthorized: no bearer secret, or the wrong one
    ├── ForbiddenError              403 forbidden: a cross-site request (Origin, Sec-Fetch-Site)
    ├── PayloadTooLargeError        413 payload_too_large: the body is over the service's limit
    ├── UnsupportedMediaTypeError   415 unsupported_media_type: a body that is not JSON
    ├── MisdirectedRequestError     421 misdirected_request: a Host the service does not serve
    └── ConfigurationError          the service cannot start as configured (a bad secret file, ...)

A service answers an error with ``{"error": code, "message": text}`` (and whatever
:meth:`ServiceError.extra` adds) and the error's status; see :func:`servicekit.http.error_response`.
Messages never echo large inputs: build them with :func:`servicekit.describe`.
"""

from __future__ import annotations

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


class ConfigurationError(ServiceError):
    """The service cannot run as configured; raised at start-up, never sent to a client."""

    code = "configuration"
    status = 500
