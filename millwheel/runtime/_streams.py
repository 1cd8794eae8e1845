"""Streams between computations: durable, replayable logs (docs/runtime.md "Streams between computations").

A stream is a directory per (stream, producer) of immutable Parquet files of
stream-log rows (:data:`~millwheel.runtime._wire.LOG_SCHEMA`)::

    <root>/streams/<stream>/<producer>/<tag>-m<min ts>.parquet

A file appears under its final name only by an atomic rename, so a reader — a Spark file
source, or :meth:`FileStreamLog.read` — only ever sees whole, committed files; hidden
names (``.x``, ``_x``) are ignored by Spark. The oldest timestamp of a file is in its
name, so the driver computes "oldest unconsumed input" (MillWheel §4.5) from a listing.

One directory per producer keeps each producer's low watermark separate (a consumer
takes the minimum over them). Any computation may read any stream: a new consumer is a
new Spark query with its own checkpoint, reading the same directories from the start.

**Pruning.** Every consumer lists its input directories once per micro-batch, and the
driver lists them for the input low watermark, so a directory that only grows makes
every batch slower. With ``RuntimeSettings(prune_streams=True)`` the driver moves a file
that every consumer has consumed in a committed batch into the directory's ``_done/``
(:meth:`FileStreamLog.prune`): hidden from Spark's listing and from the watermark's,
still read by :meth:`FileStreamLog.read` and the sinks (:meth:`FileStreamLog.files`
names it ``_done/<name>``). A consumer added later with ``--only`` starts from the files
still live, so runs that will be extended keep it off (the default).

The interface is deliberately narrow — :class:`StreamLog` — so a Kafka-backed log
(topic per stream, producer in a header, offsets in the consumer's checkpoint) can
replace it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from millwheel._codec import encode_value
from millwheel._fields import FIELDS_COLUMN, rebuild_values
from millwheel._record import Record, decode_key, encode_key
from millwheel.runtime._fs import Location
from millwheel.runtime._keying import Keyer

ARROW_LOG_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("ts", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("wm", pa.int64()),
    ]
)


#: where consumed files go when streams are pruned (hidden from Spark's file listing)
DONE = "_done"


def file_name(tag: str, min_ts: int) -> str:
    return f"{tag}-m{min_ts}.parquet"


def min_ts_of(name: str) -> int | None:
    """The oldest timestamp encoded in a stream-log file name, or None for other files."""
    if name.startswith((".", "_")) or not name.endswith(".parquet"):
        return None
    try:
        return int(name[: -len(".parquet")].rsplit("-m", 1)[1])
    except (IndexError, ValueError):
        return None


class StreamLog(Protocol):
    """What the runtime needs from a stream log."""

    def location(self, stream: str, producer: str) -> Location: ...

    def ensure(self, stream: str, producer: str) -> None: ...

    def files(self, stream: str, producer: str, live_only: bool = False) -> dict[str, int]: ...

    def publish(self, src: Location, stream: str, producer: str, tag: str, min_ts: int) -> None: ...

    def append(self, stream: str, producer: str, tag: str, records: list[Record]) -> None: ...

    def read(self, stream: str) -> list[Record]: ...


class FileStreamLog:
    """The embedded stream log: a directory on a local disk or a distributed filesystem."""

    def __init__(self, root: Location, keyer: Keyer | None = None) -> None:
        self.root = root.child("streams")
        #: keys what :meth:`append` writes for the stream's consumers (``_keying.py``)
        self.keyer = keyer

    @classmethod
    def at(cls, run_dir: str) -> FileStreamLog:
        """The stream log of the run directory ``run_dir`` (a path or URI), to read what a run published."""
        return cls(Location.of(run_dir))

    def location(self, stream: str, producer: str) -> Location:
        return self.root.child(stream, producer)

    def ensure(self, stream: str, producer: str) -> None:
        self.location(stream, producer).mkdirs()

    def files(self, stream: str, producer: str, live_only: bool = False) -> dict[str, int]:
        """Published files of one producer: name -> oldest timestamp.

        Pruned files are named ``_done/<name>`` (and sort first: they are the oldest);
        ``live_only`` leaves them out (what consumers have still to read).
        """
        out: dict[str, int] = {}
        loc = self.location(stream, producer)
        if not live_only:
            for name in loc.child(DONE).list():
                ts = min_ts_of(name)
                if ts is not None:
                    out[f"{DONE}/{name}"] = ts
        for name in loc.list():
            ts = min_ts_of(name)
            if ts is not None:
                out[name] = ts
        return out

    def prune(self, stream: str, producer: str, names: Iterable[str]) -> int:
        """Move consumed live files into ``_done/`` (see the module docstring); returns how many."""
        loc = self.location(stream, producer)
        done = loc.child(DONE)
        moved = 0
        for name in names:
            if moved == 0:
                done.mkdirs()
            try:
                loc.child(name).move_to(done.child(name))
            except FileNotFoundError:
                continue
            moved += 1
        return moved

    def producers(self, stream: str) -> list[str]:
        return sorted(n for n in self.root.child(stream).list() if not n.startswith((".", "_")))

    def publish(self, src: Location, stream: str, producer: str, tag: str, min_ts: int) -> None:
        """Make a finished file visible under its final name, atomically (idempotent)."""
        dest = self.location(stream, producer).child(file_name(tag, min_ts))
        if dest.exists():
            src.delete()
            return
        src.move_to(dest)

    def append(
        self,
        stream: str,
        producer: str,
        tag: str,
        records: list[Record],
        sender_watermark: int | None = None,
    ) -> None:
        """Write records as one new file (driver side: injectors, tests). Idempotent per tag.

        ``sender_watermark`` is the injector low watermark the records were sent under:
        records behind it are late (§4.5) and do not hold the consumers' watermarks.
        """
        if not records:
            return
        table = records_table(records, sender_watermark, self.keyer, stream)
        min_ts = min(r.timestamp for r in records)
        if sender_watermark is not None:
            min_ts = max(min_ts, sender_watermark)
        loc = self.location(stream, producer)
        dest = loc.child(file_name(tag, min_ts))
        if dest.exists():
            return
        tmp = loc.child(f".{tag}.{uuid.uuid4().hex}.tmp")
        pq.write_table(table, tmp.path, filesystem=tmp.fs)
        tmp.move_to(dest)

    def read(self, stream: str) -> list[Record]:
        """Every record published to ``stream`` (re-deliveries included), by producer and file."""
        out: list[Record] = []
        for producer in self.producers(stream):
            loc = self.location(stream, producer)
            for name in sorted(self.files(stream, producer)):
                out += table_records(read_log(loc.child(name)))
        return out


def records_table(
    records: Iterable[Record],
    sender_watermark: int | None = None,
    keyer: Keyer | None = None,
    stream: str = "",
) -> pa.Table:
    """Stream-log rows of ``records``; with a ``keyer``, keyed for the consumers of ``stream``."""
    recs = list(records)
    values, declared = (
        (None, None)
        if keyer is None
        else keyer.value_columns(stream, stream, [r.value for r in recs])
    )
    arrays = [
        pa.array([r.id for r in recs], pa.string()),
        pa.array([r.timestamp for r in recs], pa.int64()),
        pa.array([None if r.key is None else encode_key(r.key) for r in recs], pa.binary()),
        values
        if values is not None
        else pa.array([encode_value(r.value) for r in recs], pa.binary()),
        pa.array([sender_watermark] * len(recs), pa.int64()),
    ]
    fields = list(ARROW_LOG_SCHEMA)
    if declared is not None:  # a stream that declares its fields: conforming values as columns
        arrays.append(declared)
        fields.append(pa.field(FIELDS_COLUMN, declared.type))
    consumers = [] if keyer is None else keyer.consumers_of([stream])
    if keyer is not None and consumers:
        arrays += keyer.arrays([(stream, r) for r in recs], consumers)
        fields += keyer.arrow_fields(consumers)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def read_log(loc: Location) -> pa.Table:
    """The columns of a stream-log file that make its records (``fields`` when it has them)."""
    f = pq.ParquetFile(loc.path, filesystem=loc.fs)
    return f.read(
        columns=["id", "ts", "key", "value"]
        + ([FIELDS_COLUMN] if FIELDS_COLUMN in f.schema_arrow.names else [])
    )


def table_records(table: pa.Table) -> list[Record]:
    """The records of a stream-log table: values decoded, or rebuilt from ``fields``."""
    cols = table.to_pydict()
    values = rebuild_values(cols["value"], cols.get(FIELDS_COLUMN))
    return [
        Record(decode_key(k), v, ts, rid)
        for rid, ts, k, v in zip(cols["id"], cols["ts"], cols["key"], values, strict=False)
    ]
