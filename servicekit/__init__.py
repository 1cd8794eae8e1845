"""servicekit: the locked-down base layer of millwheel's services (the watermark authority,
and every later one such as Photon's IdRegistry).

Plain Python, importable anywhere (no web framework):

* :mod:`servicekit.errors` — :class:`ServiceError` and one subclass per refusal, each with
  its HTTP status and a machine-readable code;
* :mod:`servicekit.checks` — bounded JSON (:func:`parse_json`: depth, no NaN), required
  and unexpected fields (:func:`check_fields`), int64 and finite-number checks
  (:func:`check_int`, :func:`check_number`, :func:`parse_number`), and
  :func:`describe` / :func:`truncate` so that no message echoes a large input;
* :mod:`servicekit.secret` — the bearer :class:`Secret` (constant-time compare, never
  printed), :func:`load_secret` from a flag, an environment variable or a default file
  created with mode 0600.

The Starlette side is :mod:`servicekit.http` (import it in servers only):
:class:`~servicekit.http.Guard` and :class:`~servicekit.http.GuardMiddleware` check
``Host`` (DNS rebinding), ``Origin`` / ``Sec-Fetch-Site`` (cross-site requests), the
bearer secret on every mutation and on private reads (the secret or its read key on *keyed
reads*, the one route kind pages of loopback origins may read), and the body size before
reading it; :func:`~servicekit.http.json_endpoint` answers every error as JSON with its status;
:meth:`Guard.for_bind <servicekit.http.Guard.for_bind>` builds a service's guard from its flags.

What every service does around its app is shared too (import each where it is used):

* :mod:`servicekit.service` — bind a port, load the server's secret, run the app on uvicorn
  with a ready file, and :class:`~servicekit.service.ServiceProcess`: a service run as a
  subprocess (embedded use, tests);
* :mod:`servicekit.client` — :func:`~servicekit.client.client_secret` and
  :class:`~servicekit.client.JsonHttpClient`, the base of each service's HTTP client
  (retries with backoff, 429s, the service's own error classes, health check, close);
* :mod:`servicekit.cli` — the flags of ``serve`` every service takes, and their checks;
* :mod:`servicekit.ports` — distinct free ports on loopback, for services and test
  clusters started on this machine.

servicekit imports nothing from millwheel or from any service built on it.
"""

from servicekit.checks import (
    INT64_MAX,
    INT64_MIN,
    check_fields,
    check_int,
    check_number,
    describe,
    parse_json,
    parse_number,
    truncate,
)
from servicekit.errors import (
    BadRequestError,
    ConfigurationError,
    ErrorSet,
    ForbiddenError,
    MisdirectedRequestError,
    PayloadTooLargeError,
    ServiceError,
    ServiceUnavailableError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)
from servicekit.secret import (
    Secret,
    generate_secret,
    load_secret,
    read_secret_file,
    write_secret_file,
)

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "BadRequestError",
    "ConfigurationError",
    "ErrorSet",
    "ForbiddenError",
    "MisdirectedRequestError",
    "PayloadTooLargeError",
    "Secret",
    "ServiceError",
    "ServiceUnavailableError",
    "UnauthorizedError",
    "UnsupportedMediaTypeError",
    "check_fields",
    "check_int",
    "check_number",
    "describe",
    "generate_secret",
    "load_secret",
    "parse_json",
    "parse_number",
    "read_secret_file",
    "truncate",
    "write_secret_file",
]
