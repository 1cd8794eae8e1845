"""Log files' names and lines: the file-time rule and the line parser (Photon §3, MillWheel §5.2).

Pure Python, shared by the in-memory source and the Spark reader through
:mod:`millwheel._logfile`: a name's time (:func:`file_time`), which names are logs
(:func:`is_log_file`), and a line's ``(id, timestamp, value)`` or the reason it is a dead
letter (:func:`parse_line`, :func:`parse_chunk`).

>>> parse_line(b'{"id": "a", "ts": 5}', "id", "ts", "q.jsonl", 0)
('a', 5, {'id': 'a', 'ts': 5})
"""

from __future__ import annotations

import calendar
import gc
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from millwheel._deadletter import implausible_line, malformed_line
from millwheel._errors import MillwheelError
from millwheel._record import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Record,
    short_repr,
    timestamp_text,
    utf8_text,
)

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


class MalformedLine(MillwheelError, ValueError):
    """A line that is not a record; the message is the reason."""


_INT64_MIN, _INT64_MAX = MIN_TIMESTAMP, MAX_TIMESTAMP


def parse_line(
    line: bytes, id_field: str, ts_field: str, file: str, offset: int
) -> tuple[str, int, object]:
    """``(id, timestamp, value)`` of one line, or :class:`MalformedLine` with the reason."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as exc:
        msg = f"broken JSON: {str(exc)[:200]}"
        raise MalformedLine(msg) from None
    rid, ts = _id_and_timestamp(value, id_field, ts_field, file, offset)
    return rid, ts, value


def _id_and_timestamp(
    value: object, id_field: str, ts_field: str, file: str, offset: int
) -> tuple[str, int]:
    """A decoded line's record id and timestamp, or :class:`MalformedLine` with the reason."""
    if not isinstance(value, dict):
        msg = f"not a JSON object: {type(value).__name__}"
        raise MalformedLine(msg)
    ts = value.get(ts_field)
    if ts is None:
        msg = f"missing timestamp field {ts_field!r}"
        raise MalformedLine(msg)
    if type(ts) is not int:
        msg = (
            f"timestamp field {ts_field!r} is not an integer (ms since the epoch): {str(ts)[:80]!r}"
        )
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
    elif not utf8_text(
        rid
    ):  # JSON's "\ud800": a str with no UTF-8 form, which no stream log can store
        msg = f"id field {id_field!r} must be valid Unicode text, got {short_repr(rid)}, which holds a lone surrogate"
        raise MalformedLine(msg)
    return rid, ts


@dataclass(slots=True)
class Chunk:
    """What one byte range of a log file holds: records and dead letters, in file order."""

    records: list[Record]
    dead_letters: list[Record]
    #: records without an id field, whose id is ``<file>:<offset>``: a copy of one delivered
    #: again is no duplicate to dedup (docs/concepts.md, "Bad input"); a run's summary counts them
    positional: int = 0


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
    bounds: tuple[int, int] = (_INT64_MIN + 1, _INT64_MAX - 1),
) -> Chunk:
    """Parse the lines of ``data`` (read from byte ``start`` of ``file``): each line gives
    what :func:`parse_line` gives it, a record or a dead letter with its reason; a record
    whose timestamp lies outside ``bounds`` (the plausible window the plan set for these
    bytes, ``_logplan.plausible_bounds``) is a dead letter too, stage ``implausible_timestamp``.

    The bytes are decoded once and each line's JSON scanned where it lies (:func:`_lines_of`),
    with the garbage collector paused: the values are new, acyclic and kept, so its
    collections would only re-walk them. Anything that is not plainly a record — a line
    the scan refuses or does not end, a value that fails a check, bytes that are not
    plain UTF-8 — takes :func:`parse_line` itself, so its record or dead letter (reason,
    offset) is exactly what that gives (docs/runtime.md, "Injectors").
    """
    records: list[Record] = []
    dead: list[Record] = []
    positional = 0
    lo, hi = bounds
    paused = gc.isenabled()
    gc.disable()
    try:
        for offset, line, value in _lines_of(data, start):
            if (
                type(value) is dict
            ):  # the common case, checked inline: an object with both fields valid
                ts = value.get(ts_field)
                rid = value.get(id_field)
                if (
                    type(ts) is int
                    and lo <= ts <= hi
                    and type(rid) is str
                    and rid
                    and (rid.isascii() or utf8_text(rid))
                ):
                    records.append(Record(None, value, ts, rid, stream))
                    continue
            try:
                if value is _UNSCANNED:
                    rid, ts, value = parse_line(line, id_field, ts_field, file, offset)
                else:
                    rid, ts = _id_and_timestamp(value, id_field, ts_field, file, offset)
            except MalformedLine as exc:
                dead.append(
                    malformed_line(injector, stream, file, offset, str(exc), line, file_time)
                )
                continue
            record = Record(None, value, ts, rid, stream)
            if lo <= ts <= hi:
                records.append(record)
                positional += (
                    isinstance(value, dict) and value.get(id_field) is None
                )  # a dict: it has a timestamp
            else:
                why = implausible_reason(ts, ts_field, lo, hi)
                dead.append(
                    implausible_line(injector, stream, file, offset, why, line, record, file_time)
                )
    finally:
        if paused:
            gc.enable()
    return Chunk(records, dead, positional)


def implausible_reason(ts: int, ts_field: str, lo: int, hi: int) -> str:
    """Why timestamp ``ts`` is not in the plausible window ``[lo, hi]``: its value, the
    window, and the likely mistake.

    >>> print(implausible_reason(1_765_458_394_380_000, "ts", 0, 2_000_000_000_000))
    implausible_timestamp: 'ts' is 1765458394380000 (1765458394380000 ms (after the year 9999)), later than any time plausible here (up to 2033-05-18 03:33:20); microseconds or nanoseconds where milliseconds are expected? LogFileSource(max_skew_ms=...) sets how far a record may lie from its neighbours
    """
    if ts > hi:
        where, unit = (
            f"later than any time plausible here (up to {timestamp_text(hi)})",
            "microseconds or nanoseconds",
        )
    else:
        where, unit = f"earlier than any time plausible here (from {timestamp_text(lo)})", "seconds"
    return (
        f"implausible_timestamp: {ts_field!r} is {ts} ({timestamp_text(ts)}), {where}; {unit} where milliseconds "
        "are expected? LogFileSource(max_skew_ms=...) sets how far a record may lie from its neighbours"
    )


#: what :func:`_lines_of` gives for a line it leaves to :func:`parse_line`
_UNSCANNED = object()
#: JSON's whitespace within a line (``json.decoder.WHITESPACE`` less ``\\n``): what ``json.loads`` skips around a document
_JSON_SPACE = " \t\r"
#: what ``json.loads`` runs on a ``str`` once it has skipped the leading whitespace
_SCAN: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
#: what ``bytes.strip()`` strips: a line of only these is blank and skipped
_BLANK = " \t\n\r\x0b\x0c"


def _lines_of(data: bytes, start: int) -> Iterator[tuple[int, bytes, object]]:
    """``(byte offset, line, value)`` of each non-blank line of ``data``; ``value`` is
    ``json.loads(line)`` where the scan finds a whole document on the line, else ``_UNSCANNED``.

    ``json.loads`` of a ``bytes`` line decodes it as UTF-8 (``surrogatepass``) and scans
    the text; so ``data`` that decodes as UTF-8 is decoded once, and each line scanned in
    place, as ``json.loads`` would (leading and trailing JSON whitespace, then one
    document). Where ``json.loads`` decodes a line otherwise — a byte-order mark or a NUL
    in its first two bytes — the text of the line is no whole document (a BOM or a NUL
    is neither JSON whitespace nor inside a valid value), so the scan never takes it.
    Lines the scan refuses, does not end, or ends before their last non-space character
    (``json.loads``' "Extra data"), and all of ``data`` that is not UTF-8, are left to
    :func:`parse_line`, line by line, for its reason.
    """
    try:
        text: str | None = data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        text = None
    if text is None:
        pos, n = 0, len(data)
        while pos < n:
            nl = data.find(b"\n", pos)
            if nl < 0:
                nl = n
            if data[pos:nl].strip():
                yield start + pos, data[pos:nl], _UNSCANNED
            pos = nl + 1
        return
    # byte lengths of the lines: their characters' unless some are not ASCII
    sizes = None if data.isascii() else [len(b) for b in data.split(b"\n")]
    pos, scan = 0, _SCAN
    for i, line in enumerate(text.split("\n")):
        here = pos
        size = len(line) if sizes is None else sizes[i]
        pos += size + 1
        if not line.strip(_BLANK):
            continue
        try:
            value, end = scan(
                line, len(line) - len(line.lstrip(_JSON_SPACE)) if line[0] in _BLANK else 0
            )
            if end != len(line) and line[end:].strip(_JSON_SPACE):
                value = _UNSCANNED
        except (StopIteration, ValueError, RecursionError):
            value = _UNSCANNED
        yield start + here, data[here : here + size], value


def first_timestamp(data: bytes, ts_field: str) -> int | None:
    """The timestamp of the first valid record in ``data`` (a file without a time in its name)."""
    for line in data.split(b"\n"):
        try:
            v = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if (
            isinstance(v, dict)
            and type(v.get(ts_field)) is int
            and _INT64_MIN < v[ts_field] < _INT64_MAX
        ):
            return int(v[ts_field])
    return None
