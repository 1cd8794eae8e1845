"""The IdRegistry (Photon §2) as the backends and verification use it.

The backends commit ``once_id`` productions through anything with
``commit_many(items) -> [OnceResult]`` (``millwheel/_once.py``); the ``id_registry``
service's clients answer :class:`id_registry.CommitResult` tuples (status and holder).
:class:`OnceRegistryAdapter` is the small translation, and passes ``lookup_many`` and
``clear_many`` (verification, §3.3.3) through. :class:`RegistryFactory` is the picklable
zero-argument factory that ``RuntimeSettings(registry=...)`` ships to Spark's workers:
each Python worker opens its own HTTP client, with the secret read from a file (never
pickled).

>>> from id_registry import InProcessRegistryClient
>>> with InProcessRegistryClient() as client:
...     reg = OnceRegistryAdapter(client)
...     reg.commit_many([("c1", "dc1", 10), ("c1", "dc2", 10)])
[<OnceResult.COMMITTED: 'committed'>, <OnceResult.CONFLICT: 'conflict'>]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from millwheel.once import OnceResult

__all__ = ["OnceRegistryAdapter", "RegistryFactory", "open_client", "registry_secret"]


class OnceRegistryAdapter:
    """An ``id_registry`` client seen as the backends' once-registry (see the module docstring)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def commit_many(self, items: Sequence[tuple[str, str, int]]) -> list[OnceResult]:
        return [OnceResult(r.status.value) for r in self.client.commit_many(list(items))]

    def lookup_many(self, ids: Sequence[str]) -> list[Any]:
        return list(self.client.lookup_many(list(ids)))

    def holders(self, ids: Sequence[str]) -> list[str | None]:
        """The token holding each id (``None``: not registered, or its token cleared): the roster's reads."""
        return [
            r.token if getattr(r.status, "value", r.status) == "found" else None
            for r in self.lookup_many(ids)
        ]

    def clear_many(self, ids: Sequence[str], **options: Any) -> list[Any]:
        return list(self.client.clear_many(list(ids), **options))

    def close(self) -> None:
        self.client.close()


def registry_secret(secret_file: str | None = None) -> Any:
    """The registry's secret (a :class:`servicekit.Secret`, or ``None``): from ``secret_file``,
    else as :func:`id_registry.client.client_secret` finds it (environment, files)."""
    from id_registry.client import client_secret
    from servicekit import load_secret

    return load_secret(file=secret_file) if secret_file else client_secret()


#: how long a pipeline waits for its registry to come back (a restart, a failover) before it stops
PATIENCE_S = 600.0


def open_client(
    url: str, secret_file: str | None = None, *, patience_s: float = 0.0, waits: str | None = None
) -> Any:
    """An HTTP client of the registry service at ``url``, with :func:`registry_secret`.

    ``patience_s``: how long its calls keep waiting while the service is out (capped
    exponential backoff with jitter, ``HttpRegistryClient(patience=...)``); ``waits``: the
    wait board it reports the outage on (a run directory's ``waits/``, ``millwheel/_waits.py``).
    """
    from id_registry import HttpRegistryClient

    on_wait = None
    if waits is not None:
        from millwheel.waits import WaitBoard

        board, what = WaitBoard(waits), f"the id registry at {url}"

        def on_wait(outage: Any) -> None:
            if outage is None:
                board.done(what)
            else:
                board.waiting(
                    what,
                    since_ms=outage.since_ms,
                    attempts=outage.attempts,
                    last_error=outage.last_error,
                )

    return HttpRegistryClient(
        url,
        secret=registry_secret(secret_file),
        patience=patience_s,
        max_backoff=min(10.0, max(0.5, patience_s / 20)),
        on_wait=on_wait,
    )


@dataclass(frozen=True)
class RegistryFactory:
    """``RuntimeSettings(registry=RegistryFactory(url, secret_file))``: one client per Python worker.

    Its calls ride out an outage of the service (a restart, a failover) for ``patience_s``
    seconds — inside the micro-batch, before Spark's failure accounting sees anything — and
    say so on the wait board ``waits`` (the run directory's ``waits/``), which the live
    status shows; beyond that the call fails naming the registry and the run stops.
    """

    url: str
    secret_file: str | None = None
    patience_s: float = PATIENCE_S
    waits: str | None = None

    def __call__(self) -> OnceRegistryAdapter:
        secret = self.secret_file and os.fspath(self.secret_file)
        return OnceRegistryAdapter(
            open_client(self.url, secret, patience_s=self.patience_s, waits=self.waits)
        )
