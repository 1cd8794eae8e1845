"""Records read by the step from the batch's own files: columnar computations, either mapping.

::

    inputs ─► the key-interval column only ─► mapInArrow(Markers): per task, one row per
        group it saw ─┐
    heartbeats, ticks, a rescale's rows ──┴─► union ─► groupBy(group)
        ─► applyInPandasWithState(ColumnarIntervalStep): a marked group reads its key
           interval's records from the files its micro-batch consumed
           (the Arrow mapping, ``plans/arrow.py``: no markers; repartition(N, group)
           ─► mapInArrow(IntervalTask), each task finding the intervals of its partition
           in the batch's files, :func:`batch_intervals`, and reading them the same way)

``applyInPandasWithState`` needs its input hash-partitioned and sorted by the grouping
key: every record would cross the shuffle as a row of ten columns (Spark's row format,
written, read and sorted in the JVM) and reach the worker through PySpark's Arrow to
pandas conversion, a Python object per value. A columnar computation reads its records as
columns anyway, and every record a producer wrote carries the key interval it belongs to
(``interval:C``, ``_keying.py``). So the JVM reads only that column and tells each key
interval that its micro-batch has records for it; the step finds the micro-batch's files
in the query's own checkpoint (the offset log and the file sources' logs, which Spark
writes before it runs the batch and a replay reads again: the same files, so the same
records, §6.1.1) and reads its interval's rows of them with pyarrow. A Python worker
decodes each file of the batch once (:data:`_CACHE`) for all the intervals it runs.

The records are the ones the row plan hands over, built the same way
(``plans/_inputs.keyed_by_producer``): key from ``key:C``, the file name and row index for the
send order, the stream's name; a row without ``interval:C`` (its producer could not key
it) goes to interval ``pmod(xxhash64(id), intervals)`` — Spark's hash, which
:func:`spark_xxhash64` computes — as a row to key in the step. An input whose consumer
carries declared fields (``_fieldcols.py``) or keys its rows itself (the keying stage) is
read as rows. A checkpoint resumes reading an input either way: the file sources, the
grouping key and the state schema are the same.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from millwheel.runtime._fs import Location
from millwheel.runtime._spark_internals import (
    OFFSETS,
    SOURCES,
    file_source_offsets,
    source_log_files,
    task_batch_id,
)
from millwheel.runtime._wire import RowKind

#: the column of a marker row (``True``): its group has records in the batch's files
SCAN_COLUMN = "scan"
#: what the marking ``mapInArrow`` returns (Spark DDL)
MARKER_SCHEMA = f"group int, {SCAN_COLUMN} boolean"
#: the step's input columns when it reads every input from the files: what markers,
#: heartbeats, ticks and a rescale's rows carry (``_columnar.ColumnarIntervalStep.read_marked``)
SCAN_ONLY_COLUMNS = ("kind", "key", "value", "now", "wm", "upto", "wm_ts", "group", SCAN_COLUMN)


class Markers:
    """The ``mapInArrow`` function: one row per group its task's rows belong to."""

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        seen: set[int | None] = set()
        for b in batches:
            if b.num_rows:
                g = b.column(0)
                seen.update(np.unique(g.drop_null().to_numpy()).tolist())
                if (
                    g.null_count
                ):  # a row of no group of this layout: the step fails on it, as on the row plan
                    seen.add(None)
        if seen:
            yield pa.RecordBatch.from_arrays(
                [pa.array(list(seen), pa.int32()), pa.array([True] * len(seen))],
                names=["group", SCAN_COLUMN],
            )


@dataclass(frozen=True)
class ScannedInput:
    """One input directory the step reads itself: its stream, its producer's directory."""

    stream: str
    producer: str
    #: the directory's ``Location.uri``
    uri: str


@dataclass(frozen=True)
class BatchScan:
    """What a step needs to read its records from its micro-batch's files."""

    #: the query's checkpoint (``Location.uri``)
    checkpoint: str
    inputs: tuple[ScannedInput, ...]
    #: the producer's key columns for this computation (``_keying.key_columns``)
    key_column: str
    interval_column: str
    #: key intervals: a row without ``interval:C`` goes to ``pmod(xxhash64(id), intervals)``
    intervals: int
    #: read each record's value with its other columns (the computation reads values);
    #: ``False``: :meth:`records_lazy` leaves them in the files until first asked for
    values: bool = True

    def records(self, interval: int, batch: int | None = None) -> pa.Table | None:
        """Key interval ``interval``'s records in micro-batch ``batch`` (``None``: the
        task's) as union rows: ``kind``, ``key``, ``id``, ``ts``, ``value``, ``wm``,
        ``stream``, ``src``, ``row``, ``now`` (``None``: none)."""
        return self.records_lazy(interval, batch, values=True)[0]

    def records_lazy(
        self, interval: int, batch: int | None = None, *, values: bool | None = None
    ) -> tuple[pa.Table | None, FileValues | None]:
        """:meth:`records`, without reading the values when the computation reads none
        (``values``, default :attr:`values`): the table's ``value`` column is then null
        and the :class:`FileValues` (``None``: nothing left out) reads them when asked —
        a record that fails and is dead-lettered, one late to a stream, a row to key."""
        if batch is None:
            batch = task_batch()
        want = self.values if values is None else values
        parts, sources, missing = [], [], False
        for inp, name in batch_files(self, batch):
            got = _file_rows(self, inp, name, interval, want)
            if got is None:
                continue
            rows, has = got
            if rows.num_rows:
                parts.append(_union_rows(rows, inp.stream, name))
                sources.append(rows.column("value") if has else f"{inp.uri}/{name}")
                missing |= not has
        if not parts:
            return None, None
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        return table, FileValues(
            [(src, p.column("row")) for src, p in zip(sources, parts, strict=True)]
        ) if missing else None


class FileValues:
    """The values of a key interval's scanned records, read from their files when first
    asked for (:meth:`load`; ``InputColumns`` calls it): a computation that reads no values
    never decodes them, and a failing record still reaches its dead letter whole."""

    def __init__(
        self,
        parts: list[tuple[pa.ChunkedArray | str, pa.ChunkedArray]],
        order: np.ndarray | None = None,
    ) -> None:
        #: per file, in the table's order: its values already read, or the file's URI; and the rows' indexes in it
        self.parts = parts
        self.order = order

    def ordered(self, order: np.ndarray | None) -> FileValues:
        """The same values in ``order`` (the rows of the table taken in that order)."""
        return (
            self
            if order is None
            else FileValues(self.parts, order if self.order is None else self.order[order])
        )

    def load(self) -> pa.Array:
        chunks = []
        for src, rows in self.parts:
            if isinstance(src, str):
                loc = Location.of(src)
                col = (
                    pq.ParquetFile(loc.path, filesystem=loc.fs)
                    .read(columns=["value"])
                    .column(0)
                    .cast(pa.binary())
                )
                src = col.take(rows)
            chunks.extend(src.chunks)
        values = pa.chunked_array(chunks, pa.binary()).combine_chunks()
        return values if self.order is None else values.take(pa.array(self.order))

    def fill(self, table: pa.Table) -> pa.Table:
        """``table`` (the rows these values are of, in this order) with its values read."""
        return table.set_column(table.column_names.index("value"), "value", self.load())


def task_batch() -> int:
    """The micro-batch the running Spark task belongs to."""
    batch = task_batch_id()
    if batch is None:
        msg = "a columnar step reads its micro-batch's files, but its Spark task belongs to no micro-batch"
        raise RuntimeError(msg)
    return batch


#: per Python worker and query (its checkpoint): the batch it runs, that batch's scanned
#: files, and the files decoded so far (path -> the file's rows by interval); a worker
#: runs one batch of a query at a time, so a new batch drops the query's old entries
_CACHE: dict[str, tuple[tuple[int, str], list[tuple[ScannedInput, str]], dict[str, Any]]] = {}
_LOCK = threading.Lock()
#: path -> bytes of its decoded rows, for the entries of :data:`_CACHE`
_SIZES: dict[str, int] = {}


def batch_files(scan: BatchScan, batch: int) -> list[tuple[ScannedInput, str]]:
    """The files of ``scan``'s inputs that micro-batch ``batch`` consumed, in log order:
    (input, file name); from the offset log (``offsets/<batch>`` and the one before,
    each source's log offset) and the file sources' logs (``sources/<i>/<n>``, or the
    compacted ``<n>.compact`` that holds it)."""
    cp = Location.of(scan.checkpoint)
    text = cp.child(OFFSETS, str(batch)).read_text()
    if text is None:
        msg = f"micro-batch {batch} has no offset log entry in {scan.checkpoint}"
        raise RuntimeError(msg)
    with (
        _LOCK
    ):  # keyed by the entry's text too: a rescale may drop a planned batch and plan it anew
        cached = _CACHE.get(scan.checkpoint)
        if cached is None or cached[0] != (batch, text):
            for path in cached[2] if cached is not None else ():
                _SIZES.pop(path, None)
            cached = _CACHE[scan.checkpoint] = (
                (batch, text),
                _read_batch_files(scan, batch, text),
                {},
            )
        return list(cached[1])


def _read_batch_files(scan: BatchScan, batch: int, text: str) -> list[tuple[ScannedInput, str]]:
    cp = Location.of(scan.checkpoint)
    upto = file_source_offsets(text)
    before = (
        file_source_offsets(cp.child(OFFSETS, str(batch - 1)).read_text() or "")
        if batch > 0
        else {}
    )
    dirs = {tuple(_parts(inp.uri)[-3:]): inp for inp in scan.inputs}  # (streams, stream, producer)
    out = []
    for i, last in sorted(upto.items()):
        first = before.get(i, -1) + 1
        if first > last:
            continue
        entries = log_entries(cp.child(SOURCES, str(i)), first, last)
        for parts, _ in entries:
            inp = dirs.get(tuple(parts[-4:-1]))
            if inp is not None:
                out.append((inp, parts[-1]))
    return out


def _parts(uri: str) -> list[str]:
    return urllib.parse.unquote(uri).rstrip("/").split("/")


def log_entries(log: Location, first: int, last: int) -> list[tuple[list[str], int]]:
    """The entries of file-source log ``log`` added at offsets ``first`` to ``last``."""
    names = set(log.list())
    out: list[tuple[list[str], int]] = []
    for n in range(first, last + 1):
        name = str(n) if str(n) in names else f"{n}.compact"
        if name not in names:  # an older offset inside a later compaction
            later = sorted(
                int(x.split(".")[0])
                for x in names
                if x.endswith(".compact") and int(x.split(".")[0]) >= n
            )
            if not later:
                msg = f"file-source log {log.uri} has no entry for offset {n} (it has {sorted(names)})"
                raise RuntimeError(msg)
            name = f"{later[0]}.compact"
        entries = source_log_files(log.child(name).read_text() or "")
        if entries is None:
            msg = f"file-source log entry {log.child(name).uri} is incomplete"
            raise RuntimeError(msg)
        out += [e for e in entries if e[1] == n]
    return out


def _file_rows(
    scan: BatchScan, inp: ScannedInput, name: str, interval: int, values: bool = True
) -> tuple[pa.Table, bool] | None:
    """File ``name`` of ``inp``: its rows of key interval ``interval``, in file order, and
    whether their values were read (``values``: read them; a file with rows to key here is
    read whole either way). A worker decodes each file of the batch once for all the
    intervals it runs, keeping up to :data:`CACHE_BYTES` of them (a batch bigger than that
    decodes some files again)."""
    table, intervals, starts, has = _file_entry(scan, inp, name, values)
    i = int(np.searchsorted(intervals, interval))
    if i == len(intervals) or intervals[i] != interval:
        return None
    return table.slice(starts[i], starts[i + 1] - starts[i]), has


def _file_entry(
    scan: BatchScan, inp: ScannedInput, name: str, values: bool
) -> tuple[pa.Table, np.ndarray, np.ndarray, bool]:
    """File ``name`` of ``inp`` decoded by :func:`_by_interval`, from this worker's cache
    (:func:`batch_files` set up the batch's entry) or read now and kept."""
    path = f"{inp.uri}/{name}"
    with _LOCK:
        rows = _CACHE[scan.checkpoint][2]
        entry = rows.pop(path, None)
    if entry is None or (values and not entry[3]):
        entry = _by_interval(scan, Location.of(inp.uri).child(name), values)
        _SIZES[path] = entry[0].nbytes
    with _LOCK:
        rows[path] = entry  # the newest last: evicted last
        while (
            sum(_SIZES.get(p, 0) for q in _CACHE.values() for p in q[2]) > CACHE_BYTES
            and len(rows) > 1
        ):
            _SIZES.pop(evicted := next(iter(rows)), None)
            del rows[evicted]
    return entry


def batch_intervals(scan: BatchScan, batch: int | None = None) -> set[int]:
    """The key intervals with records in micro-batch ``batch``'s files (``None``: the task's):
    what the markers of a plan that scans the inputs in Spark say, found by a task of a plan
    that does not (``Plan.marks_in_tasks``). Each file is decoded as :meth:`BatchScan.records_lazy`
    then reads it, so the worker decodes it once for both."""
    if batch is None:
        batch = task_batch()
    out: set[int] = set()
    for inp, name in batch_files(scan, batch):
        out.update(_file_entry(scan, inp, name, scan.values)[1].tolist())
    return out


#: decoded files a Python worker keeps for the other intervals of its batch
CACHE_BYTES = 512 << 20
_COLUMNS = ("id", "ts", "key", "value", "wm")


def _by_interval(
    scan: BatchScan, loc: Location, values: bool = True
) -> tuple[pa.Table, np.ndarray, np.ndarray, bool]:
    """A file's rows ordered by key interval (stable: file order within one), with their
    row index; the distinct intervals and where each starts; whether the values were read
    (``values``: read them; a null ``value`` column otherwise). A row without
    ``interval:C`` (its producer could not key it) goes where
    ``plans/_inputs.keyed_by_producer`` sends it: interval ``pmod(xxhash64(id), intervals)``
    (Spark's hash, seed 42), kind :attr:`RowKind.UNKEYED`, to be keyed by the step, which
    needs its value: such a file is read whole."""
    f = pq.ParquetFile(loc.path, filesystem=loc.fs)
    present = set(f.schema_arrow.names)
    t = f.read(
        columns=[
            c
            for c in (*_COLUMNS, scan.key_column, scan.interval_column)
            if c in present and c != "value"
        ]
    )
    n = t.num_rows
    icol = (
        t.column(scan.interval_column)
        if scan.interval_column in present
        else pa.nulls(n, pa.int32())
    )
    values = (
        values or bool(icol.null_count) or "value" not in present
    )  # rows to key here: their values are needed
    if values and "value" in present:
        t = t.append_column("value", f.read(columns=["value"]).column(0))
    keyed = pc.is_valid(icol)
    codes = pc.fill_null(icol, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if icol.null_count:
        ids = t.column("id").to_pylist() if "id" in present else [None] * n
        for i in np.flatnonzero(~keyed.to_numpy(zero_copy_only=False)).tolist():
            codes[i] = spark_xxhash64(ids[i]) % scan.intervals
    key = t.column("key") if "key" in present else pa.nulls(n, pa.binary())
    if scan.key_column in present:
        key = pc.if_else(keyed, t.column(scan.key_column).cast(pa.binary()), key.cast(pa.binary()))
    t = pa.table(
        {
            "kind": pc.if_else(
                keyed,
                pa.scalar(int(RowKind.RECORD), pa.int32()),
                pa.scalar(int(RowKind.UNKEYED), pa.int32()),
            ),
            "key": key,
            **{c: _column(t, c, typ) for c, typ in _TYPES.items()},
            "row": pa.array(np.arange(n, dtype=np.int64)),
        }
    )
    order = np.argsort(codes, kind="stable")
    codes = codes[order]
    if n and (order[1:] < order[:-1]).any():
        t = t.take(pa.array(order))
    starts = np.flatnonzero(np.diff(codes, prepend=codes[0] - 1)) if n else np.empty(0, np.int64)
    return t, codes[starts], np.append(starts, n), values


_TYPES = {"id": pa.string(), "ts": pa.int64(), "value": pa.binary(), "wm": pa.int64()}


def _column(t: pa.Table, c: str, typ: pa.DataType) -> Any:
    return t.column(c).cast(typ) if c in t.column_names else pa.nulls(t.num_rows, typ)


def spark_xxhash64(s: str | None) -> int:
    """Spark's ``xxhash64`` of a string column's value (seed 42; null: the seed), signed."""
    if s is None:
        return 42
    u = xxhash.xxh64_intdigest(s.encode(), seed=42)
    return u - (1 << 64) if u >= 1 << 63 else u


def _union_rows(t: pa.Table, stream: str, name: str) -> pa.Table:
    """One file's rows of an interval as union rows (the rows ``plans/_inputs.py`` reads, less ``group``)."""
    n = t.num_rows
    return pa.table(
        {
            "kind": t.column("kind"),
            "key": t.column("key"),
            "id": t.column("id"),
            "ts": t.column("ts"),
            "value": t.column("value"),
            "wm": t.column("wm"),
            "stream": pa.repeat(pa.scalar(stream, pa.string()), n),
            "src": pa.repeat(pa.scalar(name, pa.string()), n),
            "row": t.column("row"),
            "now": pa.nulls(n, pa.int64()),
        }
    )
