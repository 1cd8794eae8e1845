"""Columnar state in files, versioned by batch id: the state of the Arrow mapping (``plans/arrow.py``).

Under ``<run>/colstate/<computation>/``::

    i<interval>/<batch>-<token>-p<partition>a<attempt>.store   one key interval's columnar store
                                                               after a batch (``_colstore.py``)
    manifests/<batch>-e<epoch>.json                            which store file each interval has
                                                               after the batch, the batch's low
                                                               watermark, each interval's next timers

A store file is written once, by the task that ran the interval (a temporary file, then a
rename), under a name no other attempt uses: the batch, the driver's token for that run
of the batch, the task's partition and attempt number. The batch's manifest is written
by the driver after the batch's job and before ``foreachBatch`` returns, so before Spark
writes the batch's commit-log entry; it names the files of the one task attempt whose
output the batch staged (the summary rows carry the names, ``plans/arrow.py``).

**Which version a batch reads.** Batch ``B`` reads the newest manifest of a batch that is
in the query's commit log (``B - 1``: Spark starts ``B`` only once ``B - 1`` is
committed). A manifest of an uncommitted batch — ``B`` itself written before a crash, then
``B`` replayed — is never trusted: the replay reads ``B - 1`` again and writes its own
files and manifest over. Nothing in the store needs to be deterministic for that; a replay
that computes other values (user code reading the clock) is simply the version that commits.

**Collection.** At the start of batch ``B`` everything not named by the manifest it reads
is deleted: older manifests and their files (a later batch, ``B - 1``, is committed), and
files and manifests of attempts that never committed (a crashed run of ``B``, a zombie
task). A zombie that renames its file after that leaves one more unnamed file, deleted at
the next batch.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from millwheel._errors import MillwheelError
from millwheel._record import MIN_TIMESTAMP
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin, write_pin

#: the run directory's subdirectory of the Arrow mapping's state
STATE_DIR = "colstate"
_MANIFESTS = "manifests"
_SUFFIX = ".store"


def store_name(batch: int, token: str, partition: int, attempt: int) -> str:
    """The name of the store file one task attempt writes for one interval after ``batch``.

    >>> store_name(7, "ab12", 1, 0)
    '000000000007-ab12-p1a0.store'
    """
    return f"{batch:012d}-{token}-p{partition}a{attempt}{_SUFFIX}"


@dataclass
class Manifest:
    """What a committed batch left: each key interval's store file, its next timers, and the
    batch's low watermark (the next batch's starting point, ``plans/arrow.py``)."""

    #: the batch (-1: none yet)
    batch: int = -1
    low_watermark: int = MIN_TIMESTAMP
    #: key interval -> its store file (absent: the interval keeps nothing)
    files: dict[int, str] = field(default_factory=dict)
    #: key interval -> (earliest low-watermark timer, earliest wall timer)
    timers: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    #: the lease epoch of the driver that wrote it (``_lease.py``)
    epoch: int = 0

    @property
    def file_name(self) -> str:
        return f"{self.batch:012d}-e{self.epoch}.json"

    def encode(self) -> str:
        return json.dumps(
            {
                "batch": self.batch,
                "epoch": self.epoch,
                "low_watermark": self.low_watermark,
                "files": {str(i): n for i, n in sorted(self.files.items())},
                "timers": {str(i): list(t) for i, t in sorted(self.timers.items())},
            },
            indent=0,
        )

    @classmethod
    def decode(cls, text: str) -> Manifest:
        d = json.loads(text)
        return cls(
            int(d["batch"]),
            int(d["low_watermark"]),
            {int(i): n for i, n in d["files"].items()},
            {int(i): (t[0], t[1]) for i, t in d["timers"].items()},
            int(d.get("epoch", 0)),
        )

    def due(self, low_watermark: int, now: int) -> list[int]:
        """Intervals with a timer due at ``low_watermark`` / ``now`` (§4.6): they run this
        batch even without input, as Spark's event-time timeout runs a group."""
        return sorted(
            i
            for i, (lw, wall) in self.timers.items()
            if i in self.files
            and ((lw is not None and lw <= low_watermark) or (wall is not None and wall <= now))
        )

    def after(
        self,
        batch: int,
        low_watermark: int,
        reports: list[tuple[int, str | None, int | None, int | None]],
        epoch: int = 0,
    ) -> Manifest:
        """The manifest of ``batch``: this one with the intervals it ran replaced by their
        ``(interval, store file or None, next lw timer, next wall timer)``."""
        files, timers = dict(self.files), dict(self.timers)
        for interval, name, nlw, nwall in reports:
            if name:
                files[interval] = name
                timers[interval] = (nlw, nwall)
            else:
                files.pop(interval, None)
                timers.pop(interval, None)
        return Manifest(batch, low_watermark, files, timers, epoch)


class ColumnarFiles:
    """The store files and manifests of one computation (see the module docstring)."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self.manifests = loc.child(_MANIFESTS)

    def interval_dir(self, interval: int) -> Location:
        return self.loc.child(f"i{interval}")

    # -- manifests (the driver) --------------------------------------------------------
    def _manifest_names(self) -> list[tuple[int, int, str]]:
        """``(batch, epoch, file name)`` of every manifest, oldest first."""
        out = []
        for name in self.manifests.list():
            stem, _, epoch = name.removesuffix(".json").partition("-e")
            if name.endswith(".json") and stem.isdigit() and epoch.isdigit():
                out.append((int(stem), int(epoch), name))
        return sorted(out)

    def manifest_before(self, batch: int, committed: set[int]) -> Manifest:
        """The newest manifest of a committed batch before ``batch`` (empty if none): of
        that batch's, the newest driver epoch's, as the outbox publishes a batch from its
        newest epoch's version (``_outbox.py``, "Zombie drivers")."""
        for n, _, name in reversed(self._manifest_names()):
            if n < batch and n in committed:
                text = self.manifests.child(name).read_text()
                if text is None:
                    msg = (
                        f"{self.manifests.uri}: manifest of committed batch {n} vanished while read"
                    )
                    raise MillwheelError(msg)
                return Manifest.decode(text)
        return Manifest()

    def write_manifest(self, manifest: Manifest) -> None:
        """Atomically (a temporary file, then a rename): a replay of the batch replaces it."""
        self.manifests.mkdirs()
        self.manifests.child(manifest.file_name).write_text(manifest.encode())

    def collect(self, keep: Manifest, intervals: int) -> int:
        """Delete every manifest and store file ``keep`` does not name; returns how many."""
        gone = 0
        for _, _, name in self._manifest_names():
            if name != keep.file_name:
                self.manifests.child(name).delete()
                gone += 1
        for d in self.loc.list():
            if not (d.startswith("i") and d[1:].isdigit()):
                continue
            named = keep.files.get(int(d[1:]))
            sub = self.loc.child(d)
            for name in sub.list():
                if name != named:
                    sub.child(name).delete()
                    gone += 1
        return gone

    # -- store files (the tasks) -------------------------------------------------------
    def read_store(self, interval: int, name: str) -> bytes:
        f = self.interval_dir(interval).child(name)
        try:
            with f.fs.open_input_stream(f.path) as s:
                return s.read()
        except FileNotFoundError:
            msg = f"the columnar store {f.uri} named by the last committed manifest is missing; the run directory was damaged"
            raise MillwheelError(msg) from None

    def write_store(self, interval: int, name: str, data: bytes) -> None:
        d = self.interval_dir(interval)
        d.mkdirs()
        tmp = d.child(f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        with tmp.fs.open_output_stream(tmp.path) as s:
            s.write(data)
        tmp.move_to(d.child(name))


def pin_mapping(
    root: Location, computation: str, mapping: str, started: bool, partitions: int
) -> dict[str, Any]:
    """``computation``'s mapping, pinned in ``run.json`` (``"mappings"``) at its first start:
    ``{"mapping": "default"}``, or for the Arrow mapping also its partition count and
    partition function. Another mapping later is refused: the default mapping keeps the
    state in Spark's state store, the Arrow mapping in files neither reads. A computation
    whose query started before mappings were pinned ran the default one."""
    held = read_pin(root)
    pins = held.get("mappings") or {}
    entry = pins.get(computation)
    if entry is None:
        was = "default" if started else mapping
        entry = {"mapping": was}
        if was == "arrow":
            entry.update(
                partitions=partitions, partitioner="pmod(murmur3_hash(group, seed 42), partitions)"
            )
        if was == mapping:
            held["mappings"] = {**pins, computation: entry}
            write_pin(root, held)
    if entry["mapping"] != mapping:
        msg = (
            f"run directory {root.uri}: computation {computation!r} was started with mapping={entry['mapping']!r}, not {mapping!r}; "
            "its state lives where that mapping keeps it: resume it with the same ComputationOptions.mapping, "
            "or start the new mapping in a new run directory (millwheel run --fresh, or another --checkpoint)"
        )
        raise MillwheelError(msg)
    return dict(entry)


__all__ = ["STATE_DIR", "ColumnarFiles", "Manifest", "pin_mapping", "store_name"]
