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
from dataclasses import dataclass

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


class LogFileSource(Source):
    """A directory of JSON-lines log files; see the module docstring.

    ``lateness_ms`` is the declared disorder: how far behind its file's time a record may
    be and still not be late. ``idle_finish_ms`` finishes a file that has not grown for
    that long; a ``<name>.done`` marker, a ``_DONE`` marker in the directory or
    ``finite=True`` finish files too. ``max_bytes_per_batch`` bounds one Spark batch.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        id_field: str = "id",
        ts_field: str = "ts",
        idle_finish_ms: int | None = None,
        finite: bool = False,
        lateness_ms: int = 0,
        max_bytes_per_batch: int = 64 << 20,
    ) -> None:
        if lateness_ms < 0 or max_bytes_per_batch < 1 or (idle_finish_ms is not None and idle_finish_ms < 0):
            msg = (
                f"LogFileSource({os.fspath(path)!r}): lateness_ms and idle_finish_ms must be >= 0 and "
                f"max_bytes_per_batch >= 1; got {lateness_ms}, {idle_finish_ms}, {max_bytes_per_batch}"
            )
            raise TopologyError(msg)
        self.path = os.fspath(path)
        self.id_field = id_field
        self.ts_field = ts_field
        self.idle_finish_ms = idle_finish_ms
        self.finite = finite
        self.lateness_ms = lateness_ms
        self.max_bytes_per_batch = max_bytes_per_batch

    def options(self) -> dict[str, str]:
        """The Spark data source options for this source."""
        return {
            "path": self.path,
            "id_field": self.id_field,
            "ts_field": self.ts_field,
            "idle_finish_ms": "" if self.idle_finish_ms is None else str(self.idle_finish_ms),
            "finite": "1" if self.finite else "0",
            "lateness_ms": str(self.lateness_ms),
            "max_bytes_per_batch": str(self.max_bytes_per_batch),
        }

    def log_files(self) -> list[str]:
        return sorted(n for n in os.listdir(self.path) if is_log_file(n)) if os.path.isdir(self.path) else []

    def batches(self, injector: str = "injector", stream: str = "records") -> Iterator[SourceBatch]:
        """In memory: the files as they are now, one batch per file in time order.

        Before each file, the watermark moves to that file's time (minus ``lateness_ms``),
        so its records are sent under it, as on Spark; after the last, to ``MAX_TIMESTAMP``.
        """
        files: list[tuple[int, str, Chunk]] = []
        for name in self.log_files():
            with open(os.path.join(self.path, name), "rb") as fh:
                data = fh.read()
            data = data[: data.rfind(b"\n") + 1]
            t = file_time(name)
            if t is None:
                t = first_timestamp(data, self.ts_field)
            t = MAX_TIMESTAMP if t is None else t  # no record at all: holds nothing
            chunk = parse_chunk(
                data, start=0, file=name, file_time=t, injector=injector, stream=stream,
                id_field=self.id_field, ts_field=self.ts_field,
            )  # fmt: skip
            files.append((t, name, chunk))
        files.sort(key=lambda f: (f[0], f[1]))
        wm = MIN_TIMESTAMP
        for t, _, chunk in files:
            if t - self.lateness_ms > wm and t < MAX_TIMESTAMP:
                wm = t - self.lateness_ms
                yield SourceBatch([], wm)
            yield SourceBatch(chunk.records, wm, chunk.dead_letters)
        yield SourceBatch([], MAX_TIMESTAMP)
