"""``LogFileSource``: a directory of growing JSON-lines log files (Photon §3, MillWheel §5.2, Fig. 10).

The definition, the file-time rule and the line parser are pure Python, shared by the
in-memory harness (:meth:`LogFileSource.batches`) and the Spark runtime's streaming
reader (``millwheel/runtime/_logfiles.py``), so both backends read the same records,
make the same dead letters and send them under the same injector low watermark.

* Every ``*.jsonl`` / ``*.json`` / ``*.ndjson`` / ``*.log`` file in ``path`` (not hidden,
  not starting with ``_``) is a log; a file may keep growing: only complete lines (ending
  in ``\\n``) are read while it does, and its last line with or without one once it is
  complete (every byte is a record or a dead letter).
* A line is a JSON object with the record id in ``id_field`` (default ``id``; when absent
  the id is ``<file>:<byte offset>``) and the timestamp, integer ms, in ``ts_field``
  (default ``ts``). Anything else — broken JSON, not an object, a missing, non-integer or
  out-of-range timestamp, an id that is not a non-empty string of valid Unicode — becomes
  a dead letter (:class:`~millwheel.DeadLetter`, stage ``malformed_line``) with the reason,
  file and byte offset, timestamped with the file's time; a timestamp that cannot belong
  with its neighbours (``max_skew_ms``, :func:`~millwheel._logplan.plausible_bounds`) one
  of stage ``implausible_timestamp``, which moves no watermark.
* The injector low watermark is a promise that no record still to come is older (§4.5,
  Fig. 10: the oldest unfinished file's time). Each unfinished file promises, by one rule
  (:func:`promise`): its *time* from its name (:func:`file_time`), advanced while it is
  tailed by the newest record read minus ``lateness_ms``; without a time in its name,
  nothing until it has been read (it holds the watermark), then its oldest record (minus
  ``lateness_ms``) while it grows. The watermark is the smallest promise, and
  ``MAX_TIMESTAMP`` once every file is finished and the directory is complete (``_DONE``,
  or ``finite=True``).
* Records are sent as if files were delivered one at a time, in time order: under their
  file's time minus ``lateness_ms`` when the name has one (a record older than that is
  late on both backends, however the files are batched), else under the smallest
  timestamp of the bytes read with them — a finished file without a time promises its
  smallest timestamp, so its records are never late.

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

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from millwheel._errors import RunError, TopologyError
from millwheel._logparse import (
    LOG_SUFFIXES,
    Chunk,
    MalformedLine,
    file_time,
    first_timestamp,
    is_log_file,
    parse_chunk,
    parse_line,
)
from millwheel._logplan import (
    DEFAULT_MAX_SKEW_MS,
    ByteRange,
    FileProgress,
    ReadOptions,
    disorder,
    holding_file,
    initial_offset,
    plan_offset,
    plan_ranges,
    progress_of,
    promise,
    timestamps,
    unread,
)
from millwheel._record import MAX_TIMESTAMP
from millwheel._sources import Source, SourceBatch

# the names other modules import from here: the parser (``_logparse.py``) and the reading
# plan (``_logplan.py``) are this module's two halves
__all__ = [
    "LOG_SUFFIXES",
    "ByteRange",
    "Chunk",
    "FileProgress",
    "LogFileSource",
    "MalformedLine",
    "ReadOptions",
    "batches_between",
    "disorder",
    "file_time",
    "first_timestamp",
    "holding_file",
    "initial_offset",
    "is_log_file",
    "parse_chunk",
    "parse_line",
    "plan_offset",
    "plan_ranges",
    "progress_of",
    "promise",
    "read_range",
    "timestamps",
    "unread",
]


def read_range(opts: ReadOptions, r: ByteRange, injector: str, stream: str) -> Chunk:
    with open(os.path.join(opts.path, r.name), "rb") as fh:
        fh.seek(r.begin)
        data = fh.read(r.end - r.begin)
    return parse_chunk(
        data,
        start=r.begin,
        file=r.name,
        file_time=r.file_time,
        injector=injector,
        stream=stream,
        id_field=opts.id_field,
        ts_field=opts.ts_field,
        bounds=(r.lo, r.hi),
    )


def batches_between(
    opts: ReadOptions,
    start: dict[str, Any],
    end: dict[str, Any],
    injector: str,
    stream: str,
    counts: Counter[str] | None = None,
) -> Iterator[SourceBatch]:
    """The source batches of the plan from offset ``start`` to ``end``: each byte range's
    records after a batch that moves the watermark to the one they are sent under, then
    the injector low watermark the plan reached; ``counts["positional_ids"]`` adds the
    records that got ``<file>:<offset>`` as id."""
    for r in plan_ranges(start, end, opts.lateness_ms):
        chunk = read_range(opts, r, injector, stream)
        if counts is not None and chunk.positional:
            counts["positional_ids"] += chunk.positional
        yield SourceBatch([], r.sender_watermark)
        yield SourceBatch(chunk.records, r.sender_watermark, chunk.dead_letters)
    yield SourceBatch([], end["lw"])


class LogFileSource(Source):
    """A directory of JSON-lines log files; see the module docstring.

    ``lateness_ms`` is the declared disorder: how far behind its file's time, or behind
    the newest record already read from its file, a record may be and still not be late.
    A file is finished when read to its end and a ``<name>.done`` marker or a ``_DONE``
    marker in the directory exists, or ``finite=True``, or a newer file has appeared
    (``finish_on_rotation``), or it has not grown for ``idle_finish_ms`` (default one
    minute; ``None``: never). ``max_bytes_per_batch`` bounds one batch.

    ``max_skew_ms`` is how far a record's timestamp may lie from its neighbours (ahead of
    the latest time known — any file's newest record, the file's time, the wall clock of a
    live source — or behind its own file's time and oldest record) before it is
    implausible: a dead letter, stage ``implausible_timestamp``, that moves no watermark.
    The default, ten years, catches every unit mistake of x1000 (seconds, microseconds
    or nanoseconds where milliseconds are expected); ``None`` checks nothing.
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
        max_skew_ms: int | None = DEFAULT_MAX_SKEW_MS,
    ) -> None:
        if (
            lateness_ms < 0
            or max_bytes_per_batch < 1
            or (idle_finish_ms is not None and idle_finish_ms < 0)
        ):
            msg = (
                f"LogFileSource({os.fspath(path)!r}): lateness_ms and idle_finish_ms must be >= 0 and "
                f"max_bytes_per_batch >= 1; got {lateness_ms}, {idle_finish_ms}, {max_bytes_per_batch}"
            )
            raise TopologyError(msg)
        if max_skew_ms is not None and (type(max_skew_ms) is not int or max_skew_ms < 1):
            msg = f"LogFileSource({os.fspath(path)!r}): max_skew_ms must be a positive int of milliseconds or None; got {max_skew_ms!r}"
            raise TopologyError(msg)
        #: the offset the newest :meth:`batches` reached (its files' progress, for reports)
        self.last_offset: dict[str, Any] | None = None
        #: what the latest :meth:`batches` read: ``positional_ids``, the records without an id field
        self.counts: Counter[str] = Counter()
        self.read_options = ReadOptions(
            os.fspath(path),
            id_field,
            ts_field,
            idle_finish_ms,
            finite,
            lateness_ms,
            max_bytes_per_batch,
            finish_on_rotation,
            max_skew_ms,
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
            "max_skew_ms": "" if o.max_skew_ms is None else str(o.max_skew_ms),
        }

    @staticmethod
    def read_options_from(options: dict[str, str]) -> ReadOptions:
        """The inverse of :meth:`options` (the Spark reader's side)."""
        idle = options.get("idle_finish_ms", "")
        skew = options.get("max_skew_ms", str(DEFAULT_MAX_SKEW_MS))
        return ReadOptions(
            path=options["path"],
            id_field=options.get("id_field", "id"),
            ts_field=options.get("ts_field", "ts"),
            idle_finish_ms=int(idle) if idle else None,
            finite=options.get("finite", "0") == "1",
            lateness_ms=int(options.get("lateness_ms", "0")),
            max_bytes_per_batch=int(options.get("max_bytes_per_batch", str(64 << 20))),
            finish_on_rotation=options.get("finish_on_rotation", "1") == "1",
            max_skew_ms=int(skew) if skew else None,
        )

    def batches(self, injector: str = "injector", stream: str = "records") -> Iterator[SourceBatch]:
        """In memory: the directory as it is now, read as a finished input, batch by batch.

        The batches are the Spark reader's (:func:`plan_offset`, :func:`plan_ranges`); each
        byte range's records come after a batch that moves the watermark to the one they
        are sent under, and each plan ends with the injector low watermark it reached.
        """
        opts = replace(self.read_options, finite=True)
        offset = initial_offset()
        self.counts = Counter()
        while True:
            end = plan_offset(offset, opts, now_ms=0)
            self.last_offset = end
            yield from batches_between(opts, offset, end, injector, stream, self.counts)
            if end["lw"] >= MAX_TIMESTAMP:
                return
            if end == offset:  # read as finished, every file is read to its size: never reached
                left = [n for n, p in progress_of(end).items() if not p.finished]
                msg = (
                    f"LogFileSource({opts.path!r}), injector {injector!r}: the plan stopped with files not read to "
                    f"their end: {', '.join(left) or '(none)'}; their input would be lost without a word"
                )
                raise RunError(msg)
            offset = end
