"""pytest fixtures a service's tests share (import them in its ``conftest.py``).

    from servicekit.testing import anon, http  # noqa: F401 - fixtures

Both need a ``service`` fixture that yields a :class:`~servicekit.service.ServiceProcess`:

* ``http`` — raw HTTP to the service with its secret (``Authorization: Bearer ...``);
* ``anon`` — raw HTTP without the secret: what anyone on the network has.

:func:`start_serve` runs a service's ``serve`` command line and waits until it listens.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from servicekit.service import ServiceProcess


@pytest.fixture
def http(service: ServiceProcess) -> Iterator[Any]:
    """Raw HTTP to the session's service, with its secret (``Authorization: Bearer ...``)."""
    with service.http() as h:
        yield h


@pytest.fixture
def anon(service: ServiceProcess) -> Iterator[Any]:
    """Raw HTTP to the session's service without the secret: what anyone on the network has."""
    with service.http(with_secret=False) as h:
        yield h


def start_serve(
    command: Sequence[str],
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[subprocess.Popen[str], str]:
    """Run ``COMMAND --port 0 --data-dir TMP/d --ready-file TMP/url ARGS`` (a service's ``serve``
    command line, with ``env`` added to the environment) and wait until it writes its URL.
    Returns the process (its output piped) and the URL; fails the test with the output if
    the service exits or stays silent for ``timeout`` seconds."""
    ready = tmp_path / "url"
    cmd = [
        *command,
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "d"),
        "--ready-file",
        str(ready),
        *args,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the service did not start: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.05)
    return proc, ready.read_text()
