"""``LogFileSource``: a directory of growing JSON-lines log files (Photon §3, MillWheel §5.2, Fig. 10).

The definition, the file-time rule and the line parser are pure Python, shared by the
in-memory harness (:meth:`LogFileSource.batches`) and the Spark runtime's streaming
reader (``millwheel/runtime/_logfiles.py``), so both backends read the same records,
make the same dead letters and send them under the same injector low watermark.

* Every ``*.jsonl`` / ``*.json`` / ``*.ndjson`` / ``*.log`` file in ``path`` (not hidden,
  not starting with ``_``) is a log; a file may keep growing: only complete lines (ending
  in ``\\n``) are read.
* A line is a JSON object with the record id in ``id_field`` (default ``id``; when absent
  the id is ``<file>:<byte offset>``) and the timestamp, integer ms, in ``ts_field``
  (default ``ts``). Anything else — broken JSON, not an object, a missing, non-integer or
  out-of-range timestamp, an id that is not a non-empty string — becomes a dead letter
  (:class:`~millwheel.DeadLetter`, stage ``malformed_line``) with the reason, file and
  byte offset, timestamped with the file's time.
* A file's *time* (Fig. 10: when it was opened) comes from its name, see
  :func:`file_time`; a name without a time falls back to the timestamp of the file's
  first record.
* The injector low watermark is the time of the oldest unfinished file minus
  ``lateness_ms`` (Fig. 10), and ``MAX_TIMESTAMP`` once every file is finished and the
  directory is complete (``_DONE``, or ``finite=True``). Records are sent under the time
  of their own file (as if files were delivered one at a time, in time order), so a record
  older than its file's time minus ``lateness_ms`` is late on both backends.

>>> import json, os, tempfile
>>> d = tempfile.mkdtemp()
>>> with open(os.path.join(d, "queries-2026-01-01.jsonl"), "w") as f:
...     _ = f.write(json.dumps({"id": "a", "ts": 1767225600500, "query": "cats"}) + "\\n" + "{oops\\n")
>>> src = LogFileSource(d, finite=True)
>>> [(len(b.records), len(b.dead_letters), b.low_watermark) for b in src.batches()]
[(0, 0, 1767225600000), (1, 1, 1767225600000), (0, 0, 9223372036854775807)]
>>> dead = list(src.batches())[1].dead_letters[0].value
>>> dead.stage, dead.reason[:11], dead.offset
('malformed_line', 'broken JSON', 50)
"""

from __future__ import annotations

import calendar
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from millwheel._deadletter import malformed_line
from millwheel._errors import TopologyError
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, Record
from millwheel._sources import Source, SourceBatch

LOG_SUFFIXES = (".jsonl", ".json", ".log", ".ndjson")

# epoch milliseconds (12-13 digits) or seconds (10 digits), not part of a longer number
_EPOCH = re.compile(r"(?<![0-9])([0-9]{13}|[0-9]{12}|[0-9]{10})(?![0-9])")
# an ISO-like date with an optional time: 2026-01-01, 20260101, 2026-01-01T10-30, 2026-01-01_103000
_DATE = re.compile(
    r"(?<![0-9])(\d{4})-?(\d{2})-?(\d{2})"
    r"(?:[T_ \-]?(\d{2})[:\-]?(\d{2})(?:[:\-]?(\d{2}))?)?(?![0-9])"
)


def file_time(name: str) -> int | None:
    """The time (ms since the epoch, UTC) a log file's name says it was opened, or ``None``.

    The rule, tried on the name without its suffix, last match first:

    1. an epoch timestamp: 13 or 12 digits are milliseconds, 10 digits are seconds
       (``queries-1700000000000.jsonl``, ``q_1700000000.log``);
    2. a date with an optional time of day, UTC: ``queries-2026-01-01.jsonl``,
       ``clicks-20260101.jsonl``, ``clicks-2026-01-01T10-30.jsonl``, ``x_2026-01-01_103000.log``;
    3. otherwise ``None``: the source then uses the timestamp of the file's first record.

    A separator before the number is never a minus sign, and short numbers (``part-0003``)
    are sequence numbers, not times.

    >>> file_time("queries-1700000000000.jsonl"), file_time("q_1700000000.log")
    (1700000000000, 1700000000000)
    >>> file_time("queries-2026-01-01.jsonl"), file_time("clicks-2026-01-01T10-30.jsonl")
    (1767225600000, 1767263400000)
    >>> file_time("part-0003.jsonl") is None
    True
    """
    stem = name.rsplit(".", 1)[0] if "." in name else name
    epochs = list(_EPOCH.finditer(stem))
    dates = list(_DATE.finditer(stem))
    best_epoch = epochs[-1] if epochs else None
    best_date = None
    for m in reversed(dates):
        y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
        hh, mm, ss = (int(m.group(i)) if m.group(i) else 0 for i in (4, 5, 6))
        if 1970 <= y <= 9999 and 1 <= mo <= 12 and 1 <= d <= 31 and hh < 24 and mm < 60 and ss < 61:
            best_date = (m, calendar.timegm((y, mo, d, hh, mm, ss, 0, 0, 0)) * 1000)
            break
    if best_date is not None and (best_epoch is None or best_date[0].start() >= best_epoch.start()):
        return best_date[1]
    if best_epoch is not None:
        digits = best_epoch.group(1)
        return int(digits) * 1000 if len(digits) == 10 else int(digits)
    return None


def is_log_file(name: str) -> bool:
    return not name.startswith((".", "_")) and name.endswith(LOG_SUFFIXES)


class MalformedLine(ValueError):
    """A line that is not a record; the message is the reason."""


_INT64_MIN, _INT64_MAX = MIN_TIMESTAMP, MAX_TIMESTAMP


def parse_line(line: bytes, id_field: str, ts_field: str, file: str, offset: int) -> tuple[str, int, object]:
    """``(id, timestamp, value)`` of one line, or :class:`MalformedLine` with the reason."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as exc:
        msg = f"broken JSON: {str(exc)[:200]}"
        raise MalformedLine(msg) from None
    if not isinstance(value, dict):
        msg = f"not a JSON object: {type(value).__name__}"
        raise MalformedLine(msg)
    ts = value.get(ts_field)
    if ts is None:
        msg = f"missing timestamp field {ts_field!r}"
        raise MalformedLine(msg)
    if type(ts) is not int:
        msg = f"timestamp field {ts_field!r} is not an integer (ms since the epoch): {str(ts)[:80]!r}"
        raise MalformedLine(msg)
    if not _INT64_MIN < ts < _INT64_MAX:
        msg = f"timestamp field {ts_field!r} is outside the 64-bit range: {ts}"
        raise MalformedLine(msg)
    rid = value.get(id_field)
    if rid is None:
        rid = f"{file}:{offset}"
    elif type(rid) is not str or not rid:
        msg = f"id field {id_field!r} must be a non-empty string, got {type(rid).__name__} {str(rid)[:80]!r}"
        raise MalformedLine(msg)
    return rid, ts, value


@dataclass(slots=True)
class Chunk:
    """What one byte range of a log file holds: records and dead letters, in file order."""

    records: list[Record]
    dead_letters: list[Record]


def parse_chunk(
    data: bytes,
    *,
    start: int,
    file: str,
    file_time: int,
    injector: str,
    stream: str,
    id_field: str,
    ts_field: str,
) -> Chunk:
    """Parse complete lines of ``data`` (read from byte ``start`` of ``file``)."""
    records: list[Record] = []
    dead: list[Record] = []
    pos, n = 0, len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        if nl < 0:
            nl = n
        line = data[pos:nl]
        offset = start + pos
        pos = nl + 1
        if not line.strip():
            continue
        try:
            rid, ts, value = parse_line(line, id_field, ts_field, file, offset)
        except MalformedLine as exc:
            dead.append(malformed_line(injector, stream, file, offset, str(exc), line, file_time))
            continue
        records.append(Record(None, value, ts, rid, stream))
    return Chunk(records, dead)


def first_timestamp(data: bytes, ts_field: str) -> int | None:
    """The timestamp of the first valid record in ``data`` (a file without a time in its name)."""
    for line in data.split(b"\n"):
        try:
            v = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(v, dict) and type(v.get(ts_field)) is int and _INT64_MIN < v[ts_field] < _INT64_MAX:
            return int(v[ts_field])
    return None


# ---- reading plan: the same on both backends ------------------------------------------------
#
# An *offset* is ``{"files": {name: [byte offset, file time, finished, reached]}, "lw": ...}``:
# how far each file has been read, its time, whether it is finished, the newest record
# timestamp read from it so far, and the injector low watermark. The Spark reader keeps
# offsets in Spark's offset log (so a replayed batch reads exactly the same bytes); the
# in-memory source walks the same plans, so both backends cut the input into the same
# batches and send every record under the same watermark.

_TAIL = 1 << 16


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How a log directory is read; see :class:`LogFileSource`."""

    path: str
    id_field: str = "id"
    ts_field: str = "ts"
    idle_finish_ms: int | None = 60_000
    finite: bool = False
    lateness_ms: int = 0
    max_bytes_per_batch: int = 64 << 20
    finish_on_rotation: bool = True


def initial_offset() -> dict[str, Any]:
    return {"files": {}, "lw": MIN_TIMESTAMP}


def _entry(files: dict[str, list[Any]], name: str) -> list[Any]:
    e = files.get(name)
    if e is None:
        return [0, None, 0, None]
    return list(e) + [None] * (4 - len(e))  # offsets written before ``reached`` existed


def _last_newline(path: str, start: int, size: int) -> int:
    """Offset just past the last ``\\n`` in ``[start, size)``, or ``start`` if none."""
    with open(path, "rb") as fh:
        hi = size
        while hi > start:
            lo = max(start, hi - _TAIL)
            fh.seek(lo)
            chunk = fh.read(hi - lo)
            i = chunk.rfind(b"\n")
            if i >= 0:
                return lo + i + 1
            hi = lo
    return start


def _next_newline(path: str, start: int, size: int) -> int:
    """Offset just past the first ``\\n`` at or after ``start``, or ``start`` if none."""
    with open(path, "rb") as fh:
        fh.seek(start)
        pos = start
        while pos < size:
            chunk = fh.read(min(_TAIL, size - pos))
            if not chunk:
                break
            i = chunk.find(b"\n")
            if i >= 0:
                return pos + i + 1
            pos += len(chunk)
    return start


def _last_timestamp(path: str, start: int, end: int, ts_field: str) -> int | None:
    """The timestamp of the last valid record in ``[start, end)`` (read from the end)."""
    with open(path, "rb") as fh:
        lo = max(start, end - _TAIL)
        fh.seek(lo)
        lines = fh.read(end - lo).split(b"\n")
    for line in reversed(lines[1:] if lo > start else lines):
        ts = first_timestamp(line, ts_field)
        if ts is not None:
            return ts
    return None


def plan_offset(start: dict[str, Any], opts: ReadOptions, now_ms: int) -> dict[str, Any]:
    """The next offset: how far to read each file in one batch, and the injector low watermark.

    * Files are read in name order up to ``max_bytes_per_batch`` bytes, complete lines
      only; a batch that has read nothing yet takes one line longer than the budget whole.
    * A file is *finished* once read to its end and: a ``<name>.done`` or ``_DONE`` marker
      exists, or the source is ``finite``, or a newer file exists (rotation, when
      ``finish_on_rotation``), or it has not grown for ``idle_finish_ms``.
    * The injector low watermark (Fig. 10, with progress): each unfinished file promises
      ``max(its time, newest timestamp read from it) - lateness_ms``, where progress is
      taken only when a batch has read the file up to its end (tailing a live file): a
      batch cut inside a file by the byte budget promises the file's time; the watermark is the
      smallest promise, ``MAX_TIMESTAMP`` once every file is finished and the input is
      complete (``_DONE`` or ``finite``), and never goes back.
    """
    prev: dict[str, list[Any]] = start["files"]
    path = opts.path
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    present = set(names)
    dir_done = "_DONE" in present
    logs = [n for n in names if is_log_file(n)]
    files: dict[str, list[Any]] = {}
    budget = opts.max_bytes_per_batch
    times: dict[str, int | None] = {}
    for name in logs:
        full = os.path.join(path, name)
        st = os.stat(full)
        pos, ftime, _, reached = _entry(prev, name)
        new_pos = pos
        caught_up = False  # read every complete line the file has now
        if st.st_size > pos and budget > 0:
            end = min(st.st_size, pos + budget)
            caught_up = end >= st.st_size
            new_pos = _last_newline(full, pos, end)
            if new_pos == pos and end < st.st_size:
                # the next line does not fit what is left of the budget: a batch that has
                # read nothing yet takes it whole, any other batch stops here
                new_pos = _next_newline(full, pos, st.st_size) if budget == opts.max_bytes_per_batch else pos
                budget = 0 if new_pos == pos else budget - (new_pos - pos)
            else:
                budget -= new_pos - pos
        if ftime is None:
            ftime = file_time(name)
            if ftime is None and new_pos > 0:
                with open(full, "rb") as fh:
                    ftime = first_timestamp(fh.read(min(new_pos, _TAIL)), opts.ts_field)
        if new_pos > pos and caught_up:
            # progress counts once the reader is at the file's end (a live file being
            # tailed); a batch that stops inside a file because of the byte budget promises
            # only the file's time, so where batches are cut never makes records late
            last = _last_timestamp(full, pos, new_pos, opts.ts_field)
            if last is not None and (reached is None or last > reached):
                reached = last
        times[name] = ftime
        files[name] = [new_pos, ftime, 0, reached, st.st_size, st.st_mtime]
    for name in logs:
        new_pos, ftime, _, reached, size, mtime = files[name]
        read_all = new_pos >= size
        newer = opts.finish_on_rotation and ftime is not None and any(t is not None and t > ftime for t in times.values())
        finished = bool(_entry(prev, name)[2]) or (read_all and (
            dir_done or f"{name}.done" in present or opts.finite or newer
            or (opts.idle_finish_ms is not None and now_ms - mtime * 1000 >= opts.idle_finish_ms)
        ))  # fmt: skip
        files[name] = [new_pos, ftime, 1 if finished else 0, reached]
    for name in prev:  # a file that disappeared keeps its entry (finished)
        if name not in files:
            e = _entry(prev, name)
            files[name] = [e[0], e[1], 1, e[3]]
    lateness = opts.lateness_ms
    unfinished = [f for f in files.values() if not f[2]]
    if any(f[1] is None for f in unfinished):
        lw = start["lw"]  # a new file whose time is not known yet holds the watermark
    elif unfinished:
        lw = min(max(f[1], f[3] if f[3] is not None else f[1]) for f in unfinished) - lateness
    elif dir_done or opts.finite:
        lw = MAX_TIMESTAMP
    else:
        newest = [max(f[1], f[3] if f[3] is not None else f[1]) for f in files.values() if f[1] is not None]
        lw = max(newest, default=MIN_TIMESTAMP) - lateness
    return {"files": files, "lw": max(lw, start["lw"])}


def holding_file(offset: dict[str, Any], lateness_ms: int) -> str | None:
    """The unfinished file that holds the injector low watermark of ``offset``, if any.

    >>> holding_file({"files": {"a.jsonl": [10, 1_000, 0, 1_500], "b.jsonl": [5, 2_000, 0, None]}, "lw": 1_500}, 0)
    'a.jsonl'
    """
    best: tuple[int, str] | None = None
    for name in offset["files"]:
        _, ftime, finished, reached = _entry(offset["files"], name)
        if finished:
            continue
        if ftime is None:
            return name
        promise = max(ftime, reached if reached is not None else ftime) - lateness_ms
        if best is None or promise < best[0]:
            best = (promise, name)
    return None if best is None else best[1]


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes ``[begin, end)`` of one file to read in a batch, and the watermark they are sent under."""

    name: str
    begin: int
    end: int
    sender_watermark: int
    file_time: int


def plan_ranges(start: dict[str, Any], end: dict[str, Any], lateness_ms: int) -> list[ByteRange]:
    """What a batch from ``start`` to ``end`` reads, in the order records are sent.

    A range is sent under the injector watermark already published (``start``), or under
    its own file's time if that is higher, but never above an older file still unfinished
    after the batch: as if files were sent one at a time, in time order, so a record older
    than its own file's time (minus ``lateness_ms``) is late however the files are cut
    into batches.
    """
    out: list[ByteRange] = []
    ends = end["files"]
    for name in sorted(ends):
        pos, ftime = ends[name][0], ends[name][1]
        old = _entry(start["files"], name)[0]
        if pos <= old:
            continue
        swm = start["lw"]
        if ftime is not None:
            bound = min([ftime] + [e[1] for n, e in ends.items() if n != name and e[1] is not None and e[1] <= ftime and not e[2]])
            swm = max(swm, bound - lateness_ms)
        out.append(ByteRange(name, old, pos, swm, MAX_TIMESTAMP if ftime is None else ftime))
    out.sort(key=lambda r: (r.sender_watermark, r.file_time, r.name))
    return out


def read_range(opts: ReadOptions, r: ByteRange, injector: str, stream: str) -> Chunk:
    with open(os.path.join(opts.path, r.name), "rb") as fh:
        fh.seek(r.begin)
        data = fh.read(r.end - r.begin)
    return parse_chunk(
        data, start=r.begin, file=r.name, file_time=r.file_time, injector=injector, stream=stream,
        id_field=opts.id_field, ts_field=opts.ts_field,
    )  # fmt: skip



class LogFileSource(Source):
    """A directory of JSON-lines log files; see the module docstring.

    ``lateness_ms`` is the declared disorder: how far behind its file's time, or behind
    the newest record already read from its file, a record may be and still not be late.
    A file is finished when read to its end and a ``<name>.done`` marker or a ``_DONE``
    marker in the directory exists, or ``finite=True``, or a newer file has appeared
    (``finish_on_rotation``), or it has not grown for ``idle_finish_ms`` (default one
    minute; ``None``: never). ``max_bytes_per_batch`` bounds one batch.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        id_field: str = "id",
        ts_field: str = "ts",
        idle_finish_ms: int | None = 60_000,
        finite: bool = False,
        lateness_ms: int = 0,
        max_bytes_per_batch: int = 64 << 20,
        finish_on_rotation: bool = True,
    ) -> None:
        if lateness_ms < 0 or max_bytes_per_batch < 1 or (idle_finish_ms is not None and idle_finish_ms < 0):
            msg = (
                f"LogFileSource({os.fspath(path)!r}): lateness_ms and idle_finish_ms must be >= 0 and "
                f"max_bytes_per_batch >= 1; got {lateness_ms}, {idle_finish_ms}, {max_bytes_per_batch}"
            )
            raise TopologyError(msg)
        self.read_options = ReadOptions(
            os.fspath(path), id_field, ts_field, idle_finish_ms, finite, lateness_ms, max_bytes_per_batch, finish_on_rotation
        )

    @property
    def path(self) -> str:
        return self.read_options.path

    def options(self) -> dict[str, str]:
        """The Spark data source options for this source."""
        o = self.read_options
        return {
            "path": o.path,
            "id_field": o.id_field,
            "ts_field": o.ts_field,
            "idle_finish_ms": "" if o.idle_finish_ms is None else str(o.idle_finish_ms),
            "finite": "1" if o.finite else "0",
            "lateness_ms": str(o.lateness_ms),
            "max_bytes_per_batch": str(o.max_bytes_per_batch),
            "finish_on_rotation": "1" if o.finish_on_rotation else "0",
        }

    @staticmethod
    def read_options_from(options: dict[str, str]) -> ReadOptions:
        """The inverse of :meth:`options` (the Spark reader's side)."""
        idle = options.get("idle_finish_ms", "")
        return ReadOptions(
            path=options["path"],
            id_field=options.get("id_field", "id"),
            ts_field=options.get("ts_field", "ts"),
            idle_finish_ms=int(idle) if idle else None,
            finite=options.get("finite", "0") == "1",
            lateness_ms=int(options.get("lateness_ms", "0")),
            max_bytes_per_batch=int(options.get("max_bytes_per_batch", str(64 << 20))),
            finish_on_rotation=options.get("finish_on_rotation", "1") == "1",
        )

    def batches(self, injector: str = "injector", stream: str = "records") -> Iterator[SourceBatch]:
        """In memory: the directory as it is now, read as a finished input, batch by batch.

        The batches are the Spark reader's (:func:`plan_offset`, :func:`plan_ranges`); each
        byte range's records come after a batch that moves the watermark to the one they
        are sent under, and each plan ends with the injector low watermark it reached.
        """
        opts = replace(self.read_options, finite=True)
        offset = initial_offset()
        while True:
            end = plan_offset(offset, opts, now_ms=0)
            for r in plan_ranges(offset, end, opts.lateness_ms):
                chunk = read_range(opts, r, injector, stream)
                yield SourceBatch([], r.sender_watermark)
                yield SourceBatch(chunk.records, r.sender_watermark, chunk.dead_letters)
            yield SourceBatch([], end["lw"])
            if end["lw"] >= MAX_TIMESTAMP or end == offset:
                return
            offset = end
