"""The Spark side of columnar computations (``millwheel/_columnar.py``): the step both
columnar plans run (``plans/columnar.py``, ``plans/arrow.py``).

On interval rows (``plans/columnar.py``) the query is the per-record one's
(``applyInPandasWithState`` over key intervals, the interval's GroupState row, the outbox):
only the worker function differs. Where
:class:`~millwheel.runtime.plans.intervals.IntervalStep` groups rows by key in Python and steps
one key at a time, :class:`ColumnarIntervalStep` hands the interval's rows to
:meth:`ColumnarRunner.run` as columns: records in send order (one ``lexsort`` on sender
watermark, file and row, as the per-record path sorts each key's rows), values still
encoded (decoded only if the computation reads them), and writes the productions it
returns as columns. The interval's GroupState row holds the columnar store in ``envs``
(``meta`` is empty: the store answers hold and timers itself).

Rows that are not records (keying dead letters, rows to key in the step, wall-time
ticks) go through the per-record path's code (:class:`IntervalBatch`), so the columnar
path adds no second copy of keying.

A rescale (``millwheel rescale``, ``_rescale.py``, MillWheel §7.1) reaches a columnar
computation as it does a per-record one, in one micro-batch: each new key interval gets
the pieces of the old intervals' stores that hold its keys
(:meth:`~millwheel._colstore.ColumnarStore.split`), merges them before its records run
(``_move.install_stores``), and each old interval's group is emptied once it holds the
store the rescale read (its digest, ``_move.blob_digest``), or the batch fails before it
commits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from millwheel._colsegments import SegmentFiles
from millwheel._colstore import ColumnarStore
from millwheel._columnar import ColumnarResult, ColumnarRunner, InputColumns
from millwheel._colversions import upgrade_store
from millwheel._counters import StepMetrics
from millwheel._delivery import commit_once
from millwheel._errors import RunError
from millwheel._record import MIN_TIMESTAMP, Record
from millwheel._topology import ComputationSpec
from millwheel.runtime._fieldcols import CARRY_PREFIX, production_fields, table_frame, with_values
from millwheel.runtime._interval import IntervalBatch
from millwheel.runtime._keying import wants_dead_letters
from millwheel.runtime._move import RescaleMismatch, install_stores, retire_group
from millwheel.runtime._scan import SCAN_COLUMN, BatchScan, FileValues
from millwheel.runtime._spark_internals import task_batch_id
from millwheel.runtime._wire import RowKind, from_spark, timer_timeout
from millwheel.runtime.plans.intervals import IntervalStep

_RECORD = int(RowKind.RECORD)
_UNKEYED = int(RowKind.UNKEYED)
_INSTALL = int(RowKind.INSTALL)
_RETIRE = int(RowKind.RETIRE)


class ColumnarIntervalStep(IntervalStep):
    """The interval function of a columnar computation; see the module docstring."""

    def __init__(self, spec: ComputationSpec, **kw: Any) -> None:
        super().__init__(spec, **kw)
        self._columnar: ColumnarRunner | None = None
        #: the inputs whose records the step reads from its micro-batch's files (``_scan.py``)
        self.scan: BatchScan | None = None
        #: where the stores' held-id segments are written (a directory URI in the query's
        #: checkpoint, one subdirectory per key interval; ``None``: inside the store) and how
        #: many batches a file no store names is kept (``_colsegments.py``)
        self.id_segments: str | None = None
        self.keep_batches = 100

    def __getstate__(self) -> dict[str, Any]:
        return {
            **super().__getstate__(),
            "scan": self.scan,
            "id_segments": self.id_segments,
            "keep_batches": self.keep_batches,
        }

    def __setstate__(self, d: dict[str, Any]) -> None:
        super().__setstate__(d)
        self._columnar = None
        self.scan = d.get("scan")
        self.id_segments, self.keep_batches = d.get("id_segments"), d.get("keep_batches", 100)

    def ids_beside(self, directory: str, spark: Any) -> None:
        """Write the stores' held-id segments to files under ``directory`` (``_colsegments.py``),
        each kept ``spark.sql.streaming.minBatchesToRetain`` batches after no store names it."""
        self.id_segments = directory
        self.keep_batches = int(spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100"))

    def segment_files(self, interval: int, batch_id: int | None = None) -> SegmentFiles | None:
        """Where key interval ``interval``'s id segments go in micro-batch ``batch_id``
        (``None``: the running task's; the result ``None``: inside the store — no directory,
        or no micro-batch to date them by)."""
        batch = (
            (task_batch_id() if batch_id is None else batch_id)
            if self.id_segments is not None and interval >= 0
            else None
        )
        return (
            None
            if batch is None
            else SegmentFiles(f"{self.id_segments}/i{interval}", batch, self.keep_batches)
        )

    def _install(self, batch: IntervalBatch, interval: int, store: Any) -> Any:
        """``store`` with the batch's INSTALL rows merged in (a rescale's pieces, a state
        load's store), each piece first brought to the code's state version."""
        return install_stores(
            self.spec.name,
            interval,
            self.intervals or 0,
            [v for _, v in batch.installs],
            store,
            self.spec.options,
            lambda st: upgrade_store(self.columnar(), st),
        )

    def columnar(self) -> ColumnarRunner:
        if self._columnar is None:
            spec = self.spec
            # strong productions are checkpointed in the batch outbox, not in the store
            opts = dataclasses.replace(spec.options, strong_productions=False)
            fields = {
                s: f
                for s, f in (self.keyer.fields if self.keyer is not None else {}).items()
                if s in spec.inputs
            }
            self._columnar = ColumnarRunner(
                spec.instantiate(),
                name=spec.name,
                outputs=spec.all_outputs,
                options=opts,
                fields=fields,
            )  # type: ignore[arg-type]
        return self._columnar

    def __call__(
        self, group: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        g = int(group[0])
        retired = self.retired(
            g
        )  # a group of the layout before a rescale: only its retirement comes
        interval = -2 if retired else self.interval_of(g)
        if interval < 0 and not retired:  # the heartbeat group: it only moves Spark's watermark
            for _ in frames:
                pass
            return
        store: bytes | ColumnarStore | None = state.get[0] if state.exists else None
        batch = IntervalBatch(
            self,
            interval,
            from_spark(state.getCurrentWatermarkMs()),
            state.getCurrentProcessingTimeMs(),
        )
        recs, marked = self.read_marked(batch, frames)
        if retired:
            retire_group(
                self.spec.name,
                self.intervals,
                batch.retire,
                bool(len(recs) or batch.installs or marked),
                state,
                columnar=True,
            )
            return
        if batch.retire is not None:
            msg = f"computation {self.spec.name!r}: a rescale retires Spark group {g}, which is key interval {interval} of this layout"
            raise RescaleMismatch(msg)
        if batch.installs:  # a rescale's pieces of the old intervals' stores (``_move.py``)
            store = self._install(batch, interval, store)
        res, out = self.step(batch, recs, _cached_store(self.spec.name, interval, store))
        if res.store is not None:
            state.update((res.store, b""))
            if res.decoded is not None:
                _STORES[(self.spec.name, interval)] = (_digest(res.store), res.decoded)
        elif state.exists:
            state.remove()
        if self.timeouts and res.next_low_watermark_timer is not None and res.store is not None:
            state.setTimeoutTimestamp(
                max(timer_timeout(res.next_low_watermark_timer), state.getCurrentWatermarkMs())
            )
        yield out

    def run_interval(
        self,
        interval: int,
        rows: pa.Table | None,
        store: bytes | ColumnarStore | None,
        low_watermark: int,
        now: int,
        batch_id: int | None = None,
        arrival: int | None = None,
        *,
        marked: bool = False,
    ) -> tuple[ColumnarResult, dict[str, Any] | None, pd.DataFrame]:
        """One key interval's share of a micro-batch on a mapping that does not move state
        (``plans/arrow.py``, whose computations ``millwheel rescale`` refuses; a state load's
        store is installed into an interval that has none, ``_state_load.py``): the
        :class:`ColumnarRunner` over its input ``rows`` (``store``: the interval's columnar
        store, encoded or decoded); its productions as columns (:meth:`step_columns`) and
        the frame of its dead letters and summary row. Rows that are all plain records
        become :class:`InputColumns` straight from Arrow (:func:`arrow_input`); others
        (ticks, keying dead letters, rows to key here, carried fields) go through pandas; a
        marker row (``_scan.py``), or ``marked`` (its task found the interval in the batch's
        files: ``_scan.batch_intervals``), has the records read from micro-batch ``batch_id``'s
        files. ``arrival``: the watermark before the batch's heartbeats (``IntervalBatch.arrival``)."""
        batch = IntervalBatch(self, interval, low_watermark, now, batch_id, arrival)
        if rows is not None and plain_records(rows) and not marked:
            recs = arrow_input(rows)
        else:
            frames = [] if rows is None else [table_frame(rows)]
            recs = self.read_marked(batch, frames, batch_id, marked=marked)[0]
        if batch.retire is not None:
            msg = f"computation {self.spec.name!r}: a rescale's state move reached an interval function that cannot apply it (the Arrow mapping)"
            raise RescaleMismatch(msg)
        if (
            batch.installs
        ):  # a state load's store (``_state_load.py``): into an interval without one
            store = self._install(batch, interval, store)
        return self.step_columns(batch, recs, store, batch_id)

    def read_marked(
        self,
        batch: IntervalBatch,
        frames: Iterable[pd.DataFrame],
        batch_id: int | None = None,
        *,
        marked: bool = False,
    ) -> tuple[InputColumns, bool]:
        """The records of ``batch``'s input frames as columns (a rescale's rows go to the
        batch), and whether a marker row came (``_scan.py``): it says the interval has
        records in the micro-batch's files (``batch_id``; ``None``: the running task's),
        which the step reads itself. When they are all plain records and no other row is a
        record, they become :class:`InputColumns` straight from Arrow (:func:`arrow_input`);
        otherwise they join the other rows through pandas. ``marked``: the interval is marked
        without a marker row."""
        parts = []
        for pdf in frames:
            if SCAN_COLUMN in pdf.columns:
                marker = pdf[SCAN_COLUMN].notna().to_numpy()
                if marker.any():
                    marked = True
                    if marker.all():
                        continue
                pdf = pdf[~marker].drop(columns=SCAN_COLUMN)
            p = self._records(batch, pdf)
            if p is not None:
                parts.append(p)
        if marked and batch.interval >= 0:  # a retired group's marker fails in ``retire_group``
            if self.scan is None:
                msg = f"computation {self.spec.name!r}: a marker row reached a step that does not read its batch's files"
                raise RunError(msg)
            table, lazy = self.scan.records_lazy(batch.interval, batch_id)
            if table is not None:
                if not parts and plain_records(table):
                    return arrow_input(table, lazy), marked
                if lazy is not None:  # rows that go through pandas: their values read now
                    table = lazy.fill(table)
                p = self._records(batch, table_frame(table))
                if p is not None:
                    parts.append(p)
        return _input(parts), marked

    def step(
        self, batch: IntervalBatch, recs: InputColumns, store: bytes | ColumnarStore | None
    ) -> tuple[ColumnarResult, pd.DataFrame]:
        """The :class:`ColumnarRunner` over one key interval's records, and its output frame."""
        res, cols, tail = self.step_columns(batch, recs, store)
        return res, tail if cols is None else pd.concat(
            [pd.DataFrame(cols), tail], ignore_index=True
        )

    def step_columns(
        self,
        batch: IntervalBatch,
        recs: InputColumns,
        store: bytes | ColumnarStore | None,
        batch_id: int | None = None,
    ) -> tuple[ColumnarResult, dict[str, Any] | None, pd.DataFrame]:
        """The :class:`ColumnarRunner` over one key interval's records: its result, its
        productions' output columns (``None``: none) and the frame of its dead letters and
        summary row."""
        res = self.columnar().run(
            store,
            recs,
            low_watermark=batch.low_watermark,
            now=batch.now,
            files=self.segment_files(batch.interval, batch_id),
            life=batch.life,
            arrival=batch.arrival,
        )
        batch.totals.add(StepMetrics(**res.metrics))
        batch.judged = res.judged
        for p in res.dead_letters:
            batch.out.add_production(p)
        if res.once_ids is not None:
            # once-productions: one IdRegistry call for the interval's batch (Photon §2), as IntervalBatch.run
            outcome = commit_once(
                [(p.record.key, p) for p in res.productions()],
                self.registry(),
                pipeline=self.pipeline,
                computation=self.spec.name,
                metrics=batch.totals,
            )
            res.drop(outcome.dropped)
            for p in outcome.dead_letters:
                batch.out.add_production(p)
        tail = batch.summary(
            res.hold, res.next_low_watermark_timer, res.next_wall_timer, res.keys_kept
        )
        if not res.ids:
            return res, None, tail
        cols: dict[str, Any] = {
            "stream": res.streams,
            "id": res.ids,
            "ts": res.ts,
            "key": res.kbs,
            "value": res.encoded,
            "wm": [None] * len(res.ids),
        }
        production_fields(cols, self.out_fields, res.streams, res.values)
        if self.keyer is not None and self.out_consumers:
            recs_out = [
                (s, Record(k, v, t, i, s))
                for s, k, v, t, i in zip(
                    res.streams, res.keys, res.values, res.ts, res.ids, strict=True
                )
            ]
            for name, values in self.keyer.rows(recs_out, self.out_consumers).items():
                cols[name] = (
                    pd.array(values, dtype="Int32") if name.startswith("interval:") else values
                )
        return res, cols, tail

    @staticmethod
    def _records(batch: IntervalBatch, pdf: pd.DataFrame) -> pd.DataFrame | None:
        """The record rows of one input frame; ticks, keying dead letters and rows to key
        here go through :class:`IntervalBatch` as on the per-record path."""
        if len(pdf) == 0:
            return None
        pdf = batch.take_ticks(with_values(pdf))  # values stored as columns: ``_fieldcols.py``
        kind = pdf["kind"]
        if len(pdf) and (kind != _RECORD).any():
            unkeyed = kind == _UNKEYED
            moves = (kind == _INSTALL) | (kind == _RETIRE)
            if moves.any():
                batch._moves(pdf[moves])
            letters = (kind != _RECORD) & ~unkeyed & ~moves
            if letters.any():
                batch._dead_letters(pdf[letters], wants_dead_letters(batch.owner.keyer))
            keyed_here = batch._key_here(pdf[unkeyed]) if unkeyed.any() else None
            pdf = pdf[kind == _RECORD]
            if keyed_here is not None:
                pdf = pd.concat([pdf, keyed_here]) if len(pdf) else keyed_here
        return pdf if len(pdf) else None


#: per Python worker: (computation, key interval) -> (digest of the store bytes it wrote,
#: the store decoded). The next batch's state row is those bytes if this worker ran the
#: interval last and the batch committed: then the object is used instead of decoding
#: them again. The entry is taken out while a batch runs, so a failed batch leaves none.
_STORES: dict[tuple[str, int], tuple[bytes, ColumnarStore]] = {}


def _digest(blob: bytes) -> bytes:
    return xxhash.xxh3_128_digest(blob)


def _cached_store(
    name: str, interval: int, blob: bytes | ColumnarStore | None
) -> bytes | ColumnarStore | None:
    """``blob`` decoded from this worker's cache when it holds exactly these bytes, else ``blob``."""
    cached = _STORES.pop((name, interval), None)
    if cached is None or not isinstance(blob, bytes) or cached[0] != _digest(blob):
        return blob
    return cached[1]


def plain_records(t: pa.Table) -> bool:
    """Are all rows of ``t`` records keyed for this computation, without carried fields (no
    ticks, keying dead letters, rows to key here or a rescale's rows)?"""
    kind = t.column("kind")
    if (
        kind.null_count
        or t.column("key").null_count
        or any(c.startswith(CARRY_PREFIX) for c in t.column_names)
    ):
        return False
    return bool(pc.all(pc.equal(kind, _RECORD)).as_py())


def _codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """int64 codes of a column's values (nulls: -1) and its distinct values, in order of first appearance."""
    enc = pc.dictionary_encode(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    return enc.indices.fill_null(-1).to_numpy().astype(
        np.int64, copy=False
    ), enc.dictionary.to_pylist()


def send_order(t: pa.Table, first: np.ndarray | None = None) -> np.ndarray:
    """The order of ``t``'s rows :func:`_input` puts them in: by sender watermark (missing:
    first), then file name (missing: first), then row — after ``first`` (a task's group)."""
    wm = t.column("wm")
    order_wm = (
        pc.fill_null(wm, MIN_TIMESTAMP).to_numpy().astype(np.int64, copy=False)
        if wm.null_count < len(wm)
        else np.full(len(wm), MIN_TIMESTAMP, np.int64)
    )
    src, names = _codes(t.column("src"))
    rank = np.zeros(
        len(names) + 1, np.int64
    )  # nulls (code -1, the last slot) first, as pandas' sorted factorize puts them
    rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(1, len(names) + 1)
    keys = (pc.fill_null(t.column("row"), 0).to_numpy(), rank[src], order_wm)
    return np.lexsort(keys if first is None else (*keys, first))


def arrow_input(t: pa.Table, lazy: FileValues | None = None) -> InputColumns:
    """:func:`_input` of an Arrow table of plain records (:func:`plain_records`): the same
    send order, keys and streams factorized in Arrow, ids and values left as Arrow arrays
    (``lazy``: the values, left in their files until asked for; ``t``'s are null)."""
    order = send_order(t)
    if not (order[1:] > order[:-1]).all():
        t = t.take(pa.array(order))
        lazy = None if lazy is None else lazy.ordered(order)
    wm = t.column("wm")
    known = None if wm.null_count == len(wm) else pc.is_valid(wm).to_numpy(zero_copy_only=False)
    order_wm = (
        None
        if known is None
        else pc.fill_null(wm, MIN_TIMESTAMP).to_numpy().astype(np.int64, copy=False)
    )
    codes, uniques = _codes(t.column("key"))
    s_codes, s_names = _codes(t.column("stream"))
    return InputColumns.of(
        codes,
        uniques,
        t.column("id").combine_chunks(),
        t.column("ts").to_numpy().astype(np.int64, copy=False),
        s_codes,
        s_names,
        t.column("value").combine_chunks() if lazy is None else lazy,
        order_wm,
        known,
    )


def _input(parts: list[pd.DataFrame]) -> InputColumns:
    """An interval's record rows as :class:`InputColumns`, in send order: by sender watermark
    (missing: first), then file name, then row — what ``IntervalBatch.run`` sorts each key's
    rows by; a stable sort of all rows keeps every key's in that order."""
    if not parts:
        return InputColumns([], [], np.empty(0, np.int64), [], [])
    pdf = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    n = len(pdf)
    wm = pdf["wm"]
    nulls = wm.isna().to_numpy()
    if nulls.all():
        arrival = None
        order_wm = np.full(n, MIN_TIMESTAMP, np.int64)
    else:
        order_wm = np.where(
            nulls, MIN_TIMESTAMP, wm.fillna(MIN_TIMESTAMP).astype("int64").to_numpy()
        )
        arrival = [
            None if u else int(w) for u, w in zip(nulls.tolist(), order_wm.tolist(), strict=True)
        ]
    src_codes, _ = pd.factorize(pdf["src"], sort=True)
    order = np.lexsort((pdf["row"].to_numpy(), src_codes, order_wm))
    if not (order[1:] > order[:-1]).all():
        pdf = pdf.iloc[order]
        if arrival is not None:
            arrival = [arrival[i] for i in order.tolist()]
    # object columns as they are (factorized without a list of them), ids to Arrow in one call
    return InputColumns(
        kbs=pdf["key"].to_numpy(dtype=object),
        ids=pa.Array.from_pandas(pdf["id"], type=pa.string()),
        ts=pdf["ts"].to_numpy(np.int64),
        streams=pdf["stream"].to_numpy(dtype=object),
        values=pdf["value"].to_numpy(dtype=object),
        arrival=arrival,
    )
