"""What a run is waiting on: a dependency that is out (the IdRegistry, a sink's database), and since when.

A call to a dependency that fails because the dependency is down is not an error of the
run: it is sent again, with capped exponential backoff and jitter, for a configurable
time (``docs/reliability.md``, "Outages of a dependency"). Meanwhile the process that
waits — a Spark worker whose registry commit is retried inside its batch, the driver's
sink writer — says so on a *wait board*: one small JSON file per dependency and process in
the run directory's ``waits/``, written on each failed attempt and removed once the
dependency answers. The driver's live status reads the board (:func:`read_waits`) and
shows each wait on the rows of the computations. An entry not refreshed for
:data:`STALE_MS` is left by a process that died, and ignored. The board is a local
directory: workers on other machines than the driver report on it only through a shared
file system (their waits are not shown otherwise; they wait all the same).

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> board = WaitBoard(d)
>>> board.waiting("the id registry at http://127.0.0.1:7310", since_ms=1_700_000_000_000, attempts=3, last_error="ConnectError")
>>> [w.text() for w in read_waits(d, now_ms=1_700_000_001_000)]
['waiting on the id registry at http://127.0.0.1:7310 since 2023-11-14 22:13:20 UTC (3 attempts; last: ConnectError)']
>>> board.done("the id registry at http://127.0.0.1:7310")
>>> read_waits(d)
[]
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import xxhash

#: the wait board's directory in a run directory
WAITS = "waits"
#: a wait not refreshed for this long is from a process that died (writers refresh on every attempt)
STALE_MS = 120_000


@dataclass(frozen=True, slots=True)
class Wait:
    """One process waiting on one dependency."""

    dependency: str
    #: wall time of the first failure (ms since the epoch)
    since_ms: int
    attempts: int
    last_error: str
    #: when the entry was last written (ms since the epoch)
    updated_ms: int
    #: ``host:pid`` of the process that waits
    who: str = ""

    def text(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since_ms / 1000))
        return f"waiting on {self.dependency} since {since} ({self.attempts} attempts; last: {self.last_error})"


class WaitBoard:
    """Where one process writes its waits (``directory``: a run directory's ``waits/``, or any directory)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.who = f"{socket.gethostname()}:{os.getpid()}"

    def _path(self, dependency: str) -> Path:
        tag = xxhash.xxh3_64_hexdigest(f"{dependency}\x00{self.who}".encode())
        return self.directory / f"{tag}.json"

    def waiting(self, dependency: str, *, since_ms: int, attempts: int, last_error: str) -> None:
        """Say this process waits on ``dependency`` (best effort: a board that cannot be written is no reason to stop)."""
        entry = Wait(
            dependency, since_ms, attempts, last_error[:300], int(time.time() * 1000), self.who
        )
        path = self._path(dependency)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(asdict(entry)), encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            pass

    def done(self, dependency: str) -> None:
        """The dependency answered again."""
        with contextlib.suppress(OSError):
            self._path(dependency).unlink()


def read_waits(directory: str | os.PathLike[str], *, now_ms: int | None = None) -> list[Wait]:
    """The waits on the board in ``directory`` (oldest first), without stale ones."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    out: list[Wait] = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            entry = Wait(**json.loads(Path(directory, name).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            continue  # written or removed meanwhile
        if now - entry.updated_ms <= STALE_MS:
            out.append(entry)
    return sorted(out, key=lambda w: w.since_ms)
