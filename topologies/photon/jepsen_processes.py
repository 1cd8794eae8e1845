"""The processes the Jepsen-style check drives (``jepsen.py``): what it kills, restarts and ships.

* :class:`CheckRegistry` — the real IdRegistry service (Photon §2), killable with -9 and
  restarted on its store and port (an outage of the registry, §3.3.2: the pipelines wait);
* :class:`PipelineProcess` — one pipeline's driver (``millwheel photon run --backend
  spark``) in a process group of its own: started (with a crash point, or not), killed with
  -9 with everything it started, stopped cleanly, asked whether it drained;
* :func:`ship` — a log file appearing in a log directory whole, as a log shipper delivers it
  (Photon §3.4: the joiner reads files as they appear);
* :func:`run_verify` — ``photon verify`` of some runs against the check's registry.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from .drivers import read_run


class CheckRegistry:
    """The check's registry service: the real one, killable with -9 and restarted on its store and port."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        from id_registry.client import start_registry

        self.data_dir = os.fspath(data_dir)
        self._start = start_registry
        self.service = start_registry(self.data_dir)
        self.url = self.service.url
        self.port = int(self.url.rsplit(":", 1)[1])
        self.secret_file = str(Path(self.service.data_dir) / "secret")

    def kill(self) -> None:
        """kill -9 of the service process."""
        self.service.kill()

    def restart(self) -> None:
        """Start it again on the same store and port (a restart after a crash); retried while the port is not free yet."""
        self.service.stop()
        for attempt in range(30):
            try:
                self.service = self._start(self.data_dir, port=self.port)
                return
            except Exception:  # noqa: BLE001 - the port in TIME_WAIT: try again
                if attempt == 29:
                    raise
                time.sleep(1.0)

    def stop(self) -> None:
        self.service.stop()


@contextlib.contextmanager
def check_registry(data_dir: str | os.PathLike[str]) -> Iterator[CheckRegistry]:
    registry = CheckRegistry(data_dir)
    try:
        yield registry
    finally:
        registry.stop()


class PipelineProcess:
    """One pipeline's driver process (``millwheel photon run --backend spark``)."""

    def __init__(self, name: str, data: Path, run: Path, common: list[str], log: Path) -> None:
        self.name, self.data, self.run, self.common, self.log = name, data, run, common, log
        self.proc: subprocess.Popen[bytes] | None = None
        #: the check killed it (its exit is no stop of its own)
        self.killed = False

    def command(self, *, follow: bool, run: Path | None = None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "millwheel.cli",
            "photon",
            "run",
            str(self.data),
            "--checkpoint",
            str(run or self.run),
            "--pipeline",
            self.name,
            *self.common,
            *(["--follow"] if follow else []),
        ]

    def start(self, *, follow: bool, crash: str | None = None) -> None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        env.pop("MILLWHEEL_CRASH", None)
        if crash is not None:
            env["MILLWHEEL_CRASH"] = f"Joiner:{crash}:data"
        self.killed = crash is not None  # a crash point's SIGKILL is the check's doing
        with open(self.log, "ab") as out:
            out.write(
                f"\n==== {time.strftime('%H:%M:%S')} start {self.name} follow={follow} crash={crash}\n".encode()
            )
            self.proc = subprocess.Popen(
                self.command(follow=follow),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 of the driver and everything it started (its JVM, its Python workers)."""
        if self.proc is None:
            return
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(60)

    def stop(self) -> None:
        """A clean stop (SIGTERM: a ``--follow`` run ends its loop and exits)."""
        if self.running():
            self.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            try:
                self.proc.wait(180)  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                self.kill()
        self.kill()  # what is left of its process group

    def drained(self) -> bool:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return bool(json.loads((self.run / "photon-status.json").read_text())["drained"])
        return False

    def published(self) -> bool:
        """Some joined output is visible already (a moment worth interrupting)."""
        return bool(read_run(self.run).joined) if (self.run / "streams").exists() else False


def ship(src: Path, dest_dir: Path, name: str) -> None:
    """A file appears in a log directory whole (a hidden name, then a rename)."""
    shutil.copy(src, dest_dir / f".{name}")
    os.replace(dest_dir / f".{name}", dest_dir / name)


def run_verify(
    registry: CheckRegistry, runs: list[Path], *extra: str
) -> subprocess.CompletedProcess[str]:
    """``photon verify RUNS --json`` against the check's registry, its output captured (the caller judges it)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "millwheel.cli",
            "photon",
            "verify",
            *map(str, runs),
            "--registry",
            registry.url,
            "--secret-file",
            registry.secret_file,
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
