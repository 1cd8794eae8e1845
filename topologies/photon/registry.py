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
        return [r.token if getattr(r.status, "value", r.status) == "found" else None for r in self.lookup_many(ids)]

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


def open_client(url: str, secret_file: str | None = None) -> Any:
    """An HTTP client of the registry service at ``url``, with :func:`registry_secret`."""
    from id_registry import HttpRegistryClient

    return HttpRegistryClient(url, secret=registry_secret(secret_file))


@dataclass(frozen=True)
class RegistryFactory:
    """``RuntimeSettings(registry=RegistryFactory(url, secret_file))``: one client per Python worker."""

    url: str
    secret_file: str | None = None

    def __call__(self) -> OnceRegistryAdapter:
        return OnceRegistryAdapter(open_client(self.url, self.secret_file and os.fspath(self.secret_file)))
