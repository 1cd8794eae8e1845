"""Where the registry keeps its entries: one interface, three stores.

* :class:`RocksBackend` — the embedded single-node default: RocksDB through ``rocksdict``,
  one write batch per call, fsync'd before it returns (``sync=True``);
* :class:`MemoryBackend` — the same logic on a dict, for unit tests and doctests;
* :class:`~id_registry._etcd.EtcdBackend` — replicated on etcd (Raft), every conditional
  commit decided by etcd itself, so several registry servers may share one cluster.

A backend knows bytes, not semantics: the core (:class:`~id_registry.Registry`) builds keys
and values (:mod:`id_registry._model`) and decides what the answers mean. What a backend
promises:

* :meth:`Backend.insert_if_absent` stores each absent entry (and its time-index key) and
  returns the value already stored for the others, atomically per entry and durably
  before it returns; one call is one durable write (a write batch, or etcd transactions
  of at most ``max_txn_ops`` operations each). It refuses, with
  :class:`MetaChangedError` and nothing stored, if the metadata changed since the caller
  read it (another server moved the GC boundary or added a shard configuration);
* :meth:`Backend.write_meta` is a compare-and-set of the metadata, optionally only if no
  entry has an event time at or after a given time (a new shard configuration never
  re-shards an event already decided);
* reads (:meth:`Backend.get_many`) see every acknowledged write.

``Backend.writes`` counts durable writes, which is how the tests see server-side batching
coalesce requests.
"""

from __future__ import annotations

import abc
import bisect
import os
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import compress, repeat
from typing import Any, ClassVar, cast

from id_registry._errors import ReshardError
from id_registry._model import (
    INDEX_END,
    INDEX_PREFIX,
    META_KEY,
    Meta,
    entry_of_index,
    index_time_key,
)

#: ``(entry key, time-index key, expected value, new value or None to delete both keys)``
Replace = tuple[bytes, bytes, bytes, bytes | None]


class MetaChangedError(Exception):
    """The store's metadata is not the one the caller read: re-read it and try again."""


class Backend(abc.ABC):
    """The store behind a :class:`~id_registry.Registry` (see the module docstring)."""

    #: a short name for status pages: ``rocksdb``, ``memory``, ``etcd``
    kind: ClassVar[str]

    def __init__(self) -> None:
        #: durable writes made so far
        self.writes = 0

    @abc.abstractmethod
    def read_meta(self) -> Meta | None:
        """The stored metadata with its revision, or ``None`` for a new store."""

    @abc.abstractmethod
    def write_meta(
        self, meta: Meta, *, expected: Meta | None, no_entries_from: int | None = None
    ) -> Meta:
        """Store ``meta`` if the stored metadata is still ``expected`` (``None``: absent), else
        raise :class:`MetaChangedError`; with ``no_entries_from``, also only if no entry has an
        event time at or after it, else raise :class:`~id_registry.ReshardError`. Returns
        ``meta`` with its new revision."""

    @abc.abstractmethod
    def insert_if_absent(
        self,
        keys: Sequence[bytes],
        index_keys: Sequence[bytes],
        values: Sequence[bytes],
        meta: Meta,
    ) -> list[bytes | None]:
        """For each entry key (distinct): if absent, store it with its value and its time-index key
        (answer ``None``), else answer the stored value."""

    @abc.abstractmethod
    def get_many(self, keys: Sequence[bytes], meta: Meta) -> list[bytes | None]:
        """The stored value of each key, or ``None``; :class:`MetaChangedError` if ``meta`` is stale."""

    @abc.abstractmethod
    def replace_if(self, ops: Sequence[Replace], meta: Meta) -> list[bool]:
        """For each op: if the entry's value is still ``expected``, replace it (or delete the entry and
        its time-index key); True if done. :class:`MetaChangedError` if ``meta`` is stale."""

    @abc.abstractmethod
    def index_below(self, boundary_ms: int, limit: int) -> list[bytes]:
        """Up to ``limit`` time-index keys of entries with an event time before ``boundary_ms``, oldest first."""

    @abc.abstractmethod
    def delete_indexed(self, index_keys: Sequence[bytes]) -> int:
        """Delete each time-index key and its entry; returns how many entries there were."""

    @abc.abstractmethod
    def latest_event_time(self) -> int | None:
        """The latest event time of any entry (``None`` if there is none)."""

    def describe(self) -> dict[str, Any]:
        """What the status page shows about the store (no secrets)."""
        return {"kind": self.kind, "durable_writes": self.writes}

    def close(self) -> None:
        return None


class _LocalBackend(Backend):
    """A backend on one node, used by one registry thread: reads and writes need no conditions
    beyond what the single writer sees. Subclasses provide the store."""

    def __init__(self) -> None:
        super().__init__()
        self._revision = 0

    # the store
    @abc.abstractmethod
    def _get(self, key: bytes) -> bytes | None: ...

    @abc.abstractmethod
    def _write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        """Apply ``puts`` and ``deletes`` atomically and durably."""

    @abc.abstractmethod
    def _keys(self, start: bytes, end: bytes, *, reverse: bool = False) -> Iterator[bytes]:
        """Keys in ``[start, end)``, in order (or reverse order)."""

    # the interface
    def read_meta(self) -> Meta | None:
        raw = self._get(META_KEY)
        if raw is None:
            return None
        self._revision = max(self._revision, 1)
        return Meta.decode(raw, self._revision)

    def write_meta(
        self, meta: Meta, *, expected: Meta | None, no_entries_from: int | None = None
    ) -> Meta:
        stored = self.read_meta()
        if (stored is None) != (expected is None) or (
            stored is not None and expected is not None and stored.revision != expected.revision
        ):
            raise MetaChangedError
        if no_entries_from is not None:
            latest = self.latest_event_time()
            if latest is not None and latest >= no_entries_from:
                raise reshard_refused(no_entries_from, latest)
        self._write([(META_KEY, meta.encode())], [])
        self._revision += 1
        return Meta(meta.gc_boundary_ms, meta.shards, self._revision)

    def _check(self, meta: Meta) -> None:
        if meta.revision != self._revision:
            raise MetaChangedError

    def insert_if_absent(
        self,
        keys: Sequence[bytes],
        index_keys: Sequence[bytes],
        values: Sequence[bytes],
        meta: Meta,
    ) -> list[bytes | None]:
        self._check(meta)
        out = list(map(self._get, keys))
        new = [old is None for old in out]
        if any(new):
            puts = list(zip(compress(keys, new), compress(values, new), strict=True))
            self._write(puts + [(k, b"") for k in compress(index_keys, new)], [])
        return out

    def get_many(self, keys: Sequence[bytes], meta: Meta) -> list[bytes | None]:
        self._check(meta)
        get = self._get
        return [get(k) for k in keys]

    def replace_if(self, ops: Sequence[Replace], meta: Meta) -> list[bool]:
        self._check(meta)
        puts: list[tuple[bytes, bytes]] = []
        deletes: list[bytes] = []
        done: list[bool] = []
        for key, index, expected, new in ops:
            ok = self._get(key) == expected
            if ok and new is None:
                deletes += [key, index]
            elif ok and new is not None:
                puts.append((key, new))
            done.append(ok)
        if puts or deletes:
            self._write(puts, deletes)
        return done

    def index_below(self, boundary_ms: int, limit: int) -> list[bytes]:
        out = []
        for key in self._keys(INDEX_PREFIX, index_time_key(boundary_ms)):
            out.append(key)
            if len(out) >= limit:
                break
        return out

    def delete_indexed(self, index_keys: Sequence[bytes]) -> int:
        if not index_keys:
            return 0
        entries = [entry_of_index(k)[0] for k in index_keys]
        self._write([], [*entries, *index_keys])
        return len(index_keys)

    def latest_event_time(self) -> int | None:
        for key in self._keys(INDEX_PREFIX, INDEX_END, reverse=True):
            return entry_of_index(key)[1]
        return None


def reshard_refused(effective_from_ms: int, latest: int) -> ReshardError:
    msg = (
        f"a shard configuration effective from {effective_from_ms} would re-shard events already committed "
        f"(the latest event time stored is {latest}); choose effective_from_ms > {latest}"
    )
    return ReshardError(msg)


class MemoryBackend(_LocalBackend):
    """The local backend's logic on a dict: forgets everything with the process (tests, doctests)."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[bytes, bytes] = {}
        self._sorted: list[bytes] | None = None

    def _get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def _write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        for key in deletes:
            self.data.pop(key, None)
        self.data.update(puts)
        self._sorted = None
        self.writes += 1

    def _keys(self, start: bytes, end: bytes, *, reverse: bool = False) -> Iterator[bytes]:
        if self._sorted is None:
            self._sorted = sorted(self.data)
        keys = self._sorted
        lo, hi = bisect.bisect_left(keys, start), bisect.bisect_left(keys, end)
        return iter(keys[lo:hi][::-1] if reverse else keys[lo:hi])


class RocksBackend(_LocalBackend):
    """RocksDB in ``path`` (``rocksdict``), one write batch per call.

    ``sync=True`` (the default) fsyncs RocksDB's write-ahead log before a write returns, so an
    acknowledged commit survives a machine crash; ``sync=False`` survives a kill -9 of the
    process only. One process at a time: RocksDB locks the directory.
    """

    kind = "rocksdb"

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = True) -> None:
        from rocksdict import BlockBasedOptions, Options, Rdict, WriteOptions

        super().__init__()
        self.path = os.fspath(path)
        self.sync = sync
        os.makedirs(self.path, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        table = BlockBasedOptions()
        table.set_bloom_filter(
            10, False
        )  # most commits are of new ids: absent keys answered from the filter
        options.set_block_based_table_factory(table)
        self._db = Rdict(self.path, options)
        self._write_options = WriteOptions()
        self._write_options.sync = sync

    def _get(self, key: bytes) -> bytes | None:
        return cast("bytes | None", self._db.get(key))

    def insert_if_absent(
        self,
        keys: Sequence[bytes],
        index_keys: Sequence[bytes],
        values: Sequence[bytes],
        meta: Meta,
    ) -> list[bytes | None]:
        from rocksdict import WriteBatch

        self._check(meta)
        out = list(
            map(self._db.get, keys)
        )  # the hot path of every commit: C loops, straight into one batch
        new = [old is None for old in out]
        if any(new):
            batch = WriteBatch(raw_mode=True)
            deque(map(batch.put, compress(keys, new), compress(values, new)), maxlen=0)
            deque(map(batch.put, compress(index_keys, new), repeat(b"")), maxlen=0)
            self._db.write(batch, self._write_options)
            self.writes += 1
        return out

    def _write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for key in deletes:
            batch.delete(key)
        for key, value in puts:
            batch.put(key, value)
        self._db.write(batch, self._write_options)
        self.writes += 1

    def _keys(self, start: bytes, end: bytes, *, reverse: bool = False) -> Iterator[bytes]:
        it = self._db.iter()
        if reverse:
            it.seek_for_prev(end)
            while it.valid() and it.key() >= end:
                it.prev()
            while it.valid() and it.key() >= start:
                yield it.key()
                it.prev()
        else:
            it.seek(start)
            while it.valid() and it.key() < end:
                yield it.key()
                it.next()

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["sync"] = self.sync
        try:
            out["estimated_keys"] = self._db.property_int_value("rocksdb.estimate-num-keys")
        except Exception:  # noqa: BLE001 - a missing property must not break the status page
            out["estimated_keys"] = None
        return out

    def close(self) -> None:
        self._db.close()
