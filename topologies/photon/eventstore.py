"""The second level of Photon's EventStore: queries looked up in the query logs (LogsEventStore, §3.4.2).

The first level, the CacheEventStore of §3.4.1, is the joiner's own per-key state: the
query reader (the ``queries`` injector) fills it, the low watermark and a retention
setting bound it (:class:`~.joiner.Joiner`). A click that misses it — its query was
evicted, or has been logged but not read yet — is looked up here.

Photon keeps a *log file map* (an entry every W seconds or M bytes, in BigTable) and
finds an event from the server, process and timestamp encoded in its id (§3.1). Here
the timestamp in the query id picks the candidate files by their time (the number in
their name, :func:`millwheel.file_time`): those within ``window_ms`` before it and the
declared lateness after it, nearest first; each candidate file is indexed once (query id
-> byte offset; a growing file is indexed further as it grows) and the line re-read on a
hit. The index lives in the worker process: it is a cache of immutable bytes, rebuilt
on demand after a restart, never part of a key's state.

>>> import json, os, tempfile
>>> d = tempfile.mkdtemp()
>>> q = {"query_id": "10.0.0.1:4000:1700000000500:1", "ts": 1700000000500, "ad_text": "buy flowers"}
>>> with open(os.path.join(d, "queries_1700000000000.jsonl"), "w") as f:
...     _ = f.write("{broken\\n" + json.dumps(q) + "\\n")
>>> store = LogsEventStore(d)
>>> store.lookup("10.0.0.1:4000:1700000000500:1")["ad_text"], store.lookup("10.0.0.1:4000:1700000000500:2")
('buy flowers', None)
>>> store.lookup("not-a-photon-id") is None      # no time in the id: no file to look in
True
"""

from __future__ import annotations

import json
import os
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from millwheel import file_time

from .generator import query_time

#: how long a directory must have been unchanged for a listing of it to be reused (2 s:
#: coarse file-system timestamps, and clocks of a network file system a little apart)
QUIET_NS = 2_000_000_000


class _FileIndex:
    """Query id -> byte offset of one log file, as far as it has been read."""

    __slots__ = ("upto", "offsets")

    def __init__(self) -> None:
        self.upto = 0
        self.offsets: dict[Any, int] = {}


class LogsEventStore:
    """Find a query in a directory of query logs by its id (see the module docstring)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        id_field: str = "query_id",
        ts_field: str = "ts",
        time_of: Callable[[str], int | None] = query_time,
        window_ms: int = 120_000,
        lateness_ms: int = 30_000,
        max_files: int = 256,
    ) -> None:
        self.directory = os.fspath(directory)
        self.id_field = id_field
        self.ts_field = ts_field
        self.time_of = time_of
        self.window_ms = window_ms
        self.lateness_ms = lateness_ms
        self.max_files = max_files
        self._index: OrderedDict[str, _FileIndex] = OrderedDict()
        #: the directory's log files and their times, as of the directory's modification
        #: time; and whether that listing may have raced a change (listed again next time)
        self._listing: tuple[int, list[tuple[str, int | None]], bool] | None = None
        #: that listing ordered by file time (times, names) and its files without a time, for
        #: :meth:`_candidates`; made again when the listing is
        self._by_time: (
            tuple[list[tuple[str, int | None]], list[int], list[str], list[str]] | None
        ) = None
        self.lookups = self.hits = self.lines_indexed = 0

    def lookup(self, query_id: Any) -> dict[str, Any] | None:
        """The query logged under ``query_id``, or ``None`` if no candidate file holds it (yet)."""
        self.lookups += 1
        t = self.time_of(query_id) if isinstance(query_id, str) else None
        if t is None:
            return None
        for name in self._candidates(t):
            offset = self._indexed(name).offsets.get(query_id)
            if offset is None:
                continue
            value = self._read(name, offset)
            if value is not None and value.get(self.id_field) == query_id:
                self.hits += 1
                return value
        return None

    def _files(self) -> list[tuple[str, int | None]]:
        """The log files and their times; listed again only when the directory changed (a
        file added, renamed or removed changes its modification time; a file growing does
        not, and :meth:`_indexed` reads what it grew by).

        File-system timestamps are coarse (a tick of a few ms): a file added in the same
        tick as the listing would leave the time unchanged. So a listing taken less than
        :data:`QUIET_NS` after the directory last changed is not trusted, and the next
        lookup lists again."""
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            return []
        cached = self._listing
        if cached is None or cached[0] != mtime or cached[2]:
            racy = time.time_ns() - mtime < QUIET_NS
            names = os.listdir(self.directory)
            files = [
                (name, file_time(name))
                for name in names
                if not name.startswith((".", "_"))
                and name.endswith((".jsonl", ".json", ".ndjson", ".log"))
            ]
            cached = self._listing = (mtime, files, racy)
        return cached[1]

    def _candidates(self, t: int) -> list[str]:
        """The files that may hold a query of time ``t``, nearest first (files without a time
        first of all): those within ``window_ms`` before ``t`` and ``lateness_ms`` after it,
        found by bisection in the listing ordered by time (a lookup per click: a scan of every
        file's time was most of a cached lookup's cost)."""
        files = self._files()
        by_time = self._by_time
        if by_time is None or by_time[0] is not files:
            timed = sorted((ft, name) for name, ft in files if ft is not None)
            by_time = self._by_time = (
                files,
                [ft for ft, _ in timed],
                [name for _, name in timed],
                [name for name, ft in files if ft is None],
            )
        _, times, names, untimed = by_time
        lo, hi = bisect_left(times, t - self.window_ms), bisect_right(times, t + self.lateness_ms)
        found = [(abs(times[i] - t), names[i]) for i in range(lo, hi)] + [
            (0, name) for name in untimed
        ]
        return [name for _, name in sorted(found)]

    def _indexed(self, name: str) -> _FileIndex:
        idx = self._index.get(name)
        if idx is None:
            idx = self._index[name] = _FileIndex()
            while len(self._index) > self.max_files:
                self._index.popitem(last=False)
        else:
            self._index.move_to_end(name)
        path = os.path.join(self.directory, name)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return idx
        if size <= idx.upto:
            return idx
        with open(path, "rb") as fh:
            fh.seek(idx.upto)
            data = fh.read(size - idx.upto)
        end = data.rfind(b"\n") + 1  # complete lines only: the file may be growing
        pos = 0
        while pos < end:
            nl = data.index(b"\n", pos)
            try:
                value = json.loads(data[pos:nl])
                qid = value.get(self.id_field) if isinstance(value, dict) else None
                if isinstance(qid, str):
                    idx.offsets.setdefault(qid, idx.upto + pos)
            except ValueError:
                pass  # a malformed line: the query injector dead-letters it
            self.lines_indexed += 1
            pos = nl + 1
        idx.upto += end
        return idx

    def _read(self, name: str, offset: int) -> dict[str, Any] | None:
        with open(os.path.join(self.directory, name), "rb") as fh:
            fh.seek(offset)
            value = json.loads(fh.readline())
        if not isinstance(value, dict) or type(value.get(self.ts_field)) is not int:
            return None
        return value
