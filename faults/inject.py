"""The faults, each a small reusable helper (pytest fixtures wrap them in ``tests/faults/conftest.py``).

Kill points are chosen by *progress* — a number of committed micro-batches of a query,
read from its checkpoint (:func:`wait_for_progress`) — never by seconds, so a fault means
the same on a fast and on a loaded machine.

========================  ==================================================================
fault                     helper
========================  ==================================================================
kill -9 of the driver     :func:`kill_tree` on a :func:`start_driver` process (its JVM and
                          Python workers go with it, as with a lost machine)
kill -9 of Python workers :func:`kill_python_workers`: the workers of ``pyspark.daemon``
kill -9 of an executor    :func:`kill_executor`: the ``CoarseGrainedExecutorBackend`` JVM of a
                          standalone cluster's worker (``millwheel cluster``); the worker
                          starts a new one
kill -9 of the authority  :class:`AuthorityProcess`: ``millwheel authority serve`` in a
                          subprocess, killed and restarted on the same port and journal
zombie driver             :func:`pause` (SIGSTOP of the driver's whole process tree), a
                          second driver on the same run directory, :func:`resume` (SIGCONT)
full disk                 :class:`SmallDisk`: the run directory on a tmpfs of a few hundred
                          MB; :meth:`SmallDisk.fill` writes a ballast file until ENOSPC,
                          :meth:`SmallDisk.free` deletes it
wall-clock jump           :class:`ClockJump`: the JVM runs under Debian's libfaketime, whose
                          offset file this rewrites (``+3600s``: an hour ahead)
========================  ==================================================================
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

# ---- processes --------------------------------------------------------------------------------


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (Spark's Python workers leave the process group)."""
    from millwheel.runtime import child_processes

    return child_processes(root)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 a process, then everything it started (the JVM, the Python workers)."""
    family = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in family) and time.monotonic() < deadline:
        time.sleep(0.1)


def python_workers(root: int) -> list[int]:
    """Pids of the Spark Python workers forked by a ``pyspark.daemon`` below ``root``."""
    daemons = [pid for pid in descendants(root) if "pyspark.daemon" in cmdline(pid)]
    return [pid for daemon in daemons for pid in descendants(daemon)]


def cpu_ticks(pid: int) -> int | None:
    """User and system CPU time of ``pid`` in clock ticks, or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().split(") ", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def busy_python_workers(root: int, window_s: float = 0.05) -> list[int]:
    """The Spark Python workers below ``root`` that used CPU within ``window_s``: running a
    task. A worker idle between tasks waits on its socket and uses none; killing it fails
    nothing (Spark starts another), killing a busy one fails its task and so its query."""
    before = {pid: cpu_ticks(pid) for pid in python_workers(root)}
    time.sleep(window_s)
    return [
        pid for pid, ticks in before.items() if ticks is not None and (cpu_ticks(pid) or 0) > ticks
    ]


def kill_python_workers(root: int, *, busy: bool = False) -> int:
    """kill -9 the Spark Python workers below ``root`` alive right now (``busy``: only those
    running a task, :func:`busy_python_workers`); how many were killed."""
    killed = 0
    for pid in busy_python_workers(root) if busy else python_workers(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def kill_executor(cluster: object, index: int = 0) -> int | None:
    """kill -9 the executor JVM of worker ``index`` of a ``millwheel cluster`` (its pid, or ``None``)."""
    from millwheel.runtime import EXECUTOR_CLASS

    worker = cluster.workers[index]  # type: ignore[attr-defined]
    for pid in descendants(worker.pid):
        if EXECUTOR_CLASS in cmdline(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                return pid
    return None


def pause(proc: subprocess.Popen[bytes]) -> list[int]:
    """SIGSTOP a driver and its whole tree (JVM, workers): a zombie-to-be. Returns the pids stopped."""
    family = [proc.pid, *descendants(proc.pid)]
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    return family


def resume(pids: list[int]) -> None:
    """SIGCONT what :func:`pause` stopped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


# ---- progress ------------------------------------------------------------------------------------


def committed_batches(root: Path | str, query: str) -> int:
    """How many micro-batches of ``query`` (a computation, or ``injector.<name>``) have committed.

    Every batch counts, a batch that read no input too: a driver that starts commits one or
    two for each computation (the ticks of its key intervals, heartbeats) even when nothing
    is left to read. :func:`consumed_inputs` counts only the progress that reads input.
    The newest entry's number, not the number of entries: the commit log keeps only its last
    ~100 (Spark's ``minBatchesToRetain``, and the driver's log reader as Spark does).
    """
    commits = Path(root) / "checkpoints" / query / "commits"
    if not commits.is_dir():
        return 0
    return max((int(n) + 1 for n in os.listdir(commits) if n.isdigit()), default=0)


def consumed_inputs(root: Path | str, query: str) -> int:
    """Input progress of ``query``: how many stream-log files a computation's committed
    batches consumed (from its checkpoint: ``rundir.ConsumedFiles``), or, for
    ``injector.<name>``, how many stream-log files the injector published.

    With ``max_files_per_trigger=1`` it is the number of the computation's batches that
    read input; heartbeat and tick batches (:func:`committed_batches` counts them) add
    nothing, so a kill point in this measure lies in work that really remains.
    """
    from millwheel.runtime.rundir import FileStreamLog, Location

    run = Location.of(str(root))
    if query.startswith("injector."):
        name = query.split(".", 1)[1]
        log = FileStreamLog(run)
        return sum(len(log.files(stream, name)) for stream in run.child("streams").list())
    return sum(len(names) for names in consumed_files(root, query).values())


def consumed_files(root: Path | str, query: str) -> dict[tuple[str, str], set[str]]:
    """(stream, producer) -> the stream-log files computation ``query``'s committed batches
    consumed, from its checkpoint (``rundir.ConsumedFiles``)."""
    from millwheel.runtime.rundir import ConsumedFiles, Location
    from millwheel.runtime.rundir import committed_batches as committed

    checkpoint = Location.of(str(root)).child("checkpoints", query)
    done = committed(checkpoint)
    if not done:
        return {}
    consumed = ConsumedFiles(checkpoint)
    consumed.refresh()
    return {pair: consumed.names(*pair, done[-1]) for pair in list(consumed.files)}


def wait_for_progress(
    proc: subprocess.Popen[bytes],
    root: Path | str,
    query: str,
    batches: int,
    timeout: float = 300,
    measure: Callable[[Path | str, str], int] = committed_batches,
    meanwhile: Callable[[int], None] | None = None,
) -> bool:
    """Wait until ``query`` made ``batches`` more progress in ``measure`` (default: committed
    batches; :func:`consumed_inputs`: input files consumed); ``False`` if ``proc`` ended first.
    ``meanwhile`` is called with the progress so far at each poll that has not reached it
    (a test that appends input while it waits)."""
    target = measure(root, query) + batches
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        got = measure(root, query)
        if got >= target:
            return True
        if meanwhile is not None:
            meanwhile(got)
        time.sleep(0.05)
    msg = f"{query} did not make {batches} more progress ({measure.__name__}) within {timeout}s (is the machine overloaded? see the driver's log)"
    raise TimeoutError(msg)


# ---- the driver ---------------------------------------------------------------------------------


def start_driver(
    root: Path | str,
    data: Path | str,
    *extra: str,
    env: dict[str, str] | None = None,
    log: Path | str | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m faults.driver ROOT DATA EXTRA...`` in its own session, output appended to ``log``."""
    e = dict(os.environ)
    e.update(env or {})
    e["PYSPARK_PYTHON"] = sys.executable
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        [sys.executable, "-m", "faults.driver", str(root), str(data), *extra],
        env=e,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


# ---- the watermark authority ------------------------------------------------------------------


class AuthorityProcess:
    """``millwheel authority serve`` as a subprocess, on a fixed port and journal, that can be killed -9 and restarted."""

    def __init__(self, data_dir: Path | str, port: int | None = None) -> None:
        from servicekit.ports import free_port

        self.data_dir = str(data_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    @property
    def secret_file(self) -> str:
        return os.path.join(self.data_dir, "secret")

    def start(self, timeout: float = 60) -> AuthorityProcess:
        from watermark_authority.client import HttpWatermarkClient

        os.makedirs(self.data_dir, exist_ok=True)
        log = open(os.path.join(self.data_dir, "authority.log"), "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "watermark_authority",
                "serve",
                "--port",
                str(self.port),
                "--data-dir",
                self.data_dir,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        with HttpWatermarkClient(self.url, retries=0) as probe:
            while not probe.healthy():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = Path(self.data_dir, "authority.log").read_text(errors="replace")[-2000:]
                    msg = f"the watermark authority on port {self.port} did not start:\n{tail}"
                    raise RuntimeError(msg)
                time.sleep(0.05)
        return self

    def kill9(self) -> None:
        """kill -9: the journal is all that survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self.kills += 1

    def restart(self) -> None:
        self.kill9()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def env(self) -> dict[str, str]:
        """What a driver needs to write to this authority: where its secret is."""
        return {"MILLWHEEL_AUTHORITY_SECRET_FILE": self.secret_file}


# ---- a full disk -----------------------------------------------------------------------------------


class SmallDisk:
    """A tmpfs of ``size_mb`` at ``path`` (needs root and ``mount``); :meth:`fill` makes it full."""

    def __init__(self, path: Path | str, size_mb: int = 512) -> None:
        self.path = Path(path)
        self.size_mb = size_mb
        self.ballast = self.path / ".ballast"
        self.mounted = False

    @staticmethod
    def available() -> str | None:
        """``None`` if a tmpfs can be mounted here, else why not."""
        probe = Path(tempfile.mkdtemp(prefix="millwheel-tmpfs-probe-"))
        try:
            r = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                capture_output=True,
                text=True,
                check=False,
            )
            if r.returncode != 0:
                return f"cannot mount a tmpfs ({r.stderr.strip() or r.returncode}): the full-disk fault needs root"
            subprocess.run(["umount", str(probe)], check=False)
            return None
        except OSError as exc:
            return f"cannot run mount: {exc}"
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()

    def mount(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)],
            check=True,
            capture_output=True,
        )
        self.mounted = True
        return self

    def fill(self) -> int:
        """Write a ballast file until the device is full; returns its size in bytes."""
        if not os.path.ismount(self.path):
            # seen once (a campaign's ballast could not be opened: ENOENT): say what is gone
            # rather than fail inside ``open``
            state = "exists but is not a mount point" if self.path.is_dir() else "is gone"
            msg = f"the tmpfs at {self.path} {state}: was its directory moved or removed by another process?"
            raise AssertionError(msg)
        chunk = b"\0" * (1 << 20)
        written = 0
        ballast = self._open_ballast()
        if ballast is None:
            return 0  # full already
        with ballast as f:
            try:
                while True:
                    f.write(chunk)
                    f.flush()
                    written += len(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        # fill the last partial MB too
        with contextlib.suppress(OSError), open(self.ballast, "ab") as f:
            for _ in range(1 << 10):
                f.write(b"\0" * 1024)
                f.flush()
        return written

    def _open_ballast(self) -> BinaryIO | None:
        """The ballast file, to append to; ``None`` if the device is full already. Creating
        it was once refused with ENOSPC on a tmpfs that ``statvfs`` showed empty (a CI run,
        seed 144324; the same seed alone passed): it is tried again for a second, and a
        refusal on a device with room fails with the device's figures."""
        for _ in range(10):
            try:
                return open(self.ballast, "ab")  # noqa: SIM115 - the caller's with closes it
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                time.sleep(0.1)
        st = os.statvfs(self.path)
        if st.f_bavail * st.f_frsize >= 1 << 20 and st.f_favail:
            msg = (
                f"the tmpfs at {self.path} refuses a new file (ENOSPC) with "
                f"{st.f_bavail * st.f_frsize >> 20} MB and {st.f_favail} inodes free"
            )
            raise AssertionError(msg)
        return None

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()

    def used_mb(self) -> float:
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize / 2**20

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)
            self.mounted = False


# ---- a wall clock that jumps -------------------------------------------------------------------------


class ClockJump:
    """The offset file of libfaketime for a driver's JVM (``faults.driver --faketime FILE``)."""

    LIBRARY = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.offset_s = 0
        self.jumps = 0
        self.set(0)

    @classmethod
    def available(cls) -> str | None:
        return (
            None
            if os.path.exists(cls.LIBRARY)
            else f"{cls.LIBRARY} is missing: apt-get install faketime"
        )

    def set(self, offset_s: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}s\n")
        tmp.replace(self.path)
        if offset_s != self.offset_s:
            self.jumps += 1
        self.offset_s = offset_s

    def jump(self, by_s: int) -> None:
        """Move the JVM's wall clock by ``by_s`` seconds (forward or back); seen within a second."""
        self.set(self.offset_s + by_s)
