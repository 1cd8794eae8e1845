"""Runs of one arrival watermark in a columnar batch: the columnar form of ``_delivery.plan_steps``.

A batch may hold records that arrived under several watermarks (files of several upstream
batches, or the byte ranges of several log files, read in one micro-batch). The per-key
step cuts *each key's* records into runs of one arrival watermark, in that order: every run
but the key's last sees the low watermark of its next run (capped by the batch's; runs that
would see the same one are one run, each record still judged against its own) and is
followed by the key's timers due by it — event-time ones up to that watermark, since the
next run's records are not late and their windows must still be open (§4.5, §4.6); the
last run sees the batch's low watermark and its timers fire with every key's at the end of
the batch. Each call has its own fire budget, and a key that keeps nothing after one starts
a new life in the next (``_identity.call_life``).

The columnar runner keeps that for every key at once (:class:`Runs`, :func:`run_in_order`).
Keys are independent, so a call may take any keys whose runs see the same low watermark: a
call per low watermark for the runs that are not their key's last, ascending, each followed
by its keys' due timers (:func:`due_rounds`); then **one** call with every key's last run —
for most batches all of their keys, whose records arrived under one watermark. A key's runs
see strictly growing watermarks, so it has at most one run in a call and its runs keep their
order; the calls are as many as the batch's arrival watermarks, not its keys times them
(``bench/arrival_runs_bench.py``). Those first calls hold only the keys
with records under several watermarks: they run on a store of those keys alone
(:func:`carve`, :func:`put_back`), so what they cost follows those keys, not what the
interval holds. A batch under one arrival watermark, the common case, has one run: none of
this runs.

>>> runs = Runs(np.array([900, 1_100, 900]), np.array([0, 0, 1]), 2_000)
>>> runs.count, runs.rows(0).tolist(), runs.rows(1).tolist()
(2, [0], [2, 1])
>>> runs.call_watermark(0), runs.call_watermark(1), runs.keys(0).tolist(), runs.complex_keys.tolist()
(1100, 2000, [0], [0])

Under a batch watermark no newer than the runs' (a batch that has not yet seen the
heartbeat that follows its records), the runs would all see it: one call.

>>> runs = Runs(np.array([1_100, 900, 1_300]), np.array([0, 0, 0]), 800)
>>> runs.count, runs.rows(0).tolist(), runs.complex_keys.tolist()
(1, [1, 0, 2], [])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from millwheel._colstore import ColumnarStore
from millwheel._coltimers import TimerTable
from millwheel._contract import timers_due

if TYPE_CHECKING:
    from millwheel._colinput import InputColumns
    from millwheel._colout import Outputs
    from millwheel._counters import StepMetrics
    from millwheel._options import ComputationOptions
    from millwheel._record import Key


class _Runner(Protocol):
    """What :func:`run_in_order` calls of the columnar runner (``_colrunner.ColumnarRunner``)."""

    name: str
    options: ComputationOptions

    def _send_late(self, recs: Any, rows: np.ndarray, key_of: Any, out: Any) -> None: ...

    def _records(self, *args: Any) -> int: ...

    def _timers(self, *args: Any) -> Any: ...


class Runs:
    """A batch's rows cut by arrival watermark (``late_wm``: each row's, as the late rule
    judges it; ``kcodes``: each row's key) into calls; see the module docstring."""

    __slots__ = ("order", "complex_keys", "_bounds", "_group_keys", "_group_rows")

    def __init__(self, late_wm: np.ndarray, kcodes: np.ndarray, low_watermark: int) -> None:
        #: the rows by arrival watermark, each watermark's in delivery order (a stable sort:
        #: arrival watermarks only grow, so this is the order they were sent in) — the order
        #: the dedup admits them in
        self.order = np.argsort(late_wm, kind="stable")
        wms = np.unique(late_wm)
        s = len(wms)
        # each (key, run) pair once, per key by watermark: a key's next run is the next pair
        pair, row_pair = np.unique(
            kcodes.astype(np.int64) * s + np.searchsorted(wms, late_wm), return_inverse=True
        )
        pk, ps = pair // s, pair % s
        # each run's bound: the watermark its call sees — the next run's arrival watermark,
        # capped by the batch's; the batch's for a key's last run
        bound = np.full(len(pair), low_watermark, np.int64)
        nxt = np.flatnonzero(np.r_[pk[1:] == pk[:-1], False])
        bound[nxt] = np.minimum(wms[ps[nxt + 1]], low_watermark)
        # a key's runs whose calls would see the same watermark are one run (its records in
        # arrival order): nothing could fire between them that does not fire after them all
        start = np.r_[True, (pk[1:] != pk[:-1]) | (bound[1:] != bound[:-1])]
        pair_run = np.cumsum(start) - 1
        rk, rb = pk[start], bound[start]
        has_next = np.r_[rk[1:] == rk[:-1], False]
        # the calls: one per bound of the runs that are not their key's last, ascending; then
        # one call of every key's last run. A key's runs see strictly growing bounds (arrival
        # watermarks grow along them, and equal bounds were merged above), all below the
        # batch's, so this order keeps each key's runs in order, one per call
        early = np.flatnonzero(has_next)
        groups, early_group = np.unique(rb[early], return_inverse=True)
        run_group = np.full(len(rk), len(groups), np.int64)
        run_group[early] = early_group
        self._bounds = np.r_[groups, low_watermark].astype(np.int64)
        # each call's rows in send order and its keys, cut once (a pass per call would cost
        # the batch's rows or runs each: quadratic in a batch of many arrival watermarks)
        row_group = run_group[pair_run[row_pair.reshape(-1)]][self.order]
        self._group_rows = _cut(self.order, row_group, len(self._bounds))
        self._group_keys = _cut(rk[early], early_group, len(groups))
        #: the keys with records in more than one call (ascending codes)
        self.complex_keys = np.unique(rk[early])

    @property
    def count(self) -> int:
        """How many calls (the last: every key's last run)."""
        return len(self._bounds)

    def rows(self, g: int) -> np.ndarray:
        """The rows of call ``g`` (all, admitted or not), in the order they were sent (by
        arrival watermark, each watermark's in delivery order)."""
        return self._group_rows[g]

    def call_watermark(self, g: int) -> int:
        """The low watermark call ``g`` sees (``Batch.low_watermark``) and its keys' timers fire
        up to after it: their next run's arrival watermark; the batch's for the last call."""
        return int(self._bounds[g])

    def keys(self, g: int) -> np.ndarray:
        """The keys of call ``g`` (each has a later run; none for the last call)."""
        return self._group_keys[g] if g < len(self._group_keys) else np.empty(0, np.int64)


def _cut(values: np.ndarray, group: np.ndarray, n: int) -> list[np.ndarray]:
    """``values`` by their ``group`` (``0 .. n-1``), each group's in their order: one stable sort."""
    if not n:
        return []
    by = np.argsort(group, kind="stable")
    return np.split(values[by], np.cumsum(np.bincount(group, minlength=n))[:-1])


def due_rounds(
    timers: TimerTable, kbs: np.ndarray, bounds: np.ndarray, now: int
) -> list[tuple[int, set[bytes]]]:
    """Which of keys ``kbs`` (an object array of distinct encoded keys) have a timer due, an
    event-time one by the key's bound, a wall-time one by ``now``: the keys grouped by bound,
    ascending (one firing round each; none where nothing is due)."""
    if not len(timers) or not len(kbs):
        return []
    pos = pd.Index(kbs).get_indexer(timers.kb)
    rows = np.flatnonzero(pos >= 0)
    if not len(rows):
        return []
    own = pos[rows]
    due = timers_due(timers.ts[rows], timers.d[rows], bounds[own], now)
    if not due.any():
        return []
    k = np.unique(own[due])
    kb, b = kbs[k], bounds[k]
    return [(int(lw), set(kb[b == lw].tolist())) for lw in np.unique(b)]


def carve(st: ColumnarStore, kbs: list[bytes]) -> ColumnarStore:
    """What keys ``kbs`` keep in ``st`` — state rows, timers, sequences, lives and holds —
    moved to a store of their own (each row's relative order kept), sharing ``st``'s dedup
    index and seeing its pending productions (read only while calls run: admission is done
    and productions are checkpointed after); :func:`put_back` returns it."""
    state = st.state
    part = None
    if state is not None and state.num_rows:
        mask = pc.is_in(state.column("_kb"), value_set=pa.array(kbs, pa.binary()))
        part, st.state = state.filter(mask), state.filter(pc.invert(mask))
    rows = st.timers.of_keys(kbs)
    timers = st.timers.take(rows)
    if len(rows):
        st.timers = st.timers.without(rows)
    meta = {kb: m for kb in kbs if (m := st.meta.pop(kb, None)) is not None}
    want = set(kbs)
    pending = [p for p in st.pending if p[1] in want]
    return ColumnarStore(part, timers, meta, pending, st.dedup, st.state_version)


def put_back(st: ColumnarStore, part: ColumnarStore) -> None:
    """The keys :func:`carve` took from ``st``, with what calls changed (a key forgotten in
    ``part`` stays forgotten)."""
    if part.state is not None and part.state.num_rows:
        cur = st.state
        st.state = (
            part.state
            if cur is None or not cur.num_rows
            else pa.concat_tables([cur, part.state], promote_options="permissive")
        )
    st.timers = TimerTable.concat([st.timers, part.timers])
    st.meta.update(part.meta)


def run_in_order(
    runner: _Runner,
    st: ColumnarStore,
    recs: InputColumns,
    runs: Runs,
    admit: np.ndarray,
    sent: np.ndarray | None,
    key_of: dict[bytes, Key],
    now: int,
    out: Outputs,
    dead: list[Any],
    c: StepMetrics,
    touched: set[bytes],
) -> None:
    """Records under several arrival watermarks, as the per-key step takes them (the module
    docstring); productions counted behind the watermark of the call that made them."""
    out.behind = 0
    uniq = recs.uniques
    kbs = np.empty(len(uniq), object)
    kbs[:] = uniq
    last = runs.count - 1
    part = carve(st, kbs[runs.complex_keys].tolist()) if last else st
    for g in range(runs.count):
        if g == last and part is not st:
            out.number(
                runner.name, part
            )  # their ids from the sequences and lives they move back with
            put_back(st, part)
            part = st
        rows = runs.rows(g)
        call_lw = runs.call_watermark(g)
        if sent is not None:
            runner._send_late(recs, rows[sent[rows]], key_of, out)
        idx = rows[admit[rows]]
        if len(idx):
            sub, present = pd.factorize(recs.codes[idx])
            codes = sub.astype(np.int64, copy=False)
            order = [uniq[k] for k in present.tolist()]
            srt = np.argsort(codes, kind="stable")
            mark = len(out.kbs)
            c.processed += runner._records(
                part, recs, idx[srt], codes[srt], order, key_of, call_lw, now, out, dead
            )
            out.count_behind(mark, call_lw)
        if g == last:
            break
        nxt = kbs[runs.keys(g)]
        for bound_lw, only in due_rounds(part.timers, nxt, np.full(len(nxt), call_lw), now):
            mark = len(out.kbs)
            runner._timers(part, key_of, bound_lw, now, out, dead, c, touched, only)
            out.count_behind(mark, bound_lw)
        # a key that keeps nothing now starts a new life in its next run (``call_life``)
        busy = set(out.kbs) if runner.options.strong_productions else set()
        gone = part.keeping_nothing(nxt.tolist(), busy)
        if gone:
            out.number(runner.name, part)
            for kb in gone:
                part.meta.pop(kb, None)
                out.forgotten[kb] = out.forgotten.get(kb, 0) + 1
