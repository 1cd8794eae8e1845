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
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

#: records looked up by id per batch, at most
MAX_LOOKUPS = 32
#: earlier bytes searched for one id, at most
SEARCH_BYTES = 256 << 20
_CHUNK = 8 << 20

#: ``(path, up to)`` of the bytes of the other files of the directory read so far
Others = Callable[[], Iterable[tuple[str, int]]]


def measure(
    p: Any, data: bytes, values: list[int], lo: int, hi: int, ts_field: str, id_field: str, full: str, others: Others | None
) -> tuple[int | None, int, int | None]:
    """``(newest, behind, early)`` of file progress ``p`` after the bytes ``data`` (read from
    ``p.pos``; ``values``: the plan's scan of their plausible timestamps), with ``behind``
    (the most a record ran behind the newest before it in its file) and ``early`` (the most
    a record ran before the time in the file's name) over first deliveries only;
    timestamps outside ``[lo, hi]`` (implausible) are not records."""
    newest = p.newest if p.newest is not None else (values[0] if values else None)
    most = newest
    rise = False  # the scan's values bound the lines' measure from above: most batches stop here
    for v in values:
        if most is not None and (most - v > p.behind or (p.time is not None and p.time - v > (p.early or 0))):
            rise = True
            break
        most = v if most is None else max(most, v)
    if not rise:
        return (max(values) if newest is None else max(newest, *values)) if values else newest, p.behind, p.early if p.time is None else (p.early or 0)
    lines = list(_lines(data, ts_field, lo, hi))
    newest = p.newest
    behind, early = p.behind, p.early or 0
    candidates = []  # (offset in data, line, how far behind the newest, how far before the file's time)
    for off, line, ts in lines:
        ref = ts if newest is None else newest
        d_behind = max(0, ref - ts)
        d_early = max(0, p.time - ts) if p.time is not None else 0
        if d_behind > behind or d_early > early:
            candidates.append((off, line, d_behind, d_early))
        newest = ts if newest is None else max(newest, ts)
    if candidates:
        copies: dict[int, bool] = {}
        lookups = [0]

        def first_delivery(off: int, line: bytes) -> bool:
            if off not in copies:
                lookups[0] += 1
                copies[off] = lookups[0] <= MAX_LOOKUPS and _read_before(line, id_field, full, p.pos + off, others)
            return not copies[off]

        for column in (2, 3):
            for c in sorted(candidates, key=lambda c: -c[column]):
                if c[column] <= (behind if column == 2 else early):
                    break
                if first_delivery(c[0], c[1]):
                    if column == 2:
                        behind = c[2]
                    else:
                        early = c[3]
                    break
    return newest, behind, early if p.time is not None else p.early


def _lines(data: bytes, ts_field: str, lo: int, hi: int) -> Iterable[tuple[int, bytes, int]]:
    """``(offset, line, timestamp)`` of each line of ``data`` with a plausible timestamp (its first ``"ts": N``)."""
    rx = re.compile(rb'"' + re.escape(ts_field.encode()) + rb'"\s*:\s*(-?[0-9]+)\s*[,}]')
    pos = 0
    for line in data.split(b"\n"):
        m = rx.search(line)
        if m is not None:
            ts = int(m.group(1))
            if lo <= ts <= hi:
                yield pos, line, ts
        pos += len(line) + 1


def _read_before(line: bytes, id_field: str, full: str, at: int, others: Others | None) -> bool:
    """Whether the record on ``line`` (at byte ``at`` of file ``full``) has an id that was
    read before: earlier in its file, or in what was read of another file."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return False
    rid = value.get(id_field) if isinstance(value, dict) else None
    if type(rid) is not str or not rid:
        return False  # no id: the record's id is its file and offset, which no copy shares
    key = re.escape(json.dumps(id_field).encode())
    spelled = {json.dumps(rid).encode(), json.dumps(rid, ensure_ascii=False).encode("utf-8", "surrogatepass")}
    rx = re.compile(key + rb"\s*:\s*(?:" + b"|".join(re.escape(s) for s in spelled) + rb")")
    budget = SEARCH_BYTES
    for path, upto in [(full, at), *(others() if others is not None else ())]:
        if budget <= 0:
            break
        start = max(0, upto - budget)
        budget -= upto - start
        if _found(rx, path, start, upto):
            return True
    return False


def _found(rx: re.Pattern[bytes], path: str, start: int, upto: int) -> bool:
    """Whether ``rx`` matches within bytes ``[start, upto)`` of file ``path``."""
    overlap = 4096
    try:
        with open(path, "rb") as fh:
            pos = start
            while pos < upto:
                fh.seek(max(start, pos - overlap))
                chunk = fh.read(min(_CHUNK, upto - pos) + (pos - max(start, pos - overlap)))
                if not chunk:
                    return False
                if rx.search(chunk):
                    return True
                pos += _CHUNK
    except OSError:
        return False
    return False
