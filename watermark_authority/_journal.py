"""The authority's journal: every change is written here before it is acknowledged (§7.2).

The core (:mod:`watermark_authority._core`) describes each change as a small tuple, an
*op*; a journal stores the latest op per key and hands them all back on restart. Two
journals share one encoding:

* :class:`RocksJournal` — RocksDB through ``rocksdict``, what the service uses;
* :class:`MemoryJournal` — a dict of the same bytes, for unit tests of restart semantics.

Ops (``name`` is a computation or an injector)::

    ("next_token", n)                                   the next sequencer token to hand out
    ("computation", name)                               a computation exists
    ("interval", comp, iv, token, value, pending, updated_ms)   an interval's owner and last report
    ("drop_interval", comp, iv)                         the interval was split or merged away
    ("retired", comp, iv, token)                        tombstone: reports for it are stale
    ("unretire", comp, iv)                              the name is an interval again
    ("injector", name, expected | None)                 an injector and its expected processes
    ("process", inj, proc, value, updated_ms)           an injector process's last report
    ("drop_process", inj, proc)                         the process left the expected set
    ("published", name, value)                          the highest low watermark ever shown
    ("pct", name, pct_key, value)                       the highest percentile watermark shown

Durability: a write goes to RocksDB's write-ahead log before :meth:`RocksJournal.commit`
returns, so it survives a kill -9 of the service. ``sync=True`` also fsyncs the log, so it
survives a machine crash, at the cost of one fsync per request.

>>> j = MemoryJournal()
>>> j.commit([("next_token", 7), ("computation", "c"), ("published", "c", 1_000)])
>>> list(j.load())
[('computation', 'c'), ('published', 'c', 1000), ('next_token', 7)]
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import msgpack

Op = tuple[Any, ...]

_SEP = "\x00"

# one key prefix per op kind; loading in key order creates computations and injectors
# before their intervals, processes and published values
_PREFIX = {
    "computation": "c",
    "interval": "i",
    "injector": "j",
    "published": "p",
    "pct": "q",
    "retired": "r",
    "next_token": "t",
    "process": "v",
}
_DELETES = {"drop_interval": "i", "unretire": "r", "drop_process": "v"}
_KIND_BY_PREFIX = {v: k for k, v in _PREFIX.items()}
# how many leading op fields form the key (after the kind)
_KEY_FIELDS = {"computation": 1, "interval": 2, "injector": 1, "published": 1, "pct": 2, "retired": 2, "next_token": 0, "process": 2}


def encode(op: Op) -> tuple[bytes, bytes | None]:
    """One op as a RocksDB ``(key, value)``; value ``None`` means delete the key."""
    kind = op[0]
    prefix = _DELETES.get(kind)
    if prefix is not None:
        return _SEP.join((prefix, *op[1:])).encode(), None
    n = _KEY_FIELDS[kind]
    key = _SEP.join((_PREFIX[kind], *op[1 : 1 + n])).encode()
    return key, msgpack.packb(op[1 + n :])


def decode(key: bytes, value: bytes) -> Op:
    """The op that :func:`encode` turned into ``(key, value)``."""
    parts = key.decode().split(_SEP)
    kind = _KIND_BY_PREFIX[parts[0]]
    rest = msgpack.unpackb(value, use_list=False)
    if kind == "injector" and rest[0] is not None:
        rest = (list(rest[0]),)
    return (kind, *parts[1:], *rest)


class Journal(Protocol):
    """Where the core writes its changes; see the module docstring for the ops."""

    def load(self) -> Iterable[Op]:
        """Every op stored, in key order (computations and injectors first)."""
        ...

    def commit(self, ops: Sequence[Op]) -> None:
        """Store ``ops`` atomically and durably, or raise and store none of them."""
        ...

    def close(self) -> None: ...


class NullJournal:
    """Keeps nothing: an authority that forgets everything when it stops."""

    def load(self) -> Iterable[Op]:
        return ()

    def commit(self, ops: Sequence[Op]) -> None:
        return None

    def close(self) -> None:
        return None


class MemoryJournal:
    """The RocksDB encoding in a dict: survives a new :class:`~watermark_authority.Authority`."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.commits = 0

    def load(self) -> Iterator[Op]:
        for key in sorted(self.data):
            yield decode(key, self.data[key])

    def commit(self, ops: Sequence[Op]) -> None:
        encoded = [encode(op) for op in ops]
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

    def load(self) -> Iterator[Op]:
        for key, value in self._db.items():
            yield decode(key, value)

    def commit(self, ops: Sequence[Op]) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for op in ops:
            key, value = encode(op)
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._db.write(batch, self._write_options)

    def close(self) -> None:
        self._db.close()
