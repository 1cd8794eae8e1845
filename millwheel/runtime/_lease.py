"""Which driver owns a query's writes: a lease per query in the run directory (MillWheel §7.1 fencing).

A driver that pauses (a long GC, a stopped process, a partition) and resumes after a second
driver took over the same run directory is a *zombie*. The watermark authority already
refuses its reports (sequencer tokens, §7.2), but the stream logs and the outbox are plain
files: without a fence, the zombie's Spark query would finish its micro-batch, overwrite
the outbox of a batch the new driver published, and the new driver would publish that
second version (new file names, the same record ids: duplicates downstream).

So each query (a computation, or ``injector.<name>``) takes a lease when it starts: an
*epoch* one above every epoch taken before for that query, created exclusively as
``<run>/leases/<query>/<epoch>``. A newer epoch fences every older one. The driver checks
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

import pyarrow.fs as pafs

from millwheel._errors import MillwheelError
from millwheel.runtime._fs import Location


class FencedError(MillwheelError):
    """Another driver took over this query: this one must stop writing."""


def _epochs(loc: Location) -> list[int]:
    return sorted(int(n) for n in loc.list() if n.isdigit())


class Lease:
    """The lease of one query of one run directory: :meth:`acquire` at start, :meth:`check` before writes."""

    def __init__(self, loc: Location, what: str) -> None:
        self.loc = loc
        self.what = what
        #: this driver's epoch (0: not acquired yet)
        self.epoch = 0

    def acquire(self) -> int:
        """Take an epoch above every epoch taken so far; the previous owner is fenced from now on."""
        self.loc.mkdirs()
        while True:
            epoch = max(_epochs(self.loc), default=0) + 1
            if self._create(epoch):
                self.epoch = epoch
                return epoch

    def _create(self, epoch: int) -> bool:
        """Create ``<epoch>`` only if nobody has: ``O_EXCL`` on a local disk, create-then-list elsewhere."""
        name = f"{epoch:012d}"
        target = self.loc.child(name)
        if isinstance(self.loc.fs, pafs.LocalFileSystem):
            try:
                fd = os.open(target.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.uname().nodename}:{os.getpid()}\n")
            return True
        if target.exists():
            return False
        target.write_text(f"{os.uname().nodename}:{os.getpid()}\n")
        return max(_epochs(self.loc), default=0) == epoch

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
