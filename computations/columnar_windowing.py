"""``ColumnarWindowCounter``: ``computations.windowing.WindowCounter`` as a columnar computation (``millwheel/_columnar.py``).

The same counts per key and ``window_ms`` bucket, the same productions
(``{"key", "window_start", "count"}`` at the bucket's end, with the same ids: per key,
in the same order), the same trailing zero counts for up to ``trailing_empty`` empty
buckets after a key goes quiet; but a micro-batch's records of many keys are counted in
one pandas ``groupby`` and never decoded (only keys and timestamps are read).

State rows: ``(key, start, count, empty_run)``, one per bucket with records; a key whose
buckets are all emitted but whose run of empty buckets goes on keeps one row with
``count = -1`` that carries ``empty_run``. With ``trailing_empty=0`` due buckets are
emitted in a few vectorised calls; otherwise each key with due timers runs the per-record
counter's timer logic in a loop (per due bucket, not per record).

>>> from millwheel.testing import Harness
>>> h = Harness.for_computation(ColumnarWindowCounter, inputs={"q": lambda r: r.value}, outputs=["window_counts"],
...                             params={"trailing_empty": 1})
>>> h.inject("q", [h.record("cats", 1_100), h.record("cats", 1_200), h.record("cats", 2_050)])
>>> h.advance_watermark("q", 4_000); h.run()
>>> [(v["window_start"], v["count"]) for v in h.values("window_counts")]
[(1000, 2), (2000, 1), (3000, 0)]
>>> h.inject("q", [h.record("cats", 5_500)]); h.finish("q"); h.run()
>>> [(v["window_start"], v["count"]) for v in h.values("window_counts")][3:]
[(5000, 1)]
"""

from __future__ import annotations

import heapq

import numpy as np
import pandas as pd

from millwheel import MAX_TIMESTAMP, Batch, ColumnarComputation

_STATE_COLUMNS = ["key", "start", "count", "empty_run"]


class ColumnarWindowCounter(ColumnarComputation):
    """Counts records per key in ``window_ms`` buckets; produces ``{"key", "window_start", "count"}``."""

    record_columns = ("key", "timestamp")

    def __init__(self, window_ms: int = 1_000, output: str = "window_counts", trailing_empty: int = 10) -> None:
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
        o_codes = np.asarray(old["key"].array.codes, np.int64) if len(old) else np.empty(0, np.int64)
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
        state = pd.DataFrame({
            "key": pd.Categorical.from_codes(pairs // span, categories=cats), "start": lo + pairs % span * w,
            "count": counts, "empty_run": np.zeros(len(pairs), np.int64),
        })  # fmt: skip
        batch.set_state(state)
        t_starts = lo + new_pairs % span * w
        batch.set_timers(pd.Categorical.from_codes(new_pairs // span, categories=cats), [f"w{x}" for x in t_starts.tolist()], t_starts + w)

    def _process_batch_frames(self, batch: Batch) -> None:
        w = self.window_ms
        r = batch.records
        start = r["timestamp"].to_numpy() // w * w
        new = pd.DataFrame({"key": r["key"].array, "start": start}).groupby(["key", "start"], sort=False, observed=True).size().rename("count").reset_index()
        old = batch.state
        if len(old):
            old = old[old["count"] >= 0]
        if len(old):
            rows = pd.concat([old[["key", "start", "count"]], new], ignore_index=True)
            rows = rows.groupby(["key", "start"], sort=False, as_index=False, observed=True)["count"].sum()
        else:
            rows = new
        rows["empty_run"] = 0
        batch.set_state(rows[_STATE_COLUMNS].astype({"start": "int64", "count": "int64", "empty_run": "int64"}))
        starts = new["start"].to_numpy()
        batch.set_timers(new["key"], [f"w{s}" for s in starts.tolist()], starts + w)

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
            lo = min(int(t_starts.min()), int(s_starts.min()))
            span = (max(int(t_starts.max()), int(s_starts.max())) - lo) // w + 1
            s_pair = s_codes * span + (s_starts - lo) // w
            t_pair = t_codes * span + (t_starts - lo) // w
            order = np.argsort(s_pair)
            pos = np.searchsorted(s_pair, t_pair, sorter=order).clip(max=len(s_pair) - 1)
            hit = s_pair[order[pos]] == t_pair
            valid = hit & (s_counts[order[pos]] >= 0)
            counts[valid] = s_counts[order[pos]][valid]
            fired = np.zeros(len(s_pair), np.bool_)
            fired[order[pos[hit]]] = True
        emit = counts > 0 if batch.low_watermark == MAX_TIMESTAMP else np.ones(len(t_ts), np.bool_)
        e_keys = pd.Categorical.from_codes(t_codes[emit], categories=keys.categories)
        starts, tss, cnt = t_starts[emit], t_ts[emit], counts[emit]
        values = [{"key": k, "window_start": s, "count": c} for k, s, c in zip(e_keys.tolist(), starts.tolist(), cnt.tolist(), strict=True)]
        batch.produce(self.output, values, keys=e_keys, timestamps=tss)
        if len(st):
            batch.set_state(st[~fired])

    # ---- the per-record counter's timer logic, per key ---------------------------------
    def _fire_per_key(self, batch: Batch, timers: pd.DataFrame) -> None:
        w, trailing, lw = self.window_ms, self.trailing_empty, batch.low_watermark
        st = batch.state
        state: dict = {}
        for k, s, c, e in zip(st["key"].tolist(), st["start"].tolist(), st["count"].tolist(), st["empty_run"].tolist(), strict=True):
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
                count = counts.pop(s, 0)
                if not count and lw == MAX_TIMESTAMP:
                    kept = bool(counts)
                    if not kept:
                        e = 0
                    continue
                e = 0 if count else e + 1
                out_keys.append(k)
                out_vals.append({"key": k, "window_start": s, "count": count})
                out_ts.append(s + w)
                if e < trailing:
                    n = s + w
                    if n + w <= lw:
                        if n not in queued:
                            heapq.heappush(heap, n)
                            queued.add(n)
                        if next_timer == n:
                            next_timer = None
                    else:
                        next_timer = n
                    kept = True
                else:
                    kept = bool(counts)
                    if not kept:
                        e = 0
            if next_timer is not None:
                t_keys.append(k)
                t_tags.append(f"w{next_timer}")
                t_ts.append(next_timer + w)
            state[k] = (counts, e) if kept else ({}, 0)
            if kept:
                if counts:
                    rows += [(k, s, c, e) for s, c in counts.items()]
                else:
                    rows.append((k, 0, -1, e))
        if out_keys:
            batch.produce(self.output, out_vals, keys=out_keys, timestamps=np.array(out_ts, np.int64))
        if t_keys:
            batch.set_timers(t_keys, t_tags, np.array(t_ts, np.int64))
        changed = list(due_by_key)
        frame = pd.DataFrame(rows, columns=_STATE_COLUMNS) if rows else pd.DataFrame({c: pd.Series([], dtype=object if c == "key" else "int64") for c in _STATE_COLUMNS})
        batch.set_state(frame.astype({"start": "int64", "count": "int64", "empty_run": "int64"}), keys=changed)
