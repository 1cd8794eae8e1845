"""The disorder a log injector measures, over first deliveries only (MillWheel §4.5).

A run's summary and status report how far out of order an injector read its records
(:func:`~millwheel._logplan.disorder`) and advise the ``lateness_ms`` that would have kept
its late records. A copy of a record delivered again later (the same id: a log shipper's
retry, a re-injection) is no late record to keep: dedup drops it before the late check
(§6.1.1), and its original has been counted. So the measure leaves out a record whose id
was read before — earlier in its file, or in the bytes read so far of another file of the
directory. A duplicate 242 s behind made the advice say 242 s of lateness.

The plan scans timestamps only (:func:`~millwheel._logplan.timestamps`), without ids; a
record is looked at by id only when it would raise the measure, most behind first, and
the first that is not a copy sets it — a few lookups per batch. At most
:data:`MAX_LOOKUPS` per batch, each over at most :data:`SEARCH_BYTES` of earlier bytes;
past them a record counts as a first delivery (the measure errs high, as before).

A lookup searches this batch's bytes of the record's file with a plain byte search, and
the bytes read before it — of its file and of the others — in this process's index of
their ids (:func:`_ids`: each byte scanned once, by one C ``findall``, and kept while the
file is the same one, within :data:`INDEX_BYTES`). Searching every earlier file for every
lookup cost Photon's query log planner ~2.4 s of CPU a pass over 19 MB in 145 files (most
delayed queries are first deliveries, so each search ran to the end); the index, ~0.25 s
(``bench/results/logplan_lookups_20261128.json``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: ``import millwheel`` loads no numpy for a log source
    import numpy as np

#: records looked up by id per batch, at most
MAX_LOOKUPS = 8
#: earlier bytes searched for one id, at most
SEARCH_BYTES = 64 << 20

#: ``(path, up to)`` of the bytes of the other files of the directory read so far
Others = Callable[[], Iterable[tuple[str, int]]]
#: one plan's ids of ``(path, up to)``: each file's index looked up once per plan, not once
#: per lookup (a plan of 241 files made ~600 lookups over ~240 earlier files each: 67k
#: look-ups, each with a ``stat``, ~1 s of a 1.7 s plan)
PlanIds = dict[tuple[str, int], "set[bytes] | None"]


def measure(
    p: Any,
    data: bytes,
    values: list[int],
    ts_field: str,
    id_field: str,
    full: str,
    others: Others | None,
    plan_ids: PlanIds | None = None,
) -> tuple[int | None, int, int | None]:
    """``(newest, behind, early)`` of file progress ``p`` after the bytes ``data`` (read from
    ``p.pos``; ``values``: the plan's scan of their plausible timestamps), with ``behind``
    (the most a record ran behind the newest before it in its file) and ``early`` (the most
    a record ran before the time in the file's name) over first deliveries only (the
    plan leaves implausible timestamps out of ``values``: they are no records).

    The candidates (records that would raise either measure) are found over ``values`` with
    numpy; only those looked up by id are located in ``data`` (the plan's scan costs about
    as much as it did before the measure left copies out: ``bench/logfile_plan_bench.py``).
    """
    if not values:
        return p.newest, p.behind, p.early if p.time is None else (p.early or 0)
    import numpy as np

    newest: int = values[0] if p.newest is None else p.newest
    v = np.asarray(values, dtype=np.int64)
    before = np.maximum.accumulate(
        np.concatenate((np.array([newest], np.int64), v[:-1]))
    )  # the newest before each record
    d_behind = np.maximum(before - v, 0)
    d_early = np.maximum(p.time - v, 0) if p.time is not None else np.zeros(len(v), np.int64)
    newest = max(newest, int(v.max()))
    behind, early = p.behind, p.early or 0
    raises = np.flatnonzero((d_behind > behind) | (d_early > early))
    if len(raises):
        plan_ids = {} if plan_ids is None else plan_ids
        lines = _Lines(data, ts_field, v)
        copies: dict[int, bool] = {}
        lookups = [0]
        listed: list[list[tuple[str, int]]] = []

        def earlier() -> list[tuple[str, int]]:  # the other files, listed once for this file
            if not listed:
                listed.append(list(others()) if others is not None else [])
            return listed[0]

        def first_delivery(i: int) -> bool:
            if i not in copies:
                lookups[0] += 1
                found = lines.line(i) if lookups[0] <= MAX_LOOKUPS else None
                copies[i] = found is not None and _read_before(
                    found[1], id_field, data[: found[0]], full, p.pos, earlier, plan_ids
                )
            return not copies[i]

        for measured in (d_behind, d_early):
            current = behind if measured is d_behind else early
            for i in raises[np.argsort(-measured[raises], kind="stable")].tolist():
                if measured[i] <= current:
                    break
                if first_delivery(i):
                    if measured is d_behind:
                        behind = int(measured[i])
                    else:
                        early = int(measured[i])
                    break
    return newest, behind, early if p.time is not None else p.early


class _Lines:
    """The line of the plan's ``i``-th plausible timestamp in ``data``, found when asked: the
    bytes' timestamp members are listed once, by value as spelled (one C scan of the bytes,
    at the first lookup, where a pattern compiled per lookup cost the sample's first plan
    ~0.3 s), and the hit of the same rank among the records with that value is taken.
    ``None`` when the hits do not match the scan one to one (a malformed line the scan
    parsed alone): the record then counts as a first delivery, which errs high, as the
    measure did before it left copies out."""

    def __init__(self, data: bytes, ts_field: str, values: np.ndarray) -> None:
        self.data, self.ts_field, self.values = data, ts_field, values
        self._hits: dict[bytes, list[int]] | None = None

    def line(self, i: int) -> tuple[int, bytes] | None:
        """``(offset in data, line)`` of the ``i``-th plausible timestamp."""
        import numpy as np

        data, value = self.data, int(self.values[i])
        if self._hits is None:
            self._hits = {}
            for m in _ts_member(self.ts_field).finditer(data):
                self._hits.setdefault(m.group(1), []).append(m.start())
        same = self.values == value
        hits = self._hits.get(str(value).encode(), [])
        if len(hits) != int(np.count_nonzero(same)):
            return None
        at = hits[int(np.count_nonzero(same[:i]))]
        start = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        return start, data[start : len(data) if end < 0 else end]


@functools.lru_cache(maxsize=16)
def _ts_member(ts_field: str) -> re.Pattern[bytes]:
    """A JSON member ``"<ts_field>": <integer>`` ended by ``,`` or ``}``: the integer as spelled (group 1)."""
    return re.compile(rb'"' + re.escape(ts_field.encode()) + rb'"\s*:\s*(-?\d+)\s*[,}]')


def _read_before(
    line: bytes,
    id_field: str,
    batch: bytes,
    full: str,
    pos: int,
    others: Others | None,
    plan_ids: PlanIds,
) -> bool:
    """Whether the record on ``line`` has an id that was read before: in ``batch`` (the bytes
    of its file read in this batch before it), in its file ``full`` before ``pos`` (where
    this batch began), or in what was read of another file — at most :data:`SEARCH_BYTES`
    of files before this batch, its own file first. ``plan_ids``: the ids of each
    ``(path, up to)`` already looked up in this plan (a file's bytes before a position do
    not change while one plan runs), filled as it goes."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return False
    rid = value.get(id_field) if isinstance(value, dict) else None
    if type(rid) is not str or not rid:
        return False  # no id: the record's id is its file and offset, which no copy shares
    spelled = {
        json.dumps(rid)[1:-1].encode(),
        json.dumps(rid, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass"),
    }
    if any(s in batch for s in spelled):  # a plain byte search first, the pattern on a hit
        key = re.escape(json.dumps(id_field).encode())
        alts = b"|".join(re.escape(s) for s in spelled)
        if re.search(key + rb'\s*:\s*"(?:' + alts + rb')"', batch):
            return True
    budget = SEARCH_BYTES
    for path, upto in [(full, pos), *(others() if others is not None else ())]:
        if budget <= 0:
            break
        if upto <= 0:
            continue
        budget -= min(upto, budget)
        if (path, upto) not in plan_ids:
            plan_ids[(path, upto)] = _ids(path, id_field, upto)
        seen = plan_ids[(path, upto)]
        if seen is not None and not seen.isdisjoint(spelled):
            return True
    return False


class _FileIds:
    """The ids (as spelled in the file) of a file's bytes ``[base, upto)``."""

    __slots__ = ("base", "ids", "inode", "upto")

    def __init__(self, inode: tuple[int, int], base: int) -> None:
        self.inode, self.base, self.upto = inode, base, base
        self.ids: set[bytes] = set()


#: this process's index of the ids in log files, least recently used first: a cache of
#: immutable bytes (a file that shrank or was replaced is indexed again), never state.
#: Each byte is scanned once, where a search per lookup scanned every earlier file again
_INDEX: OrderedDict[tuple[str, str], _FileIds] = OrderedDict()
#: bytes the index covers, at most (least recently used files are dropped first)
INDEX_BYTES = 4 * SEARCH_BYTES
_indexed = [0]
_LOCK = threading.Lock()


def _ids(path: str, id_field: str, upto: int) -> set[bytes] | None:
    """The ids in the bytes of ``path`` before ``upto`` (the last :data:`SEARCH_BYTES` of them
    at least); ``None`` when the file cannot be read. Bytes indexed once are trusted while
    the file is the same one (a log file only grows): one that shrank or was replaced is
    indexed anew. One caller at a time (plans may run on more than one thread)."""
    with _LOCK:
        return _ids_locked(path, id_field, upto)


def _ids_locked(path: str, id_field: str, upto: int) -> set[bytes] | None:
    key = (path, id_field)
    try:
        st = os.stat(path)
    except OSError:
        return None
    inode = (st.st_dev, st.st_ino)
    f = _INDEX.get(key)
    window = max(0, upto - SEARCH_BYTES)
    if f is not None and f.inode == inode and f.upto == upto <= st.st_size and f.base <= window:
        _INDEX.move_to_end(key)
        return f.ids
    if (
        f is None
        or f.inode != inode
        or st.st_size < f.upto
        or f.upto > upto  # asked for less than is indexed (a replay in this process)
        or upto - f.base > 2 * SEARCH_BYTES
    ):
        _forget(key)
        f = _INDEX[key] = _FileIds(inode, window)
    _INDEX.move_to_end(key)
    try:
        with open(path, "rb") as fh:
            fh.seek(f.upto)
            data = fh.read(upto - f.upto)
    except OSError:
        return None
    f.ids.update(_id_pattern(id_field).findall(data))
    f.upto += len(data)
    _indexed[0] += len(data)
    while _indexed[0] > INDEX_BYTES and len(_INDEX) > 1:
        _forget(next(iter(_INDEX)))
    return f.ids


def _forget(key: tuple[str, str]) -> None:
    old = _INDEX.pop(key, None)
    if old is not None:
        _indexed[0] -= old.upto - old.base


@functools.lru_cache(maxsize=16)
def _id_pattern(id_field: str) -> re.Pattern[bytes]:
    """A JSON member ``"<id_field>": "<string>"``: the string's bytes as spelled (group 1)."""
    return re.compile(
        re.escape(json.dumps(id_field).encode()) + rb'\s*:\s*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"'
    )
