"""Which driver owns a query's writes: a lease per query in the run directory (MillWheel §7.1 fencing).

A driver that pauses (a long GC, a stopped process, a partition) and resumes after a second
driver took over the same run directory is a *zombie*. The watermark authority already
refuses its reports (sequencer tokens, §7.2), but the stream logs and the outbox are plain
files: without a fence, the zombie's Spark query would finish its micro-batch, overwrite
the outbox of a batch the new driver published, and the new driver would publish that
second version (new file names, the same record ids: duplicates downstream).

So each query (a computation, or ``injector.<name>``) takes a lease when it starts, created
exclusively as ``<run>/leases/<query>/<epoch>``, under its driver's *epoch*
(:class:`DriverEpoch`: one per driver start, above every epoch taken before in the run
directory). A newer epoch fences every older one. The driver checks
its epoch (one directory listing) before it stages a batch's output, before it returns
from the sink (so a fenced attempt is never committed), before it publishes a batch and at
every round of its loop; a fenced driver raises :class:`FencedError` and stops, and never
restarts a query. Its output directories carry its epoch (``outbox/<query>/<batch>/e<epoch>``),
and publication takes the newest epoch's version of a batch, so a version a zombie staged
after the check is never the one published. See ``docs/reliability.md`` for the window that
remains (a driver paused between the sink's last check and Spark's commit-log write).
"""

from __future__ import annotations

import os

from millwheel._errors import MillwheelError
from millwheel.runtime._fs import Location


class FencedError(MillwheelError):
    """Another driver took over this query: this one must stop writing."""


def _epochs(loc: Location) -> list[int]:
    return sorted(int(n) for n in loc.list() if n.isdigit())


def _create(loc: Location, epoch: int) -> bool:
    """Create ``loc/<epoch>`` only if nobody has (:meth:`Location.write_new`); elsewhere than
    a local disk, also only if no higher epoch was created meanwhile."""
    target = loc.child(f"{epoch:012d}")
    if not target.write_new(f"{os.uname().nodename}:{os.getpid()}\n"):
        return False
    return target.local or max(_epochs(loc), default=0) == epoch


class DriverEpoch:
    """One epoch per driver start, above every epoch any query of the run directory has had.

    Every query a driver starts takes its lease under this one epoch
    (``Lease.acquire(epoch)``). Were each query to take one above its own newest, a driver
    paused in the middle of starting its queries (a zombie) would, on resuming, take the
    queries it had not reached yet with epochs above those of the driver that replaced it,
    and fence *that* driver: both would stop (the soak of 2026-11-23 saw it). Epochs taken
    in driver-start order cannot cross so. Created exclusively as ``leases/_drivers/<epoch>``.
    """

    DIR = "_drivers"

    def __init__(self, leases: Location) -> None:
        self.leases = leases
        self.value = 0

    def get(self) -> int:
        if not self.value:
            own = self.leases.child(self.DIR)
            own.mkdirs()
            while True:
                newest = max(
                    (max(_epochs(self.leases.child(q)), default=0) for q in self.leases.list()),
                    default=0,
                )
                if _create(own, newest + 1):
                    self.value = newest + 1
                    break
        return self.value

    def mark(self, *, stopped: bool) -> None:
        """Say in ``_drivers/<epoch>`` whether this driver has stopped its queries (a clean
        stop) or runs them (a restart of the same runtime): :func:`live_drivers` reads it."""
        if self.value:
            suffix = " stopped" if stopped else ""
            self.leases.child(self.DIR, f"{self.value:012d}").write_text(
                f"{os.uname().nodename}:{os.getpid()}{suffix}\n"
            )


def driver_running(root: Location, force: bool = False) -> str | None:
    """Why an offline command must not touch run directory ``root``: a driver
    may still run it (``None``: none does, or ``force`` says one on another host stopped)."""
    live = live_drivers(root.child("leases"))
    if not live or force:
        return None
    return (
        f"a driver may still be running run directory {root.uri} ({'; '.join(live)}); stop it first "
        "(or pass --force if you know a driver on another host has stopped)"
    )


def live_drivers(leases: Location) -> list[str]:
    """The drivers that may still be running queries of this run directory, described.

    Only the newest epoch of each query can write anything (older ones are fenced), so
    only those drivers count: one that stopped cleanly says so (:meth:`DriverEpoch.mark`);
    one on this host whose process is gone (killed) is not running; one on another host
    cannot be checked from here and is listed.
    """
    if not leases.exists():
        return []
    out: list[str] = []
    host = os.uname().nodename
    newest: dict[int, str] = {}  # epoch -> a query it holds
    for q in leases.list():
        if q != DriverEpoch.DIR and (e := max(_epochs(leases.child(q)), default=0)):
            newest[e] = q
    for epoch, query in sorted(newest.items()):
        name = f"{epoch:012d}"
        # the driver's own entry (it says whether it stopped), else the query lease's owner
        text = (
            leases.child(DriverEpoch.DIR, name).read_text()
            or leases.child(query, name).read_text()
            or ""
        ).strip()
        if text.endswith(" stopped"):
            continue
        owner, _, pid = text.rpartition(":")
        if owner == host and pid.isdigit():
            if not process_running(int(pid)):
                continue
            out.append(f"epoch {epoch}: process {pid} on this host")
        else:
            out.append(
                f"epoch {epoch}: {text or 'an unknown process'} (not on this host: cannot check it from here)"
            )
    return out


def process_running(pid: int) -> bool:
    """Is process ``pid`` of this host running? A zombie is not: killed -9, it stays in the
    process table until its parent reaps it (a supervisor, a test), but it runs nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True  # no /proc here: os.kill said it exists


class Lease:
    """The lease of one query of one run directory: :meth:`acquire` at start, :meth:`check` before writes."""

    def __init__(self, loc: Location, what: str) -> None:
        self.loc = loc
        self.what = what
        #: this driver's epoch (0: not acquired yet)
        self.epoch = 0

    def acquire(self, epoch: int) -> int:
        """Take this query under the driver's ``epoch`` (:class:`DriverEpoch`): the previous
        owner is fenced from now on.

        One epoch for all the queries a driver starts, so a driver that started later holds
        the higher epoch on every query whatever order they are taken in. If a newer epoch
        already holds this query — this driver was paused while starting and another took
        over — raise :class:`FencedError` without fencing it.
        """
        self.loc.mkdirs()
        _create(self.loc, epoch)  # exists already: this driver took it before (a restart)
        self.epoch = epoch
        self.check()
        return epoch

    def newest(self) -> int:
        return max(_epochs(self.loc), default=0)

    def check(self) -> None:
        """Raise :class:`FencedError` if a newer driver took this query over (or none was acquired)."""
        newest = self.newest()
        if self.epoch and newest == self.epoch:
            return
        owner = self.loc.child(f"{newest:012d}").read_text() or "?"
        msg = (
            f"{self.what}: another driver ({owner.strip()}, epoch {newest}) took over this query in "
            f"{self.loc.uri.rsplit('/leases/', 1)[0]} after this one (epoch {self.epoch}); this driver stops "
            "without writing. Run one driver per query and run directory (use --only to split a topology)"
        )
        raise FencedError(msg)
