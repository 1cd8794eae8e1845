"""The columnar runner: a :class:`~millwheel.ColumnarComputation` over one key interval's
batch, inside the exactly-once envelope (both backends; ``_columnar.py`` says what it keeps).

:meth:`ColumnarRunner.run` applies the delivery contract (``_contract.py``) to the batch's
columns, as the per-key step (``_step.py``) applies it to one key's records: admission
(dedup stamps, the Bloom filter and exact ids of ``_coldedup.py``), the late rule and the
late policy, then user code over the admitted records grouped by key, then due timers per
key in timestamp order within the fire budget (a batch under several arrival watermarks:
each key's runs of one watermark in order, its timers due before its next run fired between
them, as the per-key step cuts and fires them, ``_colruns.py``), then the dedup horizon, production ids
(``_colout.py``) and pending strong productions. User code's changes are applied per call,
all or nothing (:meth:`~millwheel._colbatch.Batch.apply`); a call that raises is run again
per key, then per record (timer), each failure dead-lettered as the per-key step does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from millwheel._codec import decode_value
from millwheel._colbatch import Batch, key_categories, key_column_of
from millwheel._coldedup import chunk_stamps
from millwheel._colhash import fingerprints
from millwheel._colinput import InputColumns, factorize
from millwheel._colout import ColumnarResult, Outputs
from millwheel._colruns import Runs, run_in_order
from millwheel._colsegments import SegmentFiles
from millwheel._colstore import ColumnarStore
from millwheel._columnar import RECORD_COLUMNS, ColumnarComputation, check_record_columns
from millwheel._colversions import upgrade_store
from millwheel._contract import (
    LateRule,
    dedup_horizon,
    dedup_stamps,
    failure_letter,
    is_late,
    judged_watermark,
    late_watermarks,
    within_budget,
)
from millwheel._counters import StepMetrics
from millwheel._deadletter import DEAD_LETTER_STREAM, Stage
from millwheel._envelope import DedupStats
from millwheel._fields import (
    FIELD_PREFIX,
    StreamFields,
    decode_cell,
    field_column,
    field_type,
    requested_fields,
)
from millwheel._options import ComputationOptions, DedupOptions, ErrorPolicy, LateAction
from millwheel._record import Key, Production, Record, TimeDomain, Timer, decode_key

#: decoded keys a runner keeps (``ColumnarRunner._decode_key``); past it, it starts again
_KEYS_KEPT = 1 << 20


class _CallFailed(Exception):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


METRIC_NAMES = (
    "records_in",
    "duplicates",
    "late",
    "late_dropped",
    "late_to_stream",
    "processed",
    "timers_fired",
    "timers_deferred",
    "productions",
    "productions_behind_watermark",
    "dead_letters",
    "dead_letters_dropped",
    "bloom_maybe",
    "bloom_false_positive",
    "dedup_gc_runs",
    "dedup_ids_collected",
)


class ColumnarRunner:
    """Runs a :class:`ColumnarComputation` over one key interval's batch (both backends)."""

    def __init__(
        self,
        computation: ColumnarComputation,
        *,
        name: str,
        outputs: Iterable[str],
        options: ComputationOptions | None = None,
        fields: Mapping[str, StreamFields] | None = None,
    ) -> None:
        self.computation = computation
        self.name = name
        self.options = options or type(computation).options
        outs = set(outputs)
        if self.options.late.action is LateAction.TO_STREAM and self.options.late.stream:
            outs.add(self.options.late.stream)
        self.outputs = frozenset(outs)
        self.late = LateRule(self.options.late)
        check_record_columns(computation.record_columns, f"columnar computation {name!r}")
        asked = requested_fields(computation.record_columns)
        # ``key`` always: a call's records are grouped by it, and the runner reads it back
        self.record_columns = tuple(
            c for c in RECORD_COLUMNS if c == "key" or c in computation.record_columns
        ) + tuple(FIELD_PREFIX + f for f in asked)
        #: ``value.<field>`` columns and their types over the declared input streams (``fields``: stream -> its declaration)
        self.value_fields = {
            f: field_type((fields or {}).values(), f, f"columnar computation {name!r}")
            for f in asked
        }
        computation.name = name
        #: encoded key -> key, for the keys of the runs so far (a key is decoded once, not in every batch)
        self._keys: dict[bytes, Key] = {}

    def _decode_key(self, kb: bytes) -> Key:
        key = self._keys.get(kb)
        if key is None:
            if len(self._keys) >= _KEYS_KEPT:
                self._keys.clear()
            key = self._keys[kb] = decode_key(kb)
        return key

    # ---------------------------------------------------------------------------------
    def run(
        self,
        store: bytes | ColumnarStore | None,
        recs: InputColumns,
        *,
        low_watermark: int,
        now: int,
        key_summaries: bool = False,
        encode: bool = True,
        files: SegmentFiles | None = None,
        life: int | None = None,
        arrival: int | None = None,
    ) -> ColumnarResult:
        """Records of the batch (delivery order), then due timers; see the module docstring.

        ``store``: the interval's blob, or a decoded :class:`ColumnarStore` that the run
        changes in place (the Arrow mapping's worker cache, the harness). The result's
        ``decoded`` is the store after the run; with ``encode=False`` (the harness, which
        keeps it decoded) ``store`` is not encoded, nor are the whole store's hold and next
        timers summarised, only ``key_summaries``. ``files``: where the store's held-id
        segments are written (``_colsegments.py``; ``None``: inside the blob). ``life``: the
        life a key the store holds nothing for starts (``_identity.py``; ``None``: none known).
        ``arrival``: the watermark a record whose own is not known arrived under (default:
        ``low_watermark``; ``_delivery.plan_steps``)."""
        opts = self.options
        live = not encode
        st = ColumnarStore.of(store, opts)
        #: a store the code cannot upgrade fails every call over its keys (``_colversions.py``)
        self.unreadable = upgrade_store(self, st)
        stats = DedupStats()
        c = StepMetrics()
        out = Outputs(life)
        dead: list[Production | None] = []
        n = c.records_in = len(recs)
        key_of: dict[bytes, Key] = {}
        lw = low_watermark
        touched: set[bytes] = set()
        oldest_late_wm = None
        runs: Runs | None = None
        if n:
            ts, kcodes, uniq = recs.ts, recs.codes, recs.uniques  # keys by first appearance
            key_of.update(zip(uniq, map(self._decode_key, uniq), strict=True))
            touched.update(key_of)
            not_dead = recs.not_stream(DEAD_LETTER_STREAM)
            late_wm = late_watermarks(
                not_dead, recs.arrival, recs.arrival_known, lw if arrival is None else arrival
            )
            if not_dead.any():
                oldest_late_wm = int(late_wm[not_dead].min())
            if n > 1 and late_wm.min() != late_wm.max():
                runs = Runs(late_wm, kcodes, lw)  # records under several arrival watermarks
            if opts.exactly_once:
                stamps = chunk_stamps(
                    None, dedup_stamps(ts, late_wm), opts.dedup.gc_interval_ms, kcodes
                )
                fps = fingerprints(recs.ids, None, kcodes, uniq)
                if runs is None:
                    keep = st.dedup.admit(recs.ids, None, stamps, stats, fps, kcodes, uniq)
                else:  # in run order, as the per-key step: a repeat's first delivery is kept
                    o = runs.order
                    keep = np.empty(n, np.bool_)
                    keep[o] = st.dedup.admit(
                        recs.ids.take(pa.array(o)), None, stamps[o], stats, fps[o], kcodes[o], uniq
                    )
            else:
                keep = np.ones(n, np.bool_)
            c.duplicates = int(n - keep.sum())
            admit, sent = self.late.split(is_late(ts, late_wm), keep, c)
            if runs is not None:
                run_in_order(self, st, recs, runs, admit, sent, key_of, now, out, dead, c, touched)
            else:
                if sent is not None:
                    self._send_late(recs, np.flatnonzero(sent), key_of, out)
                if admit.all():
                    idx, codes, order = np.arange(n), kcodes, uniq
                else:
                    idx = np.flatnonzero(admit)
                    sub, present = pd.factorize(kcodes[idx])
                    codes = sub.astype(np.int64, copy=False)
                    order = [uniq[k] for k in present.tolist()]
                if len(idx):
                    # grouped by key, keys in order of first appearance, each key's records in delivery order
                    srt = np.argsort(codes, kind="stable")
                    c.processed += self._records(
                        st, recs, idx[srt], codes[srt], order, key_of, lw, now, out, dead
                    )
        mark = len(out.kbs)
        self._timers(st, key_of, lw, now, out, dead, c, touched)
        if runs is not None:
            out.count_behind(mark, lw)
        # ---- checkpoint ----
        if opts.exactly_once:
            horizon = dedup_horizon(lw, oldest_late_wm, opts.dedup.slack_ms)
            st.dedup.collect(horizon, opts.dedup.gc_interval_ms, stats, list(touched))
            # the other keys whose oldest ids can go, as the per-record path wakes them
            # (``_contract.dedup_collect_at``): with no records of their own, by the watermark
            woken = st.dedup.collect(
                lw - opts.dedup.slack_ms, opts.dedup.gc_interval_ms, stats, exclude=touched
            )
            touched.update(woken)
        prods = out.finish(self, st, lw, c)
        if opts.strong_productions and prods.ids:
            st.pending.extend(
                [s, kb, e, t, i]
                for s, kb, e, t, i in zip(
                    prods.streams, prods.kbs, prods.encoded, prods.ts, prods.ids, strict=True
                )
            )
        st.forget_empty(touched)
        letters = [d for d in dead if d is not None]
        c.dead_letters = len(letters)
        c.dead_letters_dropped = len(dead) - len(letters)
        c.bloom_maybe, c.bloom_false_positive = stats.bloom_maybe, stats.bloom_false_positive
        c.dedup_gc_runs, c.dedup_ids_collected = stats.gc_runs, stats.ids_collected
        collect = self._collect_wakes()
        hold, nlw, nwall, kept = (None, None, None, 0) if live else st.summary(collect)
        summaries = st.key_summary(touched | set(prods.kbs), collect) if key_summaries else None
        judged = judged_watermark(lw, oldest_late_wm)
        return ColumnarResult(
            None if live else st.encode(files),
            prods.streams,
            prods.ids,
            prods.ts,
            prods.kbs,
            prods.keys,
            prods.values,
            prods.encoded,
            letters,
            {name: getattr(c, name) for name in METRIC_NAMES},
            hold,
            nlw,
            nwall,
            kept,
            summaries,
            prods.once_ids,
            prods.once_tentative,
            st,
            judged if judged < lw else None,
        )

    # ---------------------------------------------------------------------------------
    def _frame(
        self,
        recs: InputColumns,
        idx: np.ndarray,
        key_of: dict[bytes, Key],
        order: list[bytes],
        codes: np.ndarray | None = None,
    ) -> pd.DataFrame:
        il = idx.tolist()
        cols: dict[str, Any] = {}
        values: list[Any] | None = None
        for name in self.record_columns:
            if name == "key":
                keys = [key_of[kb] for kb in order]
                if codes is None:
                    index = {kb: i for i, kb in enumerate(order)}
                    codes = np.array([index.get(kb, -1) for kb in recs.uniques], np.int64)[
                        recs.codes[idx]
                    ]
                cols["key"] = key_column_of(codes, keys, key_categories(keys))
            elif name == "id":
                cols["id"] = recs.ids_at(il)
            elif name == "timestamp":
                cols["timestamp"] = recs.ts[idx]
            elif name == "stream":
                cols["stream"] = recs.streams_at(il)
            elif name == "value":
                cols["value"] = values = _values(recs, il, values)
            else:
                f = name[len(FIELD_PREFIX) :]
                values = _values(recs, il, values)
                cols[name] = field_column(values, f, self.value_fields[f])
        return pd.DataFrame(cols)

    def _call(
        self,
        st: ColumnarStore,
        kbs: list[bytes],
        key_of: dict[bytes, Key],
        rows: pd.DataFrame | None,
        timers: pd.DataFrame | None,
        lw: int,
        now: int,
        out: Outputs,
    ) -> None:
        """One call of user code, applied all or nothing; raises :class:`_CallFailed`."""
        if self.unreadable is not None:
            raise _CallFailed(self.unreadable.at(self.name, key_of[kbs[0]], len(kbs)))
        frame = rows if rows is not None else timers
        keys = None if frame is None else frame["key"].array
        # the key column's categories are the call's keys in order: the batch shares them (``Batch._codes`` then
        # recognises the user's key columns by identity, not by comparing every key)
        batch = Batch(
            self,
            st,
            kbs,
            key_of,
            rows,
            lw,
            now,
            keys.categories if isinstance(keys, pd.Categorical) else None,
        )
        try:
            if timers is None:
                self.computation.process_batch(batch)
            else:
                self.computation.process_timers(batch, timers)
        except Exception as exc:
            raise _CallFailed(exc) from None
        batch.apply(out)

    def _fail(self, exc: BaseException) -> None:
        if self.options.on_error is ErrorPolicy.RAISE:
            raise exc

    def _records(
        self,
        st: ColumnarStore,
        recs: InputColumns,
        idx: np.ndarray,
        codes: np.ndarray,
        order: list[bytes],
        key_of: dict[bytes, Key],
        lw: int,
        now: int,
        out: Outputs,
        dead: list[Any],
    ) -> int:
        """The admitted records ``idx`` (grouped by key: ``codes`` into ``order``), in one call; on failure per key, then per record."""
        try:
            self._call(
                st, order, key_of, self._frame(recs, idx, key_of, order, codes), None, lw, now, out
            )
            return len(idx)
        except _CallFailed as failed:
            self._fail(failed.exc)
        # careful: per key, then per record for a key whose call fails
        processed = 0
        per_key: dict[bytes, list[int]] = {}
        kbs = recs.kbs
        for i in idx.tolist():
            per_key.setdefault(kbs[i], []).append(i)
        for kb, rows in per_key.items():
            sub = np.array(rows, np.int64)
            try:
                self._call(
                    st, [kb], key_of, self._frame(recs, sub, key_of, [kb]), None, lw, now, out
                )
                processed += len(rows)
                continue
            except _CallFailed:
                pass
            for i in rows:
                try:
                    self._call(
                        st,
                        [kb],
                        key_of,
                        self._frame(recs, np.array([i]), key_of, [kb]),
                        None,
                        lw,
                        now,
                        out,
                    )
                    processed += 1
                except _CallFailed as failed:
                    key = key_of[kb]
                    dead.append(
                        failure_letter(
                            self.name,
                            key,
                            failed.exc,
                            Stage.PROCESS_RECORD,
                            recs.record(i, key),
                            None,
                            now,
                        )
                    )
        return processed

    def _timers(
        self,
        st: ColumnarStore,
        key_of: dict[bytes, Key],
        lw: int,
        now: int,
        out: Outputs,
        dead: list[Any],
        c: StepMetrics,
        touched: set[bytes],
        only: set[bytes] | None = None,
    ) -> None:
        """Due timers per key in firing order within the fire budget, rounds of them until none
        is due (``only``: of these keys only)."""
        budget = self.options.max_timer_fires_per_step
        fired: dict[bytes, int] = {}
        while st.timers:
            tt = st.timers
            due = tt.due(lw, now)
            if only is not None and len(due):
                due = due[pd.Index(list(only)).get_indexer(tt.kb[due]) >= 0]
            due = tt.ordered(due)  # per key, by timestamp, domain, tag
            if not len(due):
                return
            # at most ``budget`` fires per key and step: each key's first due timers
            kcodes, kbs = factorize(tt.kb[due])
            before = np.fromiter(map(fired.get, kbs, [0] * len(kbs)), np.int64, len(kbs))
            go = within_budget(kcodes, before, budget)
            if not go.any():
                c.timers_deferred += len(due)
                return
            rows = due[go]
            counts = np.bincount(kcodes[go], minlength=len(kbs))
            moved = np.flatnonzero(counts)
            went = [kbs[i] for i in moved.tolist()]
            fired.update(zip(went, (before[moved] + counts[moved]).tolist(), strict=True))
            missing = [kb for kb in went if kb not in key_of]
            key_of.update(zip(missing, map(self._decode_key, missing), strict=True))
            touched.update(went)
            st.timers = tt.without(rows)
            f_kb, f_tag, f_ts, f_d = tt.kb[rows], tt.tag[rows], tt.ts[rows], tt.d[rows]
            frame, order = _timer_frame(f_kb, f_tag, f_ts, f_d, key_of)
            try:
                self._call(st, order, key_of, None, frame, lw, now, out)
                c.timers_fired += len(rows)
                continue
            except _CallFailed as failed:
                self._fail(failed.exc)
            firing = list(
                zip(f_kb.tolist(), f_tag.tolist(), f_ts.tolist(), f_d.tolist(), strict=True)
            )
            by_key: dict[bytes, list[Any]] = {}
            for item in firing:
                by_key.setdefault(item[0], []).append(item)
            for kb, items in by_key.items():
                try:
                    self._call(st, [kb], key_of, None, _timer_frame_of(items, key_of), lw, now, out)
                    c.timers_fired += len(items)
                    continue
                except _CallFailed:
                    pass
                for item in items:
                    try:
                        self._call(
                            st, [kb], key_of, None, _timer_frame_of([item], key_of), lw, now, out
                        )
                        c.timers_fired += 1
                    except _CallFailed as failed:  # the timer stays deleted: it is dead-lettered
                        timer = Timer(item[1], item[2], TimeDomain(item[3]))
                        dead.append(
                            failure_letter(
                                self.name,
                                key_of[kb],
                                failed.exc,
                                Stage.PROCESS_TIMER,
                                None,
                                timer,
                                now,
                            )
                        )

    def _send_late(
        self, recs: InputColumns, rows: np.ndarray, key_of: dict[bytes, Key], out: Outputs
    ) -> None:
        """Late records ``rows`` sent on to the late stream (``LatePolicy.to_stream``)."""
        for i in rows.tolist():
            kb = recs.kb(i)
            dec, enc = recs.decoded(i)
            out.add(self.late.stream, kb, key_of[kb], dec, enc, int(recs.ts[i]), recs.id(i))  # type: ignore[arg-type]

    def acknowledge(
        self, store: Any, ids: Iterable[str] | None = None
    ) -> tuple[Any, dict[bytes, tuple[int | None, int | None, int | None]]]:
        """Drop delivered strong productions (all if ``ids`` is None); the new store (a
        decoded one: itself, changed) and the summaries of their keys."""
        st = ColumnarStore.of(store, self.options)
        if not st.pending:
            return store, {}
        keys = st.acknowledge(ids)
        return (
            st if isinstance(store, ColumnarStore) else st.encode(),
            st.key_summary(keys, self._collect_wakes()),
        )

    def _collect_wakes(self) -> DedupOptions | None:
        """The dedup options a store's summaries wake keys by to collect their ids
        (``_contract.dedup_collect_at``); ``None`` without exactly-once."""
        return self.options.dedup if self.options.exactly_once else None

    def pending(self, store: bytes | ColumnarStore | None) -> list[tuple[bytes, Production]]:
        """Strong productions checkpointed and not yet acknowledged, with their keys' bytes."""
        st = ColumnarStore.of(store, self.options)
        out = []
        for stream, kb, enc, ts, rid in st.pending:
            key = decode_key(kb)
            out.append(
                (kb, Production(stream, Record(key, decode_value(enc), ts, rid, stream), enc))
            )
        return out


def _values(recs: InputColumns, il: list[int], done: list[Any] | None) -> list[Any]:
    """The values of rows ``il``, decoded (``done``: decoded already)."""
    if done is not None:
        return done
    vs = recs.values_at(il)
    return [decode_cell(v) for v in vs] if recs.encoded else vs


def _timer_frame(
    kb: np.ndarray, tag: np.ndarray, ts: np.ndarray, d: np.ndarray, key_of: dict[bytes, Key]
) -> tuple[pd.DataFrame, list[bytes]]:
    """The frame of timers firing (grouped by key) and its keys, in order."""
    codes, order = factorize(kb)
    keys = [key_of[k] for k in order]
    frame = pd.DataFrame(
        {
            "key": key_column_of(codes, keys, key_categories(keys)),
            "tag": tag.tolist(),
            "timestamp": ts.astype(np.int64),
            "domain": d.astype(np.int8),
        }
    )
    return frame, order


def _timer_frame_of(
    items: list[tuple[bytes, str, int, int]], key_of: dict[bytes, Key]
) -> pd.DataFrame:
    """:func:`_timer_frame` of ``(key, tag, timestamp, domain)`` items."""
    kb, tag, ts, d = (np.array(c, dtype=object) for c in zip(*items, strict=True))
    return _timer_frame(kb, tag, ts.astype(np.int64), d.astype(np.int8), key_of)[0]
