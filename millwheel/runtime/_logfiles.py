"""The Spark reader of :class:`~millwheel.LogFileSource`: a Python streaming data source.

It parses with the same code as the in-memory source (``millwheel/_logfile.py``:
:func:`~millwheel.file_time`, ``parse_chunk``), so both backends read the same records and
make the same dead letters.

Offsets are ``{"files": {name: [byte offset, file time, finished]}, "lw": injector low
watermark}``: Spark keeps them in the query's offset log, so the byte offset reached in
each file is in the checkpoint and a replayed batch reads exactly the same bytes
(deterministic output, safe to republish). The driver reads ``lw`` from the committed
offsets to publish the injector low watermark (MillWheel §5.2, Fig. 10).

Rows are stream-log rows plus ``stream``: records go to the injector's stream, malformed
lines to ``dead_letters`` with reason, file and byte offset.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from millwheel._codec import encode_value
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._logfile import file_time, first_timestamp, is_log_file, parse_chunk
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, encode_key
from millwheel.runtime._wire import OUT_SCHEMA

FORMAT = "millwheel_logfiles"
_TAIL = 1 << 16


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
    """Offset just past the first ``\n`` at or after ``start``, or ``start`` if none."""
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


def _first_ts(path: str, ts_field: str, end: int) -> int | None:
    with open(path, "rb") as fh:
        return first_timestamp(fh.read(end), ts_field)


class _Range(InputPartition):
    def __init__(self, name: str, start: int, end: int, sender_wm: int, ftime: int) -> None:
        super().__init__((name, start, end, sender_wm, ftime))


def sender_watermark(name: str, start: dict[str, Any], end: dict[str, Any]) -> int:
    """The injector low watermark a record of file ``name`` is sent under (Fig. 10).

    As if files were delivered one at a time in time order: the file's own time, or an
    older file's that is still unfinished after the batch, and never below the watermark
    already published. So a record older than its own file's time is late however the
    files are cut into batches.
    """
    own = end["files"][name][1]
    if own is None:
        return int(start["lw"])
    times = [own]
    for other, (_, t, finished) in end["files"].items():
        if other != name and t is not None and t <= own and not finished:
            times.append(t)
    return max(int(start["lw"]), min(times))


class LogFileStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.id_field = options.get("id_field", "id")
        self.ts_field = options.get("ts_field", "ts")
        idle = options.get("idle_finish_ms", "")
        self.idle_ms = int(idle) if idle else None
        self.finite = options.get("finite", "0") == "1"
        self.lateness = int(options.get("lateness_ms", "0"))
        self.max_bytes = int(options.get("max_bytes_per_batch", str(64 << 20)))
        self.injector = options.get("injector", "injector")
        self.stream = options.get("stream", "records")

    def initialOffset(self) -> dict[str, Any]:
        return {"files": {}, "lw": MIN_TIMESTAMP}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:  # noqa: ARG002
        start = start or self.initialOffset()
        prev: dict[str, list[Any]] = start["files"]
        names = sorted(os.listdir(self.path)) if os.path.isdir(self.path) else []
        present = set(names)
        dir_done = "_DONE" in present
        now_ms = int(time.time() * 1000)
        files: dict[str, list[Any]] = {}
        budget = self.max_bytes
        for name in names:
            if not is_log_file(name):
                continue
            full = os.path.join(self.path, name)
            st = os.stat(full)
            pos, ftime, _ = prev.get(name, [0, None, 0])
            new_pos = pos
            if st.st_size > pos and budget > 0:
                end = min(st.st_size, pos + budget)
                new_pos = _last_newline(full, pos, end)
                if new_pos == pos and end < st.st_size:
                    # the next line does not fit what is left of the budget: a batch that
                    # has read nothing yet takes it whole (one line longer than the budget),
                    # any other batch stops here
                    new_pos = _next_newline(full, pos, st.st_size) if budget == self.max_bytes else pos
                    budget = 0 if new_pos == pos else budget - (new_pos - pos)
                else:
                    budget -= new_pos - pos
            if ftime is None:
                ftime = file_time(name)
                if ftime is None and new_pos > 0:
                    ftime = _first_ts(full, self.ts_field, new_pos)
            read_all = new_pos >= st.st_size
            finished = read_all and (
                dir_done
                or f"{name}.done" in present
                or self.finite
                or (self.idle_ms is not None and now_ms - st.st_mtime * 1000 >= self.idle_ms)
            )
            files[name] = [new_pos, ftime, 1 if finished else 0]
        for name, entry in prev.items():  # a file that disappeared keeps its entry (finished)
            if name not in files:
                files[name] = [entry[0], entry[1], 1]
        unfinished = [f[1] for f in files.values() if not f[2]]
        if any(t is None for t in unfinished):
            lw = start["lw"]  # a new file whose time is not known yet holds the watermark
        elif unfinished:
            lw = min(unfinished) - self.lateness
        elif dir_done or self.finite:
            lw = MAX_TIMESTAMP
        else:
            lw = max((f[1] for f in files.values() if f[1] is not None), default=MIN_TIMESTAMP) - self.lateness
        return {"files": files, "lw": max(lw, start["lw"])}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for name, (pos, _, _) in sorted(end["files"].items()):
            old = start["files"].get(name, [0, None, 0])[0]
            if pos > old:
                ftime = end["files"][name][1]
                parts.append(_Range(name, old, pos, sender_watermark(name, start, end) - self.lateness, MAX_TIMESTAMP if ftime is None else ftime))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        name, start, end, swm, ftime = partition.value  # type: ignore[attr-defined]
        with open(os.path.join(self.path, name), "rb") as fh:
            fh.seek(start)
            data = fh.read(end - start)
        chunk = parse_chunk(
            data, start=start, file=name, file_time=ftime, injector=self.injector, stream=self.stream,
            id_field=self.id_field, ts_field=self.ts_field,
        )  # fmt: skip
        rows = [(self.stream, r, swm) for r in chunk.records] + [(DEAD_LETTER_STREAM, r, None) for r in chunk.dead_letters]
        if rows:
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([s for s, _, _ in rows], pa.string()),
                    pa.array([r.id for _, r, _ in rows], pa.string()),
                    pa.array([r.timestamp for _, r, _ in rows], pa.int64()),
                    pa.array([None if r.key is None else encode_key(r.key) for _, r, _ in rows], pa.binary()),
                    pa.array([encode_value(r.value) for _, r, _ in rows], pa.binary()),
                    pa.array([w for _, _, w in rows], pa.int64()),
                ],
                names=["stream", "id", "ts", "key", "value", "wm"],
            )


class LogFileDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return OUT_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: ARG002
        return LogFileStreamReader(dict(self.options))
