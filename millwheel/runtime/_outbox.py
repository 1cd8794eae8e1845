"""Strong productions: a batch's output becomes visible only once the batch is committed (§6.1.2).

Each micro-batch of a query writes its whole output — productions, dead letters and the
per-interval summaries — to ``<root>/outbox/<query>/<batch id>/stream=<stream>/`` in the
``foreachBatch`` sink, *before* Spark writes the batch's commit-log entry. That directory
is the checkpoint of the batch's productions: Spark's state store commits the key
intervals' envelopes for the same batch, and the commit-log entry ``commits/<batch id>``
makes both durable together.

The driver *publishes* a batch — renames its files into the stream logs and applies its
summaries — only once ``commits/<batch id>`` exists. If the driver dies before the commit,
Spark re-runs the batch from the same offsets, the same watermark and the same starting
state; the re-run overwrites the outbox (``mode("overwrite")``) and only that version is
ever published. Record ids are derived from the committed per-key sequence number and the
key's life (the batch that started it, ``millwheel/_identity.py``), so a version published
before a crash and re-published after it (a crash in the middle of publishing) carries the
same ids, and consumers drop the re-delivery (§6.1.1); file names are deterministic, so a
file is never published twice.

Weak productions (§6.1.3) are renamed into the stream logs right in the sink, before the
commit, under a per-attempt name: a replay may publish a second version, which is the
documented cost of skipping the checkpoint.

**Zombie drivers.** Each attempt stages its batch under its driver's lease epoch
(``<batch id>/e<epoch>/``, see ``_lease.py``), checks the lease before staging, before
returning (so a fenced attempt is never committed) and before publishing, and a batch is
published from its newest epoch's version only; a batch at or below the last one
published is never published again (a zombie's late copy of it is deleted).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from millwheel.runtime._fs import Location
from millwheel.runtime._lease import Lease
from millwheel.runtime._spark_internals import committed_batches, compact_interruption
from millwheel.runtime._streams import FileStreamLog, file_name
from millwheel.runtime._wire import SUMMARY_STREAM, IntervalSummary

#: test hook: ``query:point:batch`` kills this process with SIGKILL at that point; ``batch``
#: may be ``data``: the first batch whose output holds records (not only summaries)
CRASH_ENV = "MILLWHEEL_CRASH"
#: in order: the sink starts; the outbox is written; weak productions are published and the
#: sink returns (Spark writes the commit next); a committed batch is about to be published;
#: its first file is published
CRASH_POINTS = ("before_output", "after_output", "before_commit", "before_publish", "mid_publish")


def crash_point(query: str, point: str, batch: int | None, has_data: bool = True) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    for item in spec.split(","):
        name, where, at = item.split(":")
        if (
            name == query
            and where == point
            and ((at == "data" and has_data) or (at.isdigit() and int(at) == batch))
        ):
            os.kill(os.getpid(), signal.SIGKILL)


def _numbers(loc: Location) -> list[int]:
    out = []
    for name in loc.list():
        try:
            out.append(int(name))
        except ValueError:
            continue
    return sorted(out)


def staged_version(batch: Location) -> Location | None:
    """The version of a staged batch to publish: its newest epoch's (``e<epoch>``), or ``None``."""
    epochs = [int(n[1:]) for n in batch.list() if n.startswith("e") and n[1:].isdigit()]
    return batch.child(f"e{max(epochs)}") if epochs else None


def stage_arrow(table: pa.Table, target: Location) -> None:
    """Write a batch's output rows as Spark's ``partitionBy("stream")`` would lay them out:
    ``target/stream=<stream>/part-00000-<uuid>.c000.parquet``, one file per stream, without
    the ``stream`` column — so publication reads either writer's outbox the same way."""
    with StagedStreams(target) as staged:
        staged.write(table)


class StagedStreams:
    """A batch's outbox written in one or more pieces (:meth:`write`), one Parquet file per
    stream: the driver's log reader stages a large batch a part at a time, in one file per
    stream all the same, so a consumer listing its stream never sees half a batch.

    Types are those Spark's Parquet writer gives (``string``/``binary``, not the large
    variants Arrow collection may use), so every stream-log file has one schema; a stream's
    later pieces take its first piece's.
    """

    def __init__(self, target: Location) -> None:
        self.target = target
        target.mkdirs()  # as Spark's writer does for an empty batch: the batch is staged, with no rows
        self.run = str(uuid.uuid4())  # dashed, as Spark names a write job (the checker reads it)
        self.writers: dict[str, pq.ParquetWriter] = {}
        #: rows written per stream
        self.rows: Counter[str] = Counter()

    def write(self, table: pa.Table) -> None:
        streams = table.column("stream")
        for stream in pc.unique(streams).to_pylist():
            rows = table.filter(pc.equal(streams, stream)).drop_columns(["stream"])
            writer = self.writers.get(stream)
            if writer is None:
                schema = pa.schema(
                    [pa.field(f.name, _small(f.type), f.nullable) for f in rows.schema]
                )
                d = self.target.child(f"stream={stream}")
                d.mkdirs()
                writer = pq.ParquetWriter(
                    f"{d.path}/part-00000-{self.run}.c000.parquet",
                    schema,
                    filesystem=d.fs,
                    compression="snappy",
                )
                self.writers[stream] = writer
            writer.write_table(rows.cast(writer.schema))
            self.rows[stream] += rows.num_rows

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()

    def __enter__(self) -> StagedStreams:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve_writer(master: str) -> str:
    """The outbox writer ``"auto"`` stands for on ``master``: ``"driver"`` when the executors
    run in the driver's JVM (``local``, ``local[N]``), where collecting a batch's output
    moves nothing between machines; ``"spark"`` on a cluster, where it would.

    >>> resolve_writer("local[2]"), resolve_writer("spark://127.0.0.1:7077")
    ('driver', 'spark')
    """
    return "driver" if master == "local" or master.startswith("local[") else "spark"


def _small(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    return t


def part_stats(loc: Location) -> tuple[int, int | None]:
    """``(rows, oldest timestamp that holds a watermark)`` of a stream-log Parquet file.

    From the footer statistics; when rows carry a sender watermark, a late row (``ts < wm``)
    holds nothing, so the oldest is ``min(max(ts, wm))``, read from the two columns.
    """
    with loc.fs.open_input_file(loc.path) as f:
        meta = pq.ParquetFile(f).metadata
    rows = meta.num_rows
    if rows == 0:
        return 0, None
    names = meta.schema.names
    if "wm" in names:
        wcol = names.index("wm")
        if any(
            meta.row_group(i).column(wcol).statistics is None
            or meta.row_group(i).column(wcol).statistics.null_count < meta.row_group(i).num_rows
            for i in range(meta.num_row_groups)
        ):
            with loc.fs.open_input_file(loc.path) as f:
                t = pq.read_table(f, columns=["ts", "wm"]).to_pydict()
            return rows, min(
                ts if wm is None else max(ts, wm) for ts, wm in zip(t["ts"], t["wm"], strict=True)
            )
    col = names.index("ts")
    lo: int | None = None
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(col).statistics
        if stats is None or not stats.has_min_max:
            lo = None
            break
        lo = stats.min if lo is None else min(lo, stats.min)
    if lo is None:
        with loc.fs.open_input_file(loc.path) as f:
            lo = min(pq.read_table(f, columns=["ts"]).column("ts").to_pylist())
    return rows, lo


class Outbox:
    """The outbox of one query: stage in the sink, publish after commit."""

    def __init__(
        self,
        name: str,
        root: Location,
        checkpoint: Location,
        streams: FileStreamLog,
        *,
        strong: bool,
        on_summary: Callable[[int, list[IntervalSummary]], None],
        on_published: Callable[[int], None] | None = None,
        before_publish: Callable[[int, list[IntervalSummary]], Callable[[], None] | None]
        | None = None,
        tally: Location | None = None,
        lease: Lease | None = None,
        writer: str = "spark",
    ) -> None:
        self.name = name
        #: who writes a batch's outbox (``RuntimeSettings.outbox_writer``): ``"spark"``, the
        #: executors through Spark's Parquet writer; ``"driver"``, the driver from the
        #: batch's rows collected as Arrow (:func:`stage_arrow`); ``"auto"``, decided by
        #: the session's master at the first batch (:func:`resolve_writer`)
        self.writer = writer
        self.loc = root
        self.checkpoint = checkpoint
        self.streams = streams
        self.strong = strong
        self.on_summary = on_summary
        self.on_published = on_published
        #: called with a batch and its summaries before its files are published; what it
        #: returns is called once they are (``ComputationQuery._before_publish``)
        self.before_publish = before_publish
        self.published = -1
        self.lock = threading.Lock()
        self.written = 0
        #: rows published per stream, and the step counters of published batches: durable,
        #: in ``tally`` (written before a published batch's outbox is deleted), so a
        #: resumed run reports totals and a batch re-published after a crash counts once
        self.written_by_stream: dict[str, int] = {}
        self.metrics: Counter[str] = Counter()
        self.tally = tally
        self.tallied = -1
        #: (stream, file name) -> wall time it became visible, for latency measurements
        self.published_at: dict[tuple[str, str], float] = {}
        #: who may write this outbox (``None``: no fencing, for tests that build one directly)
        self.lease = lease

    def fence(self) -> None:
        """Raise :class:`~millwheel.runtime._lease.FencedError` if another driver took this query over."""
        if self.lease is not None:
            self.lease.check()

    # ---- the foreachBatch sink --------------------------------------------------------
    def sink(self, df: Any, batch_id: int) -> None:
        crash_point(self.name, "before_output", batch_id)
        self.fence()  # a fenced attempt stages nothing
        epoch = self.lease.epoch if self.lease is not None else 0
        target = self.loc.child(str(batch_id), f"e{epoch}")
        if self.writer == "auto":
            self.writer = resolve_writer(df.sparkSession.sparkContext.master)
        try:
            if self.writer == "driver":
                target.delete()  # a re-run of the batch by this driver replaces its version
                stage_arrow(df.toArrow(), target)
            else:
                df.write.mode("overwrite").partitionBy("stream").parquet(target.uri)
        except Exception as exc:
            short = compact_interruption(exc)  # a stop, not a failure: see _session.py
            if short is None:
                raise
            raise short from None
        has_data = os.environ.get(CRASH_ENV) is not None and any(
            d.startswith("stream=") and d != f"stream={SUMMARY_STREAM}" for d in target.list()
        )
        crash_point(self.name, "after_output", batch_id, has_data)
        self.fence()  # raising here fails the batch: Spark does not commit it
        if not self.strong:
            with self.lock:
                self._publish_data(batch_id, target, attempt=uuid.uuid4().hex[:8], count=True)
        crash_point(self.name, "before_commit", batch_id, has_data)

    # ---- publication -------------------------------------------------------------------
    def committed(self) -> set[int]:
        return set(committed_batches(self.checkpoint))

    def _load_tally(self) -> None:
        text = self.tally.read_text() if self.tally is not None else None
        if not text:
            return
        saved = json.loads(text)
        self.tallied = saved["published"]
        self.published = max(self.published, self.tallied)
        self.written_by_stream = dict(saved["written_by_stream"])
        self.written = sum(self.written_by_stream.values())
        self.metrics = Counter(saved["metrics"])

    def _save_tally(self, n: int) -> None:
        self.tallied = n
        if self.tally is not None:
            self.tally.write_text(
                json.dumps(
                    {
                        "published": n,
                        "written_by_stream": self.written_by_stream,
                        "metrics": dict(self.metrics),
                    }
                )
            )

    def recover(self) -> None:
        """At start: publish what committed, drop what did not (Spark re-runs those batches)."""
        self._load_tally()
        committed = self.committed()
        for n in _numbers(self.loc):
            if n not in committed:
                self.loc.child(str(n)).delete()
        self.publish_committed()
        if committed:
            self.published = max(self.published, max(committed))

    def publish_committed(self) -> int:
        """Publish every committed, unpublished batch in order; return how many."""
        done = 0
        with self.lock:
            staged = _numbers(self.loc)
            if not staged:
                return 0
            committed = self.committed()
            for n in staged:
                if n not in committed:
                    break
                if n <= self.published:
                    self.loc.child(
                        str(n)
                    ).delete()  # published already: a fenced attempt's late copy
                    continue
                self.fence()
                crash_point(self.name, "before_publish", n)
                try:
                    self._publish(n)
                except FileNotFoundError:
                    # its files went while it was read: a driver that took over since the
                    # check above published and deleted them; this one is fenced, not failed
                    self.fence()
                    raise
                done += 1
        return done

    def _publish(self, n: int) -> None:
        staged = self.loc.child(str(n))
        batch = staged_version(staged)
        count = (
            n > self.tallied
        )  # not counted yet (a crash may have cut the last publication short)
        summaries: list[IntervalSummary] = []
        if batch is None:  # staged and committed, but its files are gone: nothing to publish
            self.on_summary(n, summaries)
            staged.delete()
            self.published = max(self.published, n)
            return
        summary = batch.child(f"stream={SUMMARY_STREAM}")
        for part in sorted(summary.list()):
            if part.endswith(".parquet"):
                loc = summary.child(part)
                with loc.fs.open_input_file(loc.path) as f:
                    table = pq.read_table(f, columns=["value"])
                summaries += [IntervalSummary.decode(v) for v in table.column("value").to_pylist()]
        then = self.before_publish(n, summaries) if self.before_publish is not None else None
        self._publish_data(n, batch, attempt=None, count=count)
        if then is not None:
            then()
        if count:
            for s in summaries:
                self.metrics.update(s.metrics)
            self._save_tally(n)
        self.on_summary(n, summaries)
        if self.on_published is not None:
            self.on_published(n)
        staged.delete()
        self.published = max(self.published, n)

    def _publish_data(self, n: int, batch: Location, attempt: str | None, count: bool) -> None:
        """Rename the batch's files into the stream logs: every file's footer is read first,
        so the renames follow each other closely and a consumer listing meanwhile rarely
        sees part of the batch (it would read the rest in its next batch)."""
        files: list[tuple[str, Location, str, int, int]] = []
        for sub in sorted(batch.list()):
            if not sub.startswith("stream=") or sub == f"stream={SUMMARY_STREAM}":
                continue
            stream = sub[len("stream=") :]
            d = batch.child(sub)
            for part in sorted(d.list()):
                if not part.endswith(".parquet") or part.startswith((".", "_")):
                    continue
                loc = d.child(part)
                rows, lo = part_stats(loc)
                if rows == 0 or lo is None:
                    loc.delete()
                    continue
                files.append((stream, loc, part, rows, lo))
        for i, (stream, loc, part, rows, lo) in enumerate(files):
            stem = part[: -len(".parquet")].replace(".", "_")
            tag = f"b{n:010d}-{stem}" if attempt is None else f"b{n:010d}-w{attempt}-{stem}"
            self.streams.ensure(stream, self.name)
            self.streams.publish(loc, stream, self.name, tag, lo)
            self.published_at[(stream, file_name(tag, lo))] = time.time()
            if count:
                self.written += rows
                self.written_by_stream[stream] = self.written_by_stream.get(stream, 0) + rows
            if i == 0:
                crash_point(self.name, "mid_publish", n)


def committed_unpublished(root: str, stream: str) -> list[Any]:
    """Values a stopped run directory has committed to ``stream`` but not yet published.

    A driver killed after Spark's commit-log entry and before publication leaves the
    batch staged: nothing replays it, and its next start publishes it (:meth:`Outbox.recover`).
    Until then it is output all the same — verification across pipelines (Photon §3.3.3)
    counts it as such, so it never re-injects what the restart will publish. Read it only
    while the run is stopped (a running driver publishes and deletes as it goes).
    """
    from millwheel._fields import FIELDS_COLUMN, rebuild_values

    base = Location.of(root)
    out: list[Any] = []
    outbox = base.child("outbox")
    for query in sorted(outbox.list()) if outbox.exists() else []:
        commits = set(committed_batches(base.child("checkpoints", query)))
        text = base.child("tallies", f"{query}.json").read_text()
        published = json.loads(text)["published"] if text else -1
        for n in _numbers(outbox.child(query)):
            if n not in commits or n <= published:
                continue
            batch = staged_version(outbox.child(query, str(n)))
            d = batch.child(f"stream={stream}") if batch is not None else None
            if d is None or not d.exists():
                continue
            for part in sorted(d.list()):
                if part.endswith(".parquet") and not part.startswith((".", "_")):
                    loc = d.child(part)
                    with loc.fs.open_input_file(loc.path) as f:
                        t = pq.read_table(f)
                        out += rebuild_values(
                            t.column("value").to_pylist(),
                            t.column(FIELDS_COLUMN) if FIELDS_COLUMN in t.column_names else None,
                        )
    return out
