"""A log-file injector's reader in the driver (``RuntimeSettings.log_reader="driver"``).

The Spark reader (``_logfiles.py``) is a streaming query over a Python data source: its
batches are planned in a Python process of Spark's, read by tasks in Python workers, and
handed through the JVM as rows to the injector's outbox. On a local master those are all
processes of the driver's machine, and the chain costs more than the reading: before its
first batch the query waits on a data-source look-up process, a planner process and its
first plan; then each record crosses Arrow, the JVM's rows and Arrow again
(docs/performance.md, "The main job").

This reader runs Spark's micro-batch protocol itself, on a thread of the driver, with the
Spark reader's own code (:class:`~millwheel.runtime._logfiles.LogFileStreamReader`): the
same plan (``plan_offset``), the same byte ranges, the same rows, ids, sender watermarks
and dead letters. Batch ``n``:

1. **plan** — ``end = plan_offset(start)``; nothing new: look again after
   ``injector_poll_ms``;
2. **write ahead** — ``offsets/<n>`` in the injector's checkpoint, in Spark's offset-log
   format (a version line, the batch's metadata, the offset);
3. **stage** — the ranges' rows into the outbox (``outbox/<n>/e<epoch>/``, under the
   injector's lease, as the query's sink stages them), read a part of ~8 MB of input at
   a time into one file per stream (a consumer never lists half a batch);
4. **commit** — ``commits/<n>``; then publish the batch as the driver loop publishes a
   query's (:meth:`Outbox.publish_committed`, under the outbox's lock).

A restart re-runs a planned, uncommitted batch between the offsets its log holds: the
same bytes, so the same rows and ids (MillWheel §6.1.2's checkpoint before the
productions are visible; §5.2's injector low watermark is the offset's ``lw``). The
checkpoint is the query's — its ``metadata`` file, offset log and commit log in Spark's
formats — so a run directory may be resumed with either reader.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
import uuid
from typing import Any

import pyarrow as pa

from millwheel._errors import RunError
from millwheel._logfile import initial_offset, plan_ranges
from millwheel.runtime._fs import Location
from millwheel.runtime._lease import FencedError
from millwheel.runtime._logfiles import LogFileStreamReader, deal_ranges
from millwheel.runtime._outbox import Outbox, StagedStreams, crash_point
from millwheel.runtime._spark_internals import (
    COMMITS,
    OFFSETS,
    committed_batches,
    offset_log_entries,
    planned_batches,
)
from millwheel.runtime._wire import SUMMARY_STREAM

#: input bytes read into one staged part: bounds the driver's memory for a large backlog
PART_BYTES = 8 << 20
#: offset- and commit-log entries kept, as Spark keeps them (``minBatchesToRetain``)
RETAIN = 100


def offset_entry(offset: dict[str, Any]) -> str:
    """An offset-log entry as Spark writes it for a query with this one source."""
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": {}}
    return f"v1\n{json.dumps(meta)}\n{json.dumps(offset)}"


#: a commit-log entry as Spark writes it
COMMIT_ENTRY = 'v1\n{"nextBatchWatermarkMs":0}'


class DriverLogReader(threading.Thread):
    """Reads one log-file injector's directory batch by batch until :meth:`halt`.

    ``options`` are the Spark reader's (``LogFileInjector.start`` builds them for both). A
    failure ends the thread and is kept in :attr:`error` (its traceback in
    :attr:`error_text`) for the driver loop, which restarts the reader from its checkpoint.
    """

    def __init__(
        self, name: str, checkpoint: Location, outbox: Outbox, options: dict[str, str], poll_ms: int
    ) -> None:
        super().__init__(name=f"millwheel-log-reader-{name}", daemon=True)
        self.reader = LogFileStreamReader(options)
        self.checkpoint = checkpoint
        self.outbox = outbox
        self.poll_s = poll_ms / 1000
        self._halt = threading.Event()
        self.error: BaseException | None = None
        self.error_text = ""

    def halt(self) -> None:
        """Stop after the part being read; a batch left uncommitted is re-run by the next start."""
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join()

    def run(self) -> None:
        try:
            for log in (OFFSETS, COMMITS):
                self.checkpoint.child(log).mkdirs()
            metadata = self.checkpoint.child("metadata")
            if metadata.read_text() is None:  # the query's id, as Spark writes it at a first start
                metadata.write_text(json.dumps({"id": str(uuid.uuid4())}))
            n, start, end = self._resume()
            while not self._halt.is_set():
                if end is None:
                    end = self.reader.latestOffset(start)
                    if end == start:
                        end = None
                        self._halt.wait(self.poll_s)
                        continue
                    self.outbox.fence()
                    self._plan(n, end)
                if not self._run_batch(n, start, end):
                    return
                start, end, n = end, None, n + 1
        except BaseException as exc:  # noqa: BLE001 - the driver loop restarts or stops on it
            self.error = exc
            self.error_text = "".join(traceback.format_exception(exc))

    def _plan(self, n: int, end: dict[str, Any]) -> None:
        """Write ``offsets/<n>`` unless it exists: as Spark's offset log, an entry is never
        replaced (a driver paused between its fence check and this write, whose batch a newer
        driver planned meanwhile, stops here instead of changing the committed offsets)."""
        if not self._entry(OFFSETS, n).write_new(offset_entry(end)):
            msg = f"{self.checkpoint.uri}: batch {n} was planned by another driver; this one stops"
            raise FencedError(msg)

    def _entry(self, log: str, n: int) -> Location:
        return self.checkpoint.child(log, str(n))

    def _offset(self, n: int) -> dict[str, Any]:
        text = self._entry(OFFSETS, n).read_text()
        entries = offset_log_entries(text) if text else []
        if not entries or not isinstance(entries[-1], dict):
            msg = f"{self.checkpoint.uri}: offset-log entry {n} is missing or unreadable; the injector cannot resume"
            raise RunError(msg)
        return entries[-1]

    def _purge(self, below: int) -> None:
        """Drop the log entries of batches before ``below``, as Spark purges its logs: no
        restart needs them, and what is left is one run of batches (``millwheel check``
        counts a published batch below the oldest entry as committed)."""
        if below <= 0:
            return
        for log in (OFFSETS, COMMITS):
            entries = self.checkpoint.child(log)
            for name in entries.list():
                number = name.removeprefix(".").removesuffix(".crc")
                if number.isdigit() and int(number) < below:
                    entries.child(name).delete()

    def _resume(self) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        """The next batch, where it starts, and where it ends if it is planned already (a
        batch planned and not committed before the last stop: re-run between the same offsets)."""
        planned = planned_batches(self.checkpoint)
        if not planned:
            return 0, initial_offset(), None
        last = planned[-1]
        if last in set(committed_batches(self.checkpoint)):
            return last + 1, self._offset(last), None
        start = self._offset(last - 1) if last > 0 else initial_offset()
        return last, start, self._offset(last)

    def _run_batch(self, n: int, start: dict[str, Any], end: dict[str, Any]) -> bool:
        """Stage and commit batch ``n``; ``False`` if halted before its commit."""
        name = self.outbox.name
        crash_point(name, "before_output", n)
        self.outbox.fence()  # a fenced reader stages nothing
        epoch = self.outbox.lease.epoch if self.outbox.lease is not None else 0
        target = self.outbox.loc.child(str(n), f"e{epoch}")
        target.delete()  # a re-run of the batch by this driver replaces its version
        ranges = plan_ranges(start, end, self.reader.opts.lateness_ms)
        size = sum(r.end - r.begin for r in ranges)
        with StagedStreams(
            target
        ) as staged:  # even with no rows: its offset moves the low watermark
            for group in deal_ranges(ranges, max(1, -(-size // PART_BYTES))):
                if self._halt.is_set():
                    return False
                tables = [pa.Table.from_batches([b]) for b in self.reader.read_ranges(group)]
                if tables:
                    staged.write(pa.concat_tables(tables, promote_options="default"))
        has_data = any(rows for stream, rows in staged.rows.items() if stream != SUMMARY_STREAM)
        crash_point(name, "after_output", n, has_data)
        self.outbox.fence()  # a fenced reader commits nothing
        crash_point(name, "before_commit", n, has_data)
        self._entry(COMMITS, n).write_text(COMMIT_ENTRY)
        # published at once, not at the driver loop's next round: a driver starts its
        # computations' queries before its loop runs, and they may read this meanwhile
        self.outbox.publish_committed()
        self._purge(n - RETAIN)
        return True
