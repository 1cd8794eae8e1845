"""Rows packed per key interval before the shuffle: the default mapping of columnar computations.

::

    inputs (keyed, ``group`` computed) ─► mapInArrow(Packer): per task, each group's rows
        as one Arrow IPC stream ─► rows (group, packed) ─┐
    heartbeats, ticks, a rescale's rows (as they are) ───┴─► union ─► groupBy(group)
        ─► applyInPandasWithState(ColumnarIntervalStep): the blobs read back as one Arrow table

``applyInPandasWithState`` needs its input hash-partitioned and sorted by the grouping key:
every record crosses the shuffle as a row of ten columns (Spark's row format, written,
read and sorted in the JVM), and reaches the worker through PySpark's Arrow to pandas
conversion, a Python object per value. A columnar computation reads its records as
columns anyway, so here each map task hands its rows to one Python pass that cuts them by
group and writes each group's share as an Arrow IPC stream: the shuffle moves a few large
binary rows per task and group (a thousand times fewer rows), the operator's sort and
PySpark's conversion touch only those, and the step reads the records back from the
blobs without a copy (:func:`unpack`) straight into
:func:`~millwheel.runtime._columnar.arrow_input`.

Nothing about the records changes: the same rows reach the same interval function in the
same micro-batch (a blob is a lossless copy of its rows, and the step puts them in send
order itself), so exactly-once, strong productions, timers and dead letters are those of
the unpacked plan. Heartbeats are not packed: they carry ``wm_ts``, which moves Spark's
watermark, and Spark drops a row older than its watermark before an event-time-timeout
operator sees it — a heartbeat may be dropped that way, a record never (records have no
``wm_ts``). ``RuntimeSettings(packed_shuffle=False)`` builds the unpacked plan (the
benchmarks' side-by-side figure); a checkpoint may be resumed under either plan: the
file sources, the grouping key and the state schema are the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: the column of a packed row: one Arrow IPC stream of a group's rows
PACKED_COLUMN = "packed"
#: what the packing ``mapInArrow`` returns (Spark DDL)
PACKED_SCHEMA = f"group int, {PACKED_COLUMN} binary"
#: a group's rows are cut into another blob past either bound (a blob is one Spark row)
MAX_ROWS = 1 << 17
MAX_BYTES = 32 << 20
#: a packed batch's blobs stay under this many bytes in all (int32 offsets)
_BATCH_BYTES = 1 << 30
#: ``group`` of rows whose group is null (kept as its own group, as Spark's grouping does)
_NULL = np.iinfo(np.int32).min


class Packer:
    """The ``mapInArrow`` function: a task's rows as one row per group with its rows packed."""

    def __init__(self, max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending: dict[int, list[pa.RecordBatch]] = {}
        sizes: dict[int, list[int]] = {}  # group -> [rows, bytes]
        schema: pa.Schema | None = None
        for b in batches:
            if b.num_rows == 0:
                continue
            b, codes = _without_group(b)
            schema = b.schema
            order = np.argsort(codes, kind="stable")
            ordered = codes[order]
            b = b.take(pa.array(order)) if (order[1:] < order[:-1]).any() else b
            starts = np.flatnonzero(np.diff(ordered, prepend=ordered[0] - 1))
            ends = np.append(starts[1:], len(ordered))
            full = []
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
                g = int(ordered[s])
                piece = b.slice(s, e - s)
                pending.setdefault(g, []).append(piece)
                size = sizes.setdefault(g, [0, 0])
                size[0] += piece.num_rows
                size[1] += piece.nbytes
                if size[0] >= self.max_rows or size[1] >= self.max_bytes:
                    full.append(g)
            if full:
                yield from pack(schema, {g: pending.pop(g) for g in full})
                for g in full:
                    del sizes[g]
        if pending and schema is not None:
            yield from pack(schema, pending)


def _without_group(b: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
    """``b`` without its ``group`` column, and that column as int64 codes (null: :data:`_NULL`)."""
    i = b.schema.get_field_index("group")
    g = b.column(i)
    codes = (pc.fill_null(g, _NULL) if g.null_count else g).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return b.drop_columns(["group"]), codes


def pack(schema: pa.Schema, groups: dict[int, list[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    """One packed row per group: its pieces as one Arrow IPC stream, the streams written back
    to back into one buffer that becomes the binary column's data (no copy per blob); a new
    batch past :data:`_BATCH_BYTES` (a binary column's offsets are int32)."""
    sink, offsets, keys = pa.BufferOutputStream(), [0], []
    for g, pieces in groups.items():
        with pa.ipc.new_stream(sink, schema) as w:
            for p in pieces:
                w.write_batch(p)
        offsets.append(sink.tell())
        keys.append(g)
        if offsets[-1] >= _BATCH_BYTES:
            yield _packed_batch(keys, offsets, sink.getvalue())
            sink, offsets, keys = pa.BufferOutputStream(), [0], []
    if keys:
        yield _packed_batch(keys, offsets, sink.getvalue())


def _packed_batch(keys: list[int], offsets: list[int], data: pa.Buffer) -> pa.RecordBatch:
    blobs = pa.Array.from_buffers(pa.binary(), len(keys), [None, pa.py_buffer(np.asarray(offsets, np.int32)), data])
    codes = np.asarray(keys, np.int64)
    group = pa.array(codes.astype(np.int32), mask=codes == _NULL)
    return pa.RecordBatch.from_arrays([group, blobs], names=["group", PACKED_COLUMN])


def unpack(blobs: Iterable[Any]) -> pa.Table | None:
    """The rows of packed blobs (``bytes``, as PySpark hands a binary value) as one Arrow
    table, read in place (``None``: no blobs)."""
    tables = [pa.ipc.open_stream(pa.py_buffer(b)).read_all() for b in blobs]
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
