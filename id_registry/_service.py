"""The registry service as its clients find it: its name, its environment, its secret.

:data:`SERVICE` is the registry as :mod:`servicekit` sees it (the name in messages, the
module and command that serve it, the environment variables naming a running one and its
secret); :func:`client_secret` finds the bearer secret a client sends (Photon's registry
is reached by every joiner, §2, and only holders of the secret may commit);
:func:`dashboard_link` gives the watermark authority's dashboard the registry's panel,
with the secret's read key only; an :class:`Outage` is what a patient client reports while
the service does not answer (a restart, a failover: Photon §3.3.2's retries, waited out).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from id_registry._errors import AuthenticationError
from servicekit import Secret
from servicekit import client as _client
from servicekit.service import ServiceInfo

#: the registry as servicekit sees it: its name, module and command, and the environment variables
#: naming a running one (cluster runs), holding its bearer secret, and naming a file that holds it
SERVICE = ServiceInfo(
    "id registry",
    "id_registry",
    "millwheel registry",
    url_env="MILLWHEEL_REGISTRY_URL",
    secret_env="MILLWHEEL_REGISTRY_SECRET",
    secret_file_env="MILLWHEEL_REGISTRY_SECRET_FILE",
)
#: the same as constants; ``SECRET_FILE_NAME``: the file in a data directory where a generated secret is kept
URL_ENV, SECRET_ENV, SECRET_FILE_ENV, SECRET_FILE_NAME = (
    SERVICE.url_env,
    SERVICE.secret_env,
    SERVICE.secret_file_env,
    SERVICE.secret_file_name,
)


def client_secret(
    secret: str | Secret | None = None, *, data_dir: str | None = None
) -> Secret | None:
    """``secret``, else ``$MILLWHEEL_REGISTRY_SECRET``, else the file named by
    ``$MILLWHEEL_REGISTRY_SECRET_FILE``, else ``DATA_DIR/secret`` if it exists, else ``None``."""
    return _client.client_secret(secret, SERVICE, data_dir=data_dir, error=AuthenticationError)


def dashboard_link(
    authority_url: str,
    registry_url: str,
    secret: str | Secret | None = None,
    *,
    data_dir: str | None = None,
) -> str:
    """The address of the watermark authority's dashboard with the panel of the registry at
    ``registry_url``: ``AUTHORITY/#registry=URL&registry_key=KEY``, where KEY is the read key of
    the registry's secret (found as :func:`client_secret` finds it): it reads ``/v1/stats`` and
    nothing else. :class:`AuthenticationError` if there is no secret.

    >>> dashboard_link("http://127.0.0.1:7300", "http://127.0.0.1:7310", "registry-secret-for-a-doctest")
    'http://127.0.0.1:7300/#registry=http://127.0.0.1:7310&registry_key=...'
    """
    found = client_secret(secret, data_dir=data_dir)
    if found is None:
        msg = f"the registry panel needs the read key of {SERVICE.the}'s secret; {SERVICE.secret_hint()}"
        raise AuthenticationError(msg)
    return _client.fragment_url(
        authority_url.rstrip("/") + "/",
        registry=registry_url.rstrip("/"),
        registry_key=found.read_key().reveal(),
    )


@dataclass(frozen=True)
class Outage:
    """A client waiting for the service (``HttpRegistryClient(patience=...)``): since when, how often it tried, the last error."""

    url: str
    #: wall time of the first failure (ms since the epoch)
    since_ms: int
    #: the same on this process's monotonic clock (seconds)
    started: float
    attempts: int
    last_error: str

    def since_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since_ms / 1000))

    def text(self) -> str:
        """``waiting on the id registry at URL since ... (N attempts; last: ...)``."""
        return f"waiting on {SERVICE.the} at {self.url} since {self.since_text()} ({self.attempts} attempts; last: {self.last_error})"
