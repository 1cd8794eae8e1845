"""Injectors on the Spark runtime (MillWheel §5.2): bring records into a stream log and
publish an injector low watermark.

* :class:`SourceInjector` — any :class:`millwheel.Source` (e.g. ``SampleSource``), run in
  the driver: one source batch becomes one stream-log file, named by its position, and
  the position is checkpointed after the file is published (a replay re-creates the same
  file name and skips it). For demos and tests.
* :class:`LogFileInjector` — a :class:`~millwheel.LogFileSource` read by a Spark
  streaming query (``_logfiles.py``) or, on a local master, by a thread of the driver
  that runs the query's protocol (``_logreader.py``, ``RuntimeSettings.log_reader``);
  byte offsets per file live in the injector's checkpoint, output goes through the same
  outbox as computations, malformed lines go to ``dead_letters``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._delivery import invalid_record, record_problem
from millwheel._logfile import (
    disorder,
    holding_file,
    initial_offset,
    is_log_file,
    progress_of,
    unread,
)
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, Record
from millwheel._sources import Source, SourceBatch
from millwheel._topology import InjectorSpec
from millwheel.runtime._context import DriverContext
from millwheel.runtime._lease import Lease
from millwheel.runtime._logreader import DriverLogReader
from millwheel.runtime._outbox import Outbox, resolve_writer
from millwheel.runtime._session import start_query
from millwheel.runtime._spark_internals import (
    OFFSETS,
    has_started,
    offset_log_entries,
    polling_delay_conf,
)
from millwheel.runtime._usercode import RestartPolicy
from millwheel.runtime._wire import IntervalSummary


class SourceInjector:
    """Feeds a :class:`~millwheel.Source` from the driver, ``batches_per_poll`` at a time."""

    def __init__(self, rt: DriverContext, spec: InjectorSpec) -> None:
        self.rt = rt
        self.name = spec.name
        self.stream = spec.stream
        self.source: Source | None = spec.source
        #: the position, one file per lease epoch (``<epoch>.json``): a zombie driver that
        #: writes after it was fenced writes an older epoch's file, which nobody reads
        self.state_dir = rt.root.child("injectors", self.name)
        self._older_removed = False
        self.position = 0
        self.low_watermark = MIN_TIMESTAMP
        self.records_out = 0
        self.dead_letters = 0
        #: the newest record timestamp sent since this driver started (the live status's "head" of the input)
        self.newest = MIN_TIMESTAMP
        self._iter: Iterator[SourceBatch] | None = None
        self.finished = self.source is None
        #: fences this injector's stream files and position against a zombie driver (``_lease.py``)
        self.lease = Lease(
            rt.root.child("leases", f"injector.{self.name}"), f"injector {self.name!r}"
        )

    def start(self) -> None:
        self.state_dir.mkdirs()
        self.lease.acquire(self.rt.driver_epoch.get())
        text = self._saved_position()
        if text:
            saved = json.loads(text)
            self.position, self.low_watermark = saved["position"], saved["low_watermark"]
            self.records_out = saved.get("records_out", 0)
            self.dead_letters = saved.get("dead_letters", 0)
        if self.source is not None:
            self._iter = iter(self.source.batches(self.name, self.stream))
            for _ in range(self.position):
                if next(self._iter, None) is None:
                    break
        self.rt.watermarks.expect_injector_processes(self.name, ["driver"])
        self.rt.watermarks.report_injector(self.name, "driver", self.low_watermark)

    def poll(self) -> None:
        if self._iter is None or self.finished:
            return
        for _ in range(self.rt.settings.injector_batches_per_poll):
            if (
                self.rt.settings.lockstep
                and self.position
                and not self.rt.caught_up(self.low_watermark)
            ):
                break
            batch = next(self._iter, None)
            if batch is None:
                self.finished = True
                break
            # before each batch's writes, not only once per driver round: a driver paused
            # here for long enough to be replaced stops instead of writing on
            self.lease.check()
            good, dead = self._checked(batch.records)
            self.rt.streams.append(
                self.stream, self.name, f"s{self.position:010d}", good, self.low_watermark
            )
            dead += batch.dead_letters
            if dead:
                self.rt.streams.ensure(DEAD_LETTER_STREAM, self.name)
                self.rt.streams.append(
                    DEAD_LETTER_STREAM, self.name, f"d{self.position:010d}", dead
                )
                self.dead_letters += len(dead)
            self.position += 1
            self.records_out += len(good)
            self.newest = max([self.newest, *(r.timestamp for r in good)])
            self.low_watermark = max(self.low_watermark, batch.low_watermark)
            self._save_position()
        self.rt.watermarks.report_injector(self.name, "driver", self.low_watermark)

    def _position_files(self) -> dict[int, str]:
        """Epoch -> name of each position file (``<epoch>.json``)."""
        return {
            int(n[:-5]): n
            for n in self.state_dir.list()
            if n.endswith(".json") and n[:-5].isdigit()
        }

    def _saved_position(self) -> str | None:
        """The newest epoch's position file (a driver's own epoch is the newest once it has
        written); a run directory from before the per-epoch files has ``injectors/<name>.json``."""
        files = self._position_files()
        if files:
            return self.state_dir.child(files[max(files)]).read_text()
        return self.rt.root.child("injectors", f"{self.name}.json").read_text()

    def _save_position(self) -> None:
        saved = {
            "position": self.position,
            "low_watermark": self.low_watermark,
            "records_out": self.records_out,
            "dead_letters": self.dead_letters,
        }
        self.state_dir.child(f"{self.lease.epoch:012d}.json").write_text(json.dumps(saved))
        if not self._older_removed:  # older epochs' files: ours is the newest now
            for epoch, name in self._position_files().items():
                if epoch < self.lease.epoch:
                    self.state_dir.child(name).delete()
            self.rt.root.child("injectors", f"{self.name}.json").delete()
            self._older_removed = True

    def _checked(self, records: list[Record]) -> tuple[list[Record], list[Record]]:
        """Records fit to send, and dead letters for the others (bad id or timestamp)."""
        good: list[Record] = []
        dead: list[Record] = []
        for i, rec in enumerate(records):
            problem = record_problem(rec)
            if problem is None:
                good.append(rec)
            else:
                dead.append(
                    invalid_record(self.name, self.stream, rec, problem, (self.position, i))
                )
        return good, dead

    def check(self) -> None:
        self.lease.check()

    def stop(self) -> None:
        pass

    def drained(self) -> bool:
        return self.low_watermark >= MAX_TIMESTAMP

    def status(self) -> dict[str, Any]:
        newest = self.newest if self.newest > MIN_TIMESTAMP else None
        return {
            "records_out": self.records_out,
            "dead_letters": self.dead_letters,
            "low_watermark": self.low_watermark,
            "newest_event_ms": newest,
        }


class QueryInjector:
    """What an injector run as a Spark streaming query shares: its outbox (strong, fenced by
    the injector's lease), its counters, the start-up recovery and the restart on failure.
    Subclasses say how a batch becomes stream-log rows (``start``) and how the low
    watermark follows the published batches (``_published``)."""

    def __init__(self, rt: DriverContext, spec: InjectorSpec) -> None:
        self.rt = rt
        self.name = spec.name
        self.stream = spec.stream
        self.checkpoint = rt.root.child("checkpoints", f"injector.{self.name}")
        self.outbox = Outbox(
            self.name,
            rt.root.child("outbox", f"injector.{self.name}"),
            self.checkpoint,
            rt.streams,
            strong=True,
            on_summary=self._summary,
            on_published=self._published,
            tally=rt.root.child("tallies", f"injector.{self.name}.json"),
            lease=Lease(
                rt.root.child("leases", f"injector.{self.name}"), f"injector {self.name!r}"
            ),
            writer=rt.settings.outbox_writer,
        )
        self.low_watermark = MIN_TIMESTAMP
        self.query: Any = None
        self.restart_policy = RestartPolicy(f"injector {self.name!r}", rt.settings.max_restarts)

    @property
    def records_out(self) -> int:
        return self.outbox.written_by_stream.get(self.stream, 0)

    @property
    def dead_letters(self) -> int:
        return self.outbox.written_by_stream.get(DEAD_LETTER_STREAM, 0)

    def _published(self, n: int) -> None:
        raise NotImplementedError

    def _summary(self, _n: int, _summaries: list[IntervalSummary]) -> None:
        """The per-batch summary rows; injectors without a use for them ignore them."""

    def _recover(self) -> None:
        """Before (re)starting the query: hold the lease — a restart after a failure only if
        no other driver took over — and publish every batch committed before this start."""
        lease = self.outbox.lease
        if lease is not None and lease.epoch:
            lease.check()
        else:
            lease.acquire(self.rt.driver_epoch.get())  # type: ignore[union-attr]
        self.outbox.recover()
        if self.outbox.published >= 0:
            self._published(self.outbox.published)

    def start(self) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Fenced if another driver took the lease; a failed query is restarted under the restart policy."""
        self.outbox.fence()
        q = self.query
        if q is None or q.isActive or q.exception() is None:
            return
        self.rt.log(self.restart_policy.failed(q.exception()))
        self.start()

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None


class LogFileInjector(QueryInjector):
    """Reads a :class:`~millwheel.LogFileSource` with a Spark streaming query, or with the
    driver's reader (:attr:`reader`), which keeps the same checkpoint (``_logreader.py``).

    **Waiting for a first file.** A directory that is complete (``_DONE``, or a ``finite``
    source) and holds no log file, read by an injector whose query never started, gets no
    query until a log file lands in it (:attr:`waiting`): its low watermark is +inf at
    once — what the query's first batch would publish — and the driver loop looks at the
    directory each round. This is Photon's re-injection directory (verification writes
    into it, §3.3.3, mostly never): its query would cost a Python planner process (its
    imports are ~1 s of CPU), an empty micro-batch and a poll of the directory every
    :attr:`RuntimeSettings.injector_poll_ms` for the whole run. A directory whose query ran
    before (its checkpoint has batches) always gets its query: the checkpoint holds its offsets.
    """

    def __init__(self, rt: DriverContext, spec: InjectorSpec) -> None:
        super().__init__(rt, spec)
        self.source = spec.source
        self.finished = False
        self.offset: dict[str, Any] | None = None
        self._moved_at = time.monotonic()
        self._warned = False
        #: no query yet: the directory is complete and has no log file (see the class docstring)
        self.waiting = False
        #: the driver's reader in place of the query (``RuntimeSettings.log_reader``)
        self.reader: DriverLogReader | None = None
        self._reader_kind: str | None = None

    def _published(self, n: int) -> None:
        text = self.checkpoint.child(OFFSETS, str(n)).read_text()
        entries = offset_log_entries(text) if text else []
        if not entries or not isinstance(entries[-1], dict):
            return
        offset = entries[-1]
        self.offset = offset
        lw = max(self.low_watermark, int(offset["lw"]))
        if lw != self.low_watermark:
            self.low_watermark = lw
            self._moved_at = time.monotonic()
            self._warned = False

    def stalled(self) -> str | None:
        """Why the injector low watermark has not moved for ``stall_warning_s``, naming the file holding it."""
        waited = time.monotonic() - self._moved_at
        if (
            self.low_watermark >= MAX_TIMESTAMP
            or waited < self.rt.settings.stall_warning_s
            or self.offset is None
        ):
            return None
        opts = self.source.read_options  # type: ignore[union-attr]
        name = holding_file(self.offset, opts.lateness_ms)
        if name is None:
            return None
        try:
            left = os.stat(os.path.join(opts.path, name)).st_size - int(
                self.offset["files"][name]["pos"]
            )
        except (OSError, KeyError, TypeError):
            left = 0
        half = (
            f" (its last {left} bytes are a line without a newline, read once it is finished)"
            if left > 0
            else ""
        )
        return (
            f"injector {self.name}: low watermark unchanged for {waited:.0f}s, held by {name!r}, which is not "
            f"finished{half}; finish it with a {name}.done marker, a newer file, _DONE, or LogFileSource(idle_finish_ms=...)"
        )

    def _nothing_to_read(self) -> bool:
        """The directory is complete and holds no log file, and the query never started."""
        opts = self.source.read_options  # type: ignore[union-attr]
        try:
            names = os.listdir(opts.path)
        except FileNotFoundError:
            return False  # a directory still to be made: the query waits for it as before
        complete = opts.finite or "_DONE" in names
        return (
            complete and not any(is_log_file(n) for n in names) and not has_started(self.checkpoint)
        )

    @property
    def reading(self) -> bool:
        """Its query or the driver's reader is running (not :attr:`waiting`, not stopped)."""
        return self.query is not None or self.reader is not None

    def reader_kind(self) -> str:
        """``"driver"`` or ``"spark"``: who reads the directory (``RuntimeSettings.log_reader``,
        ``"auto"`` decided by the session's master as the outbox writer is)."""
        if self._reader_kind is None:
            kind = self.rt.settings.log_reader
            if kind == "auto":
                master = self.rt.master
                kind = "spark" if master is None else resolve_writer(master)
            self._reader_kind = kind
        return self._reader_kind

    def register(self) -> None:
        """Register the log-file data source with the session (its first Python data source
        makes Spark look up the installed ones: :meth:`SparkRuntime.start` does it early).
        The driver's reader needs none."""
        from millwheel.runtime._logfiles import LogFileDataSource

        if self.reader_kind() == "spark":
            self.rt.spark.dataSource.register(LogFileDataSource)

    def start(self) -> None:
        from millwheel.runtime._logfiles import FORMAT, keyer_options

        if self.reader is not None:
            # started before Spark was up (:meth:`SparkRuntime.start_readers`); a failure
            # of it meanwhile goes through :meth:`check` and the restart policy
            return
        self._recover()
        self.waiting = self._nothing_to_read()
        if self.waiting:
            self.low_watermark = MAX_TIMESTAMP
            self.rt.watermarks.expect_injector_processes(self.name, ["spark"])
            self.rt.watermarks.report_injector(self.name, "spark", self.low_watermark)
            return
        options = dict(self.source.options())  # type: ignore[union-attr]
        options.update(injector=self.name, stream=self.stream)
        options.update(keyer_options(self.rt.keyer, self.stream))
        if self.rt.settings.drain:
            options["finite"] = "1"
        self.rt.watermarks.expect_injector_processes(self.name, ["spark"])
        self.rt.watermarks.report_injector(self.name, "spark", self.low_watermark)
        if self.reader_kind() == "driver":
            self.reader = DriverLogReader(
                self.name, self.checkpoint, self.outbox, options, self.rt.settings.injector_poll_ms
            )
            self.reader.start()
            return
        spark = self.rt.spark
        self.register()  # at once if done before (a restart, or :meth:`SparkRuntime.start`)
        # a batch's files are read by one task per core, not one task per file (``_logfiles.py``)
        options["partitions"] = str(max(1, int(spark.sparkContext.defaultParallelism)))
        df = spark.readStream.format(FORMAT).options(**options).load()
        writer = (
            df.writeStream.queryName(f"millwheel.injector.{self.name}")
            .foreachBatch(self.outbox.sink)
            .option("checkpointLocation", self.checkpoint.uri)
        )
        if self.rt.settings.trigger_ms > 0:
            writer = writer.trigger(processingTime=f"{self.rt.settings.trigger_ms} milliseconds")
        # an idle look at the directory is a round trip to the Python planner: not every 10 ms
        # (``RuntimeSettings.injector_poll_ms``); not while a computation's start has the session's settings changed
        self.query = start_query(
            writer, spark, polling_delay_conf(self.rt.settings.injector_poll_ms)
        )

    def check(self) -> None:
        """As a query's: fenced if another driver took the lease; a failed reader is
        restarted from the checkpoint under the restart policy."""
        reader = self.reader
        if reader is None:
            super().check()
            return
        self.outbox.fence()
        if reader.error is None:
            return
        self.reader = None
        self.rt.log(self.restart_policy.failed(reader.error_text or reader.error))
        self.start()

    def stop(self) -> None:
        if self.reader is not None:
            self.reader.halt()
            self.reader = None
        super().stop()

    def poll(self) -> None:
        if self.waiting and not self._nothing_to_read():
            self.rt.log(
                f"injector {self.name}: a file landed in its finished directory; starting its query"
            )
            self.start()
        self.outbox.publish_committed()
        self.rt.watermarks.report_injector(self.name, "spark", self.low_watermark)
        warning = self.stalled()
        if warning is not None and not self._warned:
            self.rt.log(warning)
            self._warned = True

    def drained(self) -> bool:
        """Finished, published, and nothing left in the directory to read (a file may land
        in a finished directory later: verification's re-injections, Photon §3.3.3)."""
        if self.low_watermark < MAX_TIMESTAMP or self.outbox.loc.list():
            return False
        return not unread(self.offset or initial_offset(), self.source.read_options)  # type: ignore[union-attr]

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "records_out": self.records_out,
            "dead_letters": self.dead_letters,
            "low_watermark": self.low_watermark,
        }
        # the newest timestamp read from any file, from the last published offset (the live status's "head")
        files = progress_of(self.offset).values() if self.offset else ()
        newest = [p.newest for p in files if p.newest is not None]
        out["newest_event_ms"] = max(newest) if newest else None
        measured = disorder(self.offset) if self.offset else None
        if measured is not None:
            out["disorder_ms"], out["disorder_file"] = measured
        positional = self.outbox.metrics.get(
            "positional_ids", 0
        )  # lines without an id field (the reader's summary rows)
        if positional:
            out["positional_ids"] = positional
        warning = self.stalled()
        if warning is not None:
            out["warning"] = warning
        return out
