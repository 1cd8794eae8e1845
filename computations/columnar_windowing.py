"""Windowed aggregations on the columnar path (``millwheel/_columnar.py``): ``windowing.py``'s
``WindowCounter`` and ``WindowAggregate`` over a micro-batch of many keys at once.

Both give the per-record computations' productions — the same values, timestamps and
ids (per key, in the same order) — and share their rules (``windowing.py``: windows,
timer tags, the bucket-closing rule, the production's value); only the execution differs:
a batch's records are assigned to windows and folded into the state with a few numpy
calls (no per-record Python beyond reading a value's field), and due windows are found
in the state with one sorted search.

``ColumnarWindowCounter``: state rows ``(key, start, count, empty_run)``, one per bucket
with records; a key whose buckets are all emitted but whose run of empty buckets goes on
keeps one row with ``count = -1`` that carries ``empty_run``. With ``trailing_empty=0``
due buckets are emitted in a few vectorised calls; otherwise each key with due timers runs
the per-record counter's timer rule (:func:`~computations.windowing.close_bucket`) in a
loop (per due bucket, not per record).

>>> from millwheel.testing import Harness
>>> h = Harness.for_computation(ColumnarWindowCounter, inputs={"q": lambda r: r.value}, outputs=["window_counts"],
...                             params={"trailing_empty": 1})
>>> h.inject("q", [h.record("cats", 1_100), h.record("cats", 1_200), h.record("cats", 2_050)])
>>> h.advance_watermark("q", 4_000)
>>> [(v["window_start"], v["count"]) for v in h.run().values("window_counts")]
[(1000, 2), (2000, 1), (3000, 0)]
>>> h.inject("q", [h.record("cats", 5_500)]); h.finish("q")
>>> [(v["window_start"], v["count"]) for v in h.run().values("window_counts")]
[(5000, 1)]
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pandas as pd

from millwheel import MAX_TIMESTAMP, MIN_TIMESTAMP, Batch, ColumnarComputation

from .windowing import (
    WindowAggregateSettings,
    aggregate_value,
    close_bucket,
    collect_tag,
    fire_tag,
    number_of,
    update_time,
    windows_per_record,
)


def find_rows(
    s_codes: np.ndarray, s_starts: np.ndarray, t_codes: np.ndarray, t_starts: np.ndarray, step: int
) -> tuple[np.ndarray, np.ndarray]:
    """For each wanted (key code, window start) ``t``, the row of the state's ``s`` pairs
    that has it and whether there is one (starts are multiples of ``step``): one sort."""
    if not len(s_starts) or not len(t_starts):
        return np.zeros(len(t_starts), np.int64), np.zeros(len(t_starts), np.bool_)
    lo = min(int(t_starts.min()), int(s_starts.min()))
    span = (max(int(t_starts.max()), int(s_starts.max())) - lo) // step + 1
    s_pair = s_codes * span + (s_starts - lo) // step
    t_pair = t_codes * span + (t_starts - lo) // step
    order = np.argsort(s_pair, kind="stable")
    pos = np.searchsorted(s_pair, t_pair, sorter=order).clip(max=len(s_pair) - 1)
    rows = order[pos]
    return rows, s_pair[rows] == t_pair


_STATE_COLUMNS = ["key", "start", "count", "empty_run"]


class ColumnarWindowCounter(ColumnarComputation):
    """Counts records per key in ``window_ms`` buckets; produces ``{"key", "window_start", "count"}``."""

    record_columns = ("key", "timestamp")

    def __init__(
        self, window_ms: int = 1_000, output: str = "window_counts", trailing_empty: int = 10
    ) -> None:
        self.window_ms = window_ms
        self.output = output
        self.trailing_empty = trailing_empty

    def process_batch(self, batch: Batch) -> None:
        w = self.window_ms
        r = batch.records
        keys = r["key"].array  # categorical: the call's keys
        if not isinstance(keys, pd.Categorical):  # tuple keys: plain objects
            self._process_batch_frames(batch)
            return
        starts = r["timestamp"].to_numpy() // w * w
        old = batch.state
        if len(old):
            old = old[old["count"].to_numpy() >= 0]  # a record ends a key's run of empty buckets
        # (key code, bucket) pairs as one int64: buckets relative to the oldest, keys above them
        codes = np.asarray(keys.codes, np.int64)
        o_codes = (
            np.asarray(old["key"].array.codes, np.int64) if len(old) else np.empty(0, np.int64)
        )
        o_starts = old["start"].to_numpy(np.int64) if len(old) else np.empty(0, np.int64)
        lo = min(int(starts.min()), int(o_starts.min()) if len(o_starts) else int(starts.min()))
        hi = max(int(starts.max()), int(o_starts.max()) if len(o_starts) else int(starts.max()))
        span = (hi - lo) // w + 1
        pair = codes * span + (starts - lo) // w
        new_pairs, new_counts = np.unique(pair, return_counts=True)
        if len(old):
            all_pairs = np.concatenate([new_pairs, o_codes * span + (o_starts - lo) // w])
            weights = np.concatenate([new_counts, old["count"].to_numpy(np.int64)])
            pairs, inv = np.unique(all_pairs, return_inverse=True)
            counts = np.bincount(inv, weights=weights).astype(np.int64)
        else:
            pairs, counts = new_pairs, new_counts
        cats = keys.categories
        state = pd.DataFrame(
            {
                "key": pd.Categorical.from_codes(pairs // span, categories=cats),
                "start": lo + pairs % span * w,
                "count": counts,
                "empty_run": np.zeros(len(pairs), np.int64),
            }
        )
        batch.set_state(state)
        t_starts = lo + new_pairs % span * w
        batch.set_timers(
            pd.Categorical.from_codes(new_pairs // span, categories=cats),
            [fire_tag(x) for x in t_starts.tolist()],
            t_starts + w,
        )

    def _process_batch_frames(self, batch: Batch) -> None:
        """Tuple keys (plain object columns): the same counts with a pandas ``groupby``."""
        w = self.window_ms
        r = batch.records
        start = r["timestamp"].to_numpy() // w * w
        new = (
            pd.DataFrame({"key": r["key"].array, "start": start})
            .groupby(["key", "start"], sort=False, observed=True)
            .size()
            .rename("count")
            .reset_index()
        )
        old = batch.state
        if len(old):
            old = old[old["count"] >= 0]
        if len(old):
            rows = pd.concat([old[["key", "start", "count"]], new], ignore_index=True)
            rows = rows.groupby(["key", "start"], sort=False, as_index=False, observed=True)[
                "count"
            ].sum()
        else:
            rows = new
        rows["empty_run"] = 0
        batch.set_state(
            rows[_STATE_COLUMNS].astype({"start": "int64", "count": "int64", "empty_run": "int64"})
        )
        starts = new["start"].to_numpy()
        batch.set_timers(new["key"], [fire_tag(s) for s in starts.tolist()], starts + w)

    def process_timers(self, batch: Batch, timers: pd.DataFrame) -> None:
        if self.trailing_empty == 0 and isinstance(timers["key"].array, pd.Categorical):
            self._fire_vectorised(batch, timers)
        else:
            self._fire_per_key(batch, timers)

    # ---- trailing_empty == 0: no timer chains, every due bucket is one row --------------
    def _fire_vectorised(self, batch: Batch, timers: pd.DataFrame) -> None:
        w = self.window_ms
        st = batch.state
        keys = timers["key"].array
        t_codes = np.asarray(keys.codes, np.int64)
        t_ts = timers["timestamp"].to_numpy(np.int64)
        t_starts = t_ts - w
        counts = np.zeros(len(t_ts), np.int64)
        if len(st):
            s_codes = np.asarray(st["key"].array.codes, np.int64)
            s_starts = st["start"].to_numpy(np.int64)
            s_counts = st["count"].to_numpy(np.int64)
            rows, hit = find_rows(s_codes, s_starts, t_codes, t_starts, w)
            valid = hit & (s_counts[rows] >= 0)
            counts[valid] = s_counts[rows][valid]
            fired = np.zeros(len(s_starts), np.bool_)
            fired[rows[hit]] = True
        emit = counts > 0 if batch.low_watermark == MAX_TIMESTAMP else np.ones(len(t_ts), np.bool_)
        e_keys = pd.Categorical.from_codes(t_codes[emit], categories=keys.categories)
        starts, tss, cnt = t_starts[emit], t_ts[emit], counts[emit]
        values = [
            {"key": k, "window_start": s, "count": c}
            for k, s, c in zip(e_keys.tolist(), starts.tolist(), cnt.tolist(), strict=True)
        ]
        batch.produce(self.output, values, keys=e_keys, timestamps=tss)
        if len(st):
            batch.set_state(st[~fired])

    # ---- the per-record counter's timer logic, per key ---------------------------------
    def _fire_per_key(self, batch: Batch, timers: pd.DataFrame) -> None:
        w, trailing, lw = self.window_ms, self.trailing_empty, batch.low_watermark
        st = batch.state
        state: dict = {}
        for k, s, c, e in zip(
            st["key"].tolist(),
            st["start"].tolist(),
            st["count"].tolist(),
            st["empty_run"].tolist(),
            strict=True,
        ):
            counts, _ = state.get(k, ({}, 0))
            if c >= 0:
                counts[s] = c
            state[k] = (counts, e)
        out_keys: list = []
        out_vals: list = []
        out_ts: list[int] = []
        rows: list[tuple] = []
        t_keys: list = []
        t_tags: list[str] = []
        t_ts: list[int] = []
        due_by_key: dict = {}
        for k, t in zip(timers["key"].tolist(), timers["timestamp"].tolist(), strict=True):
            due_by_key.setdefault(k, []).append(t - w)
        for k, starts in due_by_key.items():
            counts, e = state.get(k, ({}, 0))
            counts = dict(counts)
            heap = sorted(set(starts))
            queued = set(heap)
            kept = True
            next_timer = None
            while heap:
                s = heapq.heappop(heap)
                queued.discard(s)
                res = close_bucket(counts, e, s, w, trailing, finished=lw == MAX_TIMESTAMP)
                e = res.empty_run
                if res.count is not None:
                    out_keys.append(k)
                    out_vals.append({"key": k, "window_start": s, "count": res.count})
                    out_ts.append(s + w)
                n = res.next_start
                if n is not None:
                    if (
                        n + w <= lw
                    ):  # already due: fired in this call, as the per-record counter's next round would
                        if n not in queued:
                            heapq.heappush(heap, n)
                            queued.add(n)
                        if next_timer == n:
                            next_timer = None
                    else:
                        next_timer = n
                    kept = True
                else:
                    kept = res.keep
                    if not kept:
                        e = 0
            if next_timer is not None:
                t_keys.append(k)
                t_tags.append(fire_tag(next_timer))
                t_ts.append(next_timer + w)
            state[k] = (counts, e) if kept else ({}, 0)
            if kept:
                if counts:
                    rows += [(k, s, c, e) for s, c in counts.items()]
                else:
                    rows.append((k, 0, -1, e))
        if out_keys:
            batch.produce(
                self.output, out_vals, keys=out_keys, timestamps=np.array(out_ts, np.int64)
            )
        if t_keys:
            batch.set_timers(t_keys, t_tags, np.array(t_ts, np.int64))
        changed = list(due_by_key)
        frame = (
            pd.DataFrame(rows, columns=_STATE_COLUMNS)
            if rows
            else pd.DataFrame(
                {c: pd.Series([], dtype=object if c == "key" else "int64") for c in _STATE_COLUMNS}
            )
        )
        batch.set_state(
            frame.astype({"start": "int64", "count": "int64", "empty_run": "int64"}), keys=changed
        )


_AGG_COLUMNS = ("start", "count", "sum", "min", "max", "update", "closed")


def numbers_of(column: pd.Series, field: str, ids: pd.Series) -> np.ndarray:
    """A ``value.<field>`` column as floats; raises as :func:`number_of` does for the first
    record without a finite number (the call then falls back per record: dead letters).
    A typed column (a declared field) is checked in one pass; an untyped one per value."""
    if column.dtype == object:
        return np.fromiter(
            (
                number_of({field: v}, field, i)
                for v, i in zip(column.tolist(), ids.tolist(), strict=True)
            ),
            np.float64,
            len(column),
        )
    vals = column.to_numpy(np.float64, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(vals))
    if len(bad):
        i = int(bad[0])
        v = column.iloc[i]
        # a typed column holds null (NaN in a float column) for a missing field and for a
        # value not of the declared type (``_fields.field_column``): say so, not "got None"
        if v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            got = "none" if v is pd.NA else "NaN (a NaN"
            msg = f"record {ids.iloc[i]!r}: field {field!r} must be a finite number, got {got}{' (' if v is pd.NA else ', '}missing, null, or not of the type its stream declares: {column.dtype})"
            raise ValueError(msg)
        number_of({field: v.item() if hasattr(v, "item") else v}, field, ids.iloc[i])
    return vals


class ColumnarWindowAggregate(WindowAggregateSettings, ColumnarComputation):
    """``windowing.WindowAggregate`` on the columnar path: the same windows, firing rules,
    allowed lateness and productions (ids included); see ``WindowAggregate``.

    State rows ``(key, start, count, sum, min, max, update, closed)``, one per open window
    (``closed``: the key's newest dropped window end, on each of its rows). Sums are
    ``np.bincount`` over the window's old sum then its records in order: the same float
    additions, in the same order, as the per-record computation.

    >>> from millwheel.testing import Harness
    >>> h = Harness.for_computation(ColumnarWindowAggregate, inputs={"q": lambda r: r.value["q"]}, outputs=["window_aggregates"],
    ...                             params={"aggregate": "max", "field": "ms", "window_ms": 2_000, "slide_ms": 1_000})
    >>> h.inject("q", [h.record({"q": "cats", "ms": 10}, 1_100), h.record({"q": "cats", "ms": 30}, 2_050)])
    >>> h.finish("q")
    >>> [(v["window_start"], v["count"], v["max"]) for v in h.run().values("window_aggregates")]
    [(0, 1, 10.0), (1000, 2, 30.0), (2000, 1, 30.0)]
    """

    @property
    def record_columns(self) -> tuple[str, ...]:  # type: ignore[override]
        """The columns a batch's records carry: a count reads no values, the others only
        ``value.<field>`` (on a stream that declares its fields, read from its columns
        without unpickling: ``millwheel/_fields.py``)."""
        return (
            ("key", "timestamp")
            if self.aggregate == "count"
            else ("key", "id", "timestamp", f"value.{self.field}")
        )

    def process_batch(self, batch: Batch) -> None:
        w, slide, late = self.window_ms, self.slide_ms, self.allowed_lateness_ms
        r = batch.records
        n = len(r)
        ts = r["timestamp"].to_numpy(np.int64)
        codes = batch.key_codes(r["key"])
        if self.aggregate == "count":
            vals = np.zeros(n)
        else:
            vals = numbers_of(r[f"value.{self.field}"], self.field, r["id"])  # type: ignore[arg-type]
        # every (record, window) pair, record by record, oldest window first
        k = windows_per_record(w, slide)
        rec = np.repeat(np.arange(n), k)
        starts = (
            np.repeat(ts // slide * slide, k)
            - np.tile(np.arange(k - 1, -1, -1, dtype=np.int64), n) * slide
        )
        keep = starts + w > ts[rec]
        old = batch.state
        o_codes = batch.key_codes(old["key"]) if len(old) else np.empty(0, np.int64)
        closed = np.full(len(batch.keys), MIN_TIMESTAMP, np.int64)
        if len(old):
            np.maximum.at(closed, o_codes, old["closed"].to_numpy(np.int64))
        keep &= (
            starts + w > closed[codes[rec]]
        )  # a window already dropped: later than the allowed lateness
        rec, starts = rec[keep], starts[keep]
        n_old = len(old)
        a_codes = np.concatenate([o_codes, codes[rec]])
        a_starts = np.concatenate([old["start"].to_numpy(np.int64), starts]) if n_old else starts
        if not len(a_starts):
            return
        lo = int(a_starts.min())
        span = (int(a_starts.max()) - lo) // slide + 1
        pairs, inv = np.unique(a_codes * span + (a_starts - lo) // slide, return_inverse=True)
        m = len(pairs)
        new_vals = vals[rec]
        if n_old:
            count = np.bincount(
                inv,
                weights=np.concatenate([old["count"].to_numpy(np.float64), np.ones(len(rec))]),
                minlength=m,
            )
            total = np.bincount(
                inv,
                weights=np.concatenate([old["sum"].to_numpy(np.float64), new_vals]),
                minlength=m,
            )
            mins = np.full(m, math.inf)
            maxs = np.full(m, -math.inf)
            np.minimum.at(mins, inv, np.concatenate([old["min"].to_numpy(np.float64), new_vals]))
            np.maximum.at(maxs, inv, np.concatenate([old["max"].to_numpy(np.float64), new_vals]))
            update = np.zeros(m, np.int64)
            update[inv[:n_old]] = old["update"].to_numpy(np.int64)
        else:
            count = np.bincount(inv, minlength=m).astype(np.float64)
            total = np.bincount(inv, weights=new_vals, minlength=m)
            mins = np.full(m, math.inf)
            maxs = np.full(m, -math.inf)
            np.minimum.at(mins, inv, new_vals)
            np.maximum.at(maxs, inv, new_vals)
            update = np.zeros(m, np.int64)
        p_codes = pairs // span
        p_starts = lo + pairs % span * slide
        batch.set_state(
            pd.DataFrame(
                {
                    "key": batch.key_column(p_codes),
                    "start": p_starts,
                    "count": count.astype(np.int64),
                    "sum": total,
                    "min": mins,
                    "max": maxs,
                    "update": update,
                    "closed": closed[p_codes],
                }
            )
        )
        # a fire timer per window with records (again for a window that fired: a late update)
        touched = np.unique(inv[n_old:])
        t_codes, t_starts = p_codes[touched], p_starts[touched]
        batch.set_timers(
            batch.key_column(t_codes), [fire_tag(s) for s in t_starts.tolist()], t_starts + w
        )
        if late:
            is_new = np.ones(m, np.bool_)
            is_new[inv[:n_old]] = False
            fresh = np.flatnonzero(is_new)
            batch.set_timers(
                batch.key_column(p_codes[fresh]),
                [collect_tag(s) for s in p_starts[fresh].tolist()],
                p_starts[fresh] + w + late,
            )

    def process_timers(self, batch: Batch, timers: pd.DataFrame) -> None:
        w, late = self.window_ms, self.allowed_lateness_ms
        st = batch.state
        if not len(st):
            return
        tags = timers["tag"].tolist()
        t_codes = batch.key_codes(timers["key"])
        t_starts = np.fromiter((int(t[1:]) for t in tags), np.int64, len(tags))
        is_fire = np.fromiter((t[0] == "w" for t in tags), np.bool_, len(tags))
        s_codes = batch.key_codes(st["key"])
        s_starts = st["start"].to_numpy(np.int64)
        rows, hit = find_rows(s_codes, s_starts, t_codes, t_starts, self.slide_ms)
        fire = is_fire & hit
        f_rows = rows[fire]  # in the frame's order: per key by timestamp
        update = st["update"].to_numpy(np.int64).copy()
        if len(f_rows):
            cnt, tot = (
                st["count"].to_numpy(np.int64)[f_rows],
                st["sum"].to_numpy(np.float64)[f_rows],
            )
            lo, hi, up = (
                st["min"].to_numpy(np.float64)[f_rows],
                st["max"].to_numpy(np.float64)[f_rows],
                update[f_rows],
            )
            keys = batch.keys
            agg = self.aggregate
            values = [
                aggregate_value(agg, keys[c], s, w, n, t, a, b, u)
                for c, s, n, t, a, b, u in zip(
                    s_codes[f_rows].tolist(),
                    s_starts[f_rows].tolist(),
                    cnt.tolist(),
                    tot.tolist(),
                    lo.tolist(),
                    hi.tolist(),
                    up.tolist(),
                    strict=True,
                )
            ]
            stamps = np.where(up == 0, s_starts[f_rows] + w, update_time(batch.low_watermark))
            batch.produce(
                self.output, values, keys=batch.key_column(s_codes[f_rows]), timestamps=stamps
            )
            update[f_rows] += 1
        # windows dropped: on their collect timer, or when they fire without allowed lateness
        gone = np.zeros(len(st), np.bool_)
        gone[rows[hit & (~is_fire | (late == 0))]] = True
        closed = st["closed"].to_numpy(np.int64).copy()
        if gone.any():
            per_key = np.full(len(batch.keys), MIN_TIMESTAMP, np.int64)
            np.maximum.at(per_key, s_codes[gone], s_starts[gone] + w)
            closed = np.maximum(closed, per_key[s_codes])
        out = st.assign(update=update, closed=closed)[~gone]
        batch.set_state(out)
