"""The authority's journal: every change is written here before it is acknowledged (§7.2).

The core (:mod:`watermark_authority._core`) describes each change as a typed *record*, one
frozen dataclass per kind of change; a journal stores the latest record per key and hands
them all back on restart. Two journals share one encoding:

* :class:`RocksJournal` — RocksDB through ``rocksdict``, what the service uses;
* :class:`MemoryJournal` — a dict of the same bytes, for unit tests of restart semantics.

Records (``name`` is a computation or an injector), with their RocksDB key prefix::

    TokenCounter(next_token)                        t          the next sequencer token to hand out
    ComputationAdded(name)                          c/name     a computation exists
    IntervalState(computation, interval, token, value, pending, updated_ms, owner)
                                                    i/c/iv     a key interval's owner and last report
    IntervalDropped(computation, interval)          i/c/iv     (delete) split or merged away
    IntervalRetired(computation, interval, token)   r/c/iv     tombstone: reports for it are stale
    IntervalUnretired(computation, interval)        r/c/iv     (delete) the name is an interval again
    InjectorAdded(name, expected | None)            j/name     an injector and its expected processes
    ProcessReported(injector, process, value, updated_ms)   v/inj/proc   a process's last report
    ProcessDropped(injector, process)               v/inj/proc (delete) it left the expected set
    WatermarkPublished(name, value)                 p/name     the highest low watermark ever published
    PercentilePublished(name, pct, value)           q/name/pct the highest percentile watermark published
    FormatVersion(version)                          _          the journal format (2)

The key is the prefix and the record's leading fields joined by NUL; the value is the
other fields as a msgpack array. **Format versions**: 1 had no ``_`` key and no
``owner`` in ``IntervalState``; it is read as is (a missing trailing field takes its
default), and the authority writes ``FormatVersion(2)`` when it opens it. A journal of a
newer format than this code knows is refused with a message saying so.

Durability: a write goes to RocksDB's write-ahead log before :meth:`RocksJournal.commit`
returns, so it survives a kill -9 of the service. ``sync=True`` also fsyncs the log, so it
survives a machine crash, at the cost of one fsync per request.

>>> j = MemoryJournal()
>>> j.commit([TokenCounter(7), ComputationAdded("c"), WatermarkPublished("c", 1_000)])
>>> list(j.load())
[ComputationAdded(name='c'), WatermarkPublished(name='c', value=1000), TokenCounter(next_token=7)]
>>> decode(*encode(IntervalState("c", "interval-0", 3, 1_000, None, 5, "host:42")))
IntervalState(computation='c', interval='interval-0', token=3, value=1000, pending=None, updated_ms=5, owner='host:42')
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, ClassVar, Protocol, cast

import msgpack

#: the format this code writes (see the module docstring)
JOURNAL_FORMAT = 2

_SEP = "\x00"


class Record:
    """Base of the journal's records: how a record becomes a ``(key, value)`` and back."""

    __slots__ = ()
    #: the record's name, e.g. ``"interval"`` (stable: the key of :data:`RECORDS`)
    kind: ClassVar[str]
    #: the RocksDB key prefix
    prefix: ClassVar[str]
    #: how many leading fields form the key (after the prefix)
    key_fields: ClassVar[int]
    #: True if the record deletes its key (it has no value)
    deletes: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class TokenCounter(Record):
    next_token: int
    kind: ClassVar[str] = "next_token"
    prefix: ClassVar[str] = "t"
    key_fields: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class ComputationAdded(Record):
    name: str
    kind: ClassVar[str] = "computation"
    prefix: ClassVar[str] = "c"
    key_fields: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class IntervalState(Record):
    computation: str
    interval: str
    token: int
    value: int
    pending: int | None
    updated_ms: int | None
    owner: str | None = None  # format 2
    kind: ClassVar[str] = "interval"
    prefix: ClassVar[str] = "i"
    key_fields: ClassVar[int] = 2


@dataclass(frozen=True, slots=True)
class IntervalDropped(Record):
    computation: str
    interval: str
    kind: ClassVar[str] = "drop_interval"
    prefix: ClassVar[str] = "i"
    key_fields: ClassVar[int] = 2
    deletes: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class IntervalRetired(Record):
    computation: str
    interval: str
    token: int
    kind: ClassVar[str] = "retired"
    prefix: ClassVar[str] = "r"
    key_fields: ClassVar[int] = 2


@dataclass(frozen=True, slots=True)
class IntervalUnretired(Record):
    computation: str
    interval: str
    kind: ClassVar[str] = "unretire"
    prefix: ClassVar[str] = "r"
    key_fields: ClassVar[int] = 2
    deletes: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class InjectorAdded(Record):
    name: str
    expected: tuple[str, ...] | None
    kind: ClassVar[str] = "injector"
    prefix: ClassVar[str] = "j"
    key_fields: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class ProcessReported(Record):
    injector: str
    process: str
    value: int
    updated_ms: int | None
    kind: ClassVar[str] = "process"
    prefix: ClassVar[str] = "v"
    key_fields: ClassVar[int] = 2


@dataclass(frozen=True, slots=True)
class ProcessDropped(Record):
    injector: str
    process: str
    kind: ClassVar[str] = "drop_process"
    prefix: ClassVar[str] = "v"
    key_fields: ClassVar[int] = 2
    deletes: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class WatermarkPublished(Record):
    name: str
    value: int
    kind: ClassVar[str] = "published"
    prefix: ClassVar[str] = "p"
    key_fields: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class PercentilePublished(Record):
    name: str
    pct: str
    value: int
    kind: ClassVar[str] = "pct"
    prefix: ClassVar[str] = "q"
    key_fields: ClassVar[int] = 2


@dataclass(frozen=True, slots=True)
class FormatVersion(Record):
    version: int
    kind: ClassVar[str] = "format"
    prefix: ClassVar[str] = "_"
    key_fields: ClassVar[int] = 0


#: every record class, by name
RECORDS: dict[str, type[Record]] = {
    cls.kind: cls
    for cls in (
        TokenCounter,
        ComputationAdded,
        IntervalState,
        IntervalDropped,
        IntervalRetired,
        IntervalUnretired,
        InjectorAdded,
        ProcessReported,
        ProcessDropped,
        WatermarkPublished,
        PercentilePublished,
        FormatVersion,
    )
}
# the record a stored key decodes to: the one that writes values under that prefix
_BY_PREFIX: dict[str, type[Record]] = {
    cls.prefix: cls for cls in RECORDS.values() if not cls.deletes
}


def _tuple_getter(names: Sequence[str]) -> Callable[[Any], tuple[Any, ...]]:
    if not names:
        return lambda _: ()
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda r: (get(r),)
    return attrgetter(*names)  # type: ignore[return-value]  # returns a tuple for several names


# per class: (key fields getter, value fields getter)
_GETTERS: dict[
    type[Record], tuple[Callable[[Any], tuple[Any, ...]], Callable[[Any], tuple[Any, ...]]]
] = {}
for _cls in RECORDS.values():
    _names = [f.name for f in fields(_cls)]  # type: ignore[arg-type]
    _GETTERS[_cls] = (
        _tuple_getter(_names[: _cls.key_fields]),
        _tuple_getter(_names[_cls.key_fields :]),
    )


def encode(record: Record) -> tuple[bytes, bytes | None]:
    """One record as a RocksDB ``(key, value)``; value ``None`` means delete the key."""
    key_of, value_of = _GETTERS[type(record)]
    key = _SEP.join((record.prefix, *key_of(record))).encode()
    if record.deletes:
        return key, None
    return key, msgpack.packb(value_of(record))


def decode(key: bytes, value: bytes) -> Record:
    """The record that :func:`encode` turned into ``(key, value)`` (also one of format 1)."""
    prefix, *key_parts = key.decode().split(_SEP)
    cls = _BY_PREFIX.get(prefix)
    if cls is None:
        msg = f"the journal holds a record with key prefix {prefix!r}, unknown to this version; was it written by a newer millwheel?"
        raise ValueError(msg)
    rest = msgpack.unpackb(value, use_list=False)
    if cls is InjectorAdded and rest[0] is not None:
        rest = (tuple(rest[0]),)
    return cls(*key_parts, *rest)  # type: ignore[call-arg]


class Journal(Protocol):
    """Where the core writes its changes; see the module docstring for the records."""

    def load(self) -> Iterable[Record]:
        """Every record stored, in key order (computations first, then intervals, injectors, ...)."""
        ...

    def commit(self, records: Sequence[Record]) -> None:
        """Store ``records`` atomically and durably, or raise and store none of them."""
        ...

    def close(self) -> None: ...


class NullJournal:
    """Keeps nothing: an authority that forgets everything when it stops."""

    def load(self) -> Iterable[Record]:
        return ()

    def commit(self, records: Sequence[Record]) -> None:
        return None

    def close(self) -> None:
        return None


class MemoryJournal:
    """The RocksDB encoding in a dict: survives a new :class:`~watermark_authority.Authority`."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.commits = 0

    def load(self) -> Iterator[Record]:
        for key in sorted(self.data):
            yield decode(key, self.data[key])

    def commit(self, records: Sequence[Record]) -> None:
        encoded = [encode(r) for r in records]
        for key, value in encoded:
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value
        self.commits += 1

    def close(self) -> None:
        return None


class RocksJournal:
    """The journal in a RocksDB directory (``rocksdict``), one atomic write batch per commit.

    ``sync=False`` (the default) survives a kill -9 of the process: the write-ahead log is
    in the operating system's buffers before ``commit`` returns. ``sync=True`` fsyncs it.
    """

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = False) -> None:
        from rocksdict import Options, Rdict, WriteOptions

        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(self.path, options)
        self._write_options = WriteOptions()
        self._write_options.sync = sync

    def load(self) -> Iterator[Record]:
        for key, value in self._db.items():  # raw mode: bytes keys and values
            yield decode(cast(bytes, key), cast(bytes, value))

    def commit(self, records: Sequence[Record]) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for record in records:
            key, value = encode(record)
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._db.write(batch, self._write_options)

    def close(self) -> None:
        self._db.close()
