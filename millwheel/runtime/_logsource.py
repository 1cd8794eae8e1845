"""``LogFileSource``: a directory of growing JSON-lines log files (Photon §3, MillWheel Fig. 10).

The definition is pure Python (no pyspark), so a topology file can name it and the
in-memory harness can run it; the Spark reader is ``millwheel/runtime/_logfiles.py``.

* Every ``*.jsonl`` / ``*.json`` / ``*.log`` file in ``path`` is a log; new files are picked
  up as they appear, and a file may keep growing: only complete lines (ending in ``\\n``)
  are read, and the byte offset reached in each file is kept in the Spark checkpoint.
* A line is a JSON object with the record id in ``id_field`` (default ``id``; when absent
  the id is ``<file>:<byte offset>``) and the timestamp, integer ms, in ``ts_field``
  (default ``ts``). Anything else — broken JSON, not an object, a missing or non-integer
  timestamp — goes to the ``dead_letters`` stream with the reason, file and offset.
* A file's *time* is the number at the end of its name (``queries-1700000000000.jsonl``:
  the time it was opened), else the timestamp of its first line. A file is *finished*
  once it is read to the end and a ``<name>.done`` marker exists, or the directory has a
  ``_DONE`` marker, or it has not changed for ``idle_finish_ms`` (when set). The injector
  low watermark is the time of the oldest unfinished file (Fig. 10) — ``MAX_TIMESTAMP`` once
  every file is finished and the directory is complete (``_DONE``, or ``finite=True``).

>>> import json, os, tempfile
>>> d = tempfile.mkdtemp()
>>> with open(os.path.join(d, "q-1000.jsonl"), "w") as f:
...     _ = f.write(json.dumps({"id": "a", "ts": 1500, "query": "cats"}) + "\\n" + "{oops\\n")
>>> src = LogFileSource(d, finite=True)
>>> [(len(b.records), b.low_watermark) for b in src.batches()]
[(1, 9223372036854775807)]
>>> src.malformed[0]["reason"][:11], src.malformed[0]["offset"]
('broken JSON', 41)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

from millwheel._record import MAX_TIMESTAMP, Record
from millwheel._sources import Source, SourceBatch

LOG_SUFFIXES = (".jsonl", ".json", ".log", ".ndjson")
_TIME_IN_NAME = re.compile(r"(-?\d{4,})$")


class MalformedLine(ValueError):
    """A line that is not a record; the message is the reason."""


def file_time_from_name(name: str) -> int | None:
    stem = name.rsplit(".", 1)[0]
    m = _TIME_IN_NAME.search(stem)
    return int(m.group(1)) if m else None


def is_log_file(name: str) -> bool:
    return not name.startswith((".", "_")) and name.endswith(LOG_SUFFIXES)


def parse_line(line: bytes, id_field: str, ts_field: str, file: str, offset: int) -> tuple[str, int, Any]:
    """``(id, timestamp, value)`` of one line, or :class:`MalformedLine` with the reason."""
    try:
        value = json.loads(line)
    except ValueError as exc:
        msg = f"broken JSON: {exc}"
        raise MalformedLine(msg) from None
    if not isinstance(value, dict):
        msg = f"not a JSON object: {type(value).__name__}"
        raise MalformedLine(msg)
    ts = value.get(ts_field)
    if ts is None:
        msg = f"missing timestamp field {ts_field!r}"
        raise MalformedLine(msg)
    if type(ts) is not int:
        msg = f"timestamp field {ts_field!r} is not an integer (ms): {ts!r}"
        raise MalformedLine(msg)
    rid = value.get(id_field)
    if rid is None:
        rid = f"{file}:{offset}"
    elif not isinstance(rid, (str, int)):
        msg = f"id field {id_field!r} is not a string: {rid!r}"
        raise MalformedLine(msg)
    return str(rid), ts, value


class LogFileSource(Source):
    """A directory of JSON-lines log files; see the module docstring."""

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
        self.path = os.fspath(path)
        self.directory = self.path  # what zeitgeist's evaluation looks for
        self.id_field = id_field
        self.ts_field = ts_field
        self.idle_finish_ms = idle_finish_ms
        self.finite = finite
        self.lateness_ms = lateness_ms
        self.max_bytes_per_batch = max_bytes_per_batch
        #: malformed lines seen by :meth:`batches` (the harness has no dead-letter injector path)
        self.malformed: list[dict[str, Any]] = []

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

    def batches(self) -> Iterator[SourceBatch]:
        """In memory: one batch per file in time order, the next file's time as watermark."""
        self.malformed = []
        files = []
        for name in sorted(os.listdir(self.path)):
            if is_log_file(name):
                recs = list(self._read(name))
                t = file_time_from_name(name)
                if t is None:
                    t = min((r.timestamp for r in recs), default=MAX_TIMESTAMP)
                files.append((t, name, recs))
        files.sort()
        for i, (_, _, recs) in enumerate(files):
            nxt = files[i + 1][0] - self.lateness_ms if i + 1 < len(files) else MAX_TIMESTAMP
            yield SourceBatch(recs, nxt)
        if not files:
            yield SourceBatch([], MAX_TIMESTAMP)

    def _read(self, name: str) -> Iterator[Record]:
        with open(os.path.join(self.path, name), "rb") as fh:
            data = fh.read()
        end = data.rfind(b"\n") + 1
        pos = 0
        while pos < end:
            nl = data.index(b"\n", pos)
            line = data[pos:nl]
            if line.strip():
                try:
                    rid, ts, value = parse_line(line, self.id_field, self.ts_field, name, pos)
                except MalformedLine as exc:
                    self.malformed.append({"file": name, "offset": pos, "reason": str(exc), "line": line.decode(errors="replace")})
                else:
                    yield Record(None, value, ts, rid)
            pos = nl + 1
