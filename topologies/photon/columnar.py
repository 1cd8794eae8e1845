"""The joiner on the columnar path (``millwheel/_columnar.py``): :class:`ColumnarJoiner`.

The same rules as the per-record :class:`~.joiner.Joiner` — they are
:class:`~.joiner.JoinRules`, the one definition both run — over a micro-batch of many
query ids at once. What a batch mostly holds takes no per-key Python:

* **queries** (the bulk of the input): a query id with no cached query gets its first
  query of the batch cached (one state row) and its ``evict`` timer, in a few vectorised
  calls; a query id that already has one ignores it (a redelivery, §3.4.1);
* **clicks whose query is at hand** — cached, or logged earlier in the same batch: a hash
  join of the batch's clicks against the buffered queries (the cache's rows and the
  batch's first query per id), then the adapter per pair (§3.3.1); each joined event is a
  once-production on the click id (the IdRegistry commit of §2, one call per batch).

A query id with a click whose query is not at hand, or with clicks already waiting (the
dispatcher's retries, §3.2.1), runs :class:`~.joiner.JoinRules` record by record in
delivery order, with the LogsEventStore lookup (§3.4.2), the waiting clicks, their
``retry`` and ``give_up`` timers, the give-up's tentative once-production and the hold;
so do due timers, except ``evict`` timers of ids with nothing waiting (their cache rows
dropped in bulk). Productions, timers and holds are those of the per-record joiner, per
query id in the same order, so production ids and registry tokens are the same too.

State rows ``(key, kind, cid, ts, attempts, value)``: ``kind`` 0 the cached query
(``value``: the pickled query, ``ts`` its time), 1 a waiting click (``cid``, the click's
``ts``, ``attempts`` retries so far, the pickled click), in waiting order.

>>> from millwheel.testing import Harness
>>> from topologies.photon.topology import join_topology
>>> h = Harness(join_topology(PhotonConfig(log_store=False, columnar_joiner=True)))
>>> h.inject("clicks", [h.record({"click_id": "c1", "query_id": "q1", "ts": 1_500}, 1_500, id="c1")])
>>> h.inject("queries", [h.record({"query_id": "q1", "ts": 1_000, "advertiser_id": "a7"}, 1_000, id="q1"),
...                      h.record({"query_id": "q2", "ts": 1_100, "advertiser_id": "a8"}, 1_100, id="q2")])
>>> h.inject("clicks", [h.record({"click_id": "c2", "query_id": "q2", "ts": 1_600}, 1_600, id="c2")])
>>> sorted((j["click_id"], j["advertiser_id"]) for j in h.run().values("joined_clicks"))
[('c1', 'a7'), ('c2', 'a8')]
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pandas as pd

from millwheel import Batch, ColumnarComputation, TimeDomain

from .config import PhotonConfig
from .joiner import Joiner, JoinKey, JoinRules

_WALL = TimeDomain.WALL_TIME
_LW = TimeDomain.LOW_WATERMARK
_FAMILIES = {"evict": Joiner.evict, "retry": Joiner.retry, "give_up": Joiner.give_up}
_EVICT = Joiner.evict.tag()
_COLUMNS = ("kind", "cid", "ts", "attempts", "value")
_QUERY, _CLICK = 0, 1
_dumps, _loads = pickle.dumps, pickle.loads


class ColumnarJoiner(JoinRules, ColumnarComputation):
    """Keyed by query id: :class:`~.joiner.Joiner`'s rules over a batch of many ids (see the module docstring)."""

    record_columns = ("key", "id", "timestamp", "stream", "value")

    def process_batch(self, batch: Batch) -> None:
        r = batch.records
        n = len(r)
        codes = batch.key_codes(r["key"])
        streams = r["stream"].tolist()
        values = r["value"].tolist()
        ts = r["timestamp"].to_numpy(np.int64)
        qs = self.query_stream
        is_q = np.fromiter((s == qs for s in streams), np.bool_, n)
        nk = len(batch.keys)
        old = batch.state
        o_codes = batch.key_codes(old["key"]) if len(old) else np.empty(0, np.int64)
        o_kind = old["kind"].to_numpy(np.int64) if len(old) else np.empty(0, np.int64)
        cached = np.zeros(nk, np.bool_)
        cached[o_codes[o_kind == _QUERY]] = True
        waiting = np.zeros(nk, np.bool_)
        waiting[o_codes[o_kind == _CLICK]] = True
        # each id's first query in the batch (records are grouped by id, in delivery order)
        first_q = np.full(nk, n, np.int64)
        qi = np.flatnonzero(is_q)
        np.minimum.at(first_q, codes[qi], qi)
        ci = np.flatnonzero(~is_q)
        at_hand = cached[codes[ci]] | (first_q[codes[ci]] < ci)
        slow = waiting.copy()
        slow[codes[ci[~at_hand]]] = True
        fx = _Collect(batch)
        # ---- the hash join: clicks of ids on the fast path, against the buffered queries
        fast_clicks = ci[~slow[codes[ci]]]
        if len(fast_clicks):
            ids = r["id"].tolist()
            rows = {
                int(c): v
                for c, k, v in zip(
                    o_codes.tolist(),
                    o_kind.tolist(),
                    old["value"].tolist() if len(old) else [],
                    strict=True,
                )
                if k == _QUERY
            }
            queries: dict[int, Any] = {}
            for i in fast_clicks.tolist():
                c = int(codes[i])
                q = queries.get(c)
                if q is None:
                    q = queries[c] = _loads(rows[c]) if cached[c] else values[first_q[c]]
                click, _ = self.click_of(values[i], streams[i], ids[i])
                fx.key = batch.keys[c]
                self.join(fx, q, click)
        # ---- queries of ids on the fast path with nothing cached: cache the first
        new = np.flatnonzero((first_q < n) & ~cached & ~slow)
        if len(new):
            pos = first_q[new]
            q_ts = ts[pos]
            batch.set_state(
                pd.DataFrame(
                    {
                        "key": batch.key_column(new),
                        "kind": np.zeros(len(new), np.int8),
                        "cid": [""] * len(new),
                        "ts": q_ts,
                        "attempts": np.zeros(len(new), np.int64),
                        "value": [_dumps(values[p]) for p in pos.tolist()],
                    }
                ),
                keys=batch.key_column(new),
            )
            batch.set_timers(
                batch.key_column(new), [_EVICT] * len(new), q_ts + self.cfg.retention_ms
            )
        # ---- everything else: the rules, record by record
        slow_codes = np.flatnonzero(slow)
        if len(slow_codes):
            ids = r["id"].tolist()
            states = self._states(batch, old, o_codes, slow_codes)
            for i in np.flatnonzero(slow[codes]).tolist():
                c = int(codes[i])
                fx.key = batch.keys[c]
                st = states[c]
                if is_q[i]:
                    self.query_arrived(fx, st, values[i], int(ts[i]))
                else:
                    click, cid = self.click_of(values[i], streams[i], ids[i])
                    self.click_arrived(fx, st, click, cid, int(ts[i]))
            self._save(batch, states)
        fx.flush()

    def process_timers(self, batch: Batch, timers: pd.DataFrame) -> None:
        codes = batch.key_codes(timers["key"])
        tags = timers["tag"].tolist()
        nk = len(batch.keys)
        old = batch.state
        o_codes = batch.key_codes(old["key"]) if len(old) else np.empty(0, np.int64)
        o_kind = old["kind"].to_numpy(np.int64) if len(old) else np.empty(0, np.int64)
        slow = np.zeros(nk, np.bool_)
        slow[o_codes[o_kind == _CLICK]] = True  # clicks waiting: the rules, timer by timer
        slow[codes[np.fromiter((t != _EVICT for t in tags), np.bool_, len(tags))]] = True
        # ids whose only due timers are evictions and that have nothing waiting: their cache rows go
        evict_only = np.zeros(nk, np.bool_)
        evict_only[codes] = True
        evict_only &= ~slow
        if evict_only.any():
            batch.set_state(old.iloc[:0], keys=batch.key_column(np.flatnonzero(evict_only)))
        slow_codes = np.flatnonzero(slow)
        if not len(slow_codes):
            return
        states = self._states(batch, old, o_codes, slow_codes)
        fx = _Collect(batch)
        for c, tag, t in zip(codes.tolist(), tags, timers["timestamp"].tolist(), strict=True):
            if not slow[c]:
                continue
            fx.key = batch.keys[c]
            st = states[c]
            if tag == _EVICT:
                self.evicted(fx, st)
            elif (cid := Joiner.retry.name_of(tag)) is not None:
                self.retried(fx, st, cid)
            elif (cid := Joiner.give_up.name_of(tag)) is not None:
                self.gave_up(fx, st, cid, t)
        self._save(batch, states)
        fx.flush()

    # ---- state rows <-> JoinKey, for ids run by the rules --------------------------------
    @staticmethod
    def _states(
        batch: Batch, old: pd.DataFrame, o_codes: np.ndarray, codes: np.ndarray
    ) -> dict[int, JoinKey]:
        states = {int(c): JoinKey() for c in codes.tolist()}
        if len(old):
            for c, kind, cid, t, attempts, value in zip(
                o_codes.tolist(), *(old[k].tolist() for k in _COLUMNS), strict=True
            ):
                st = states.get(c)
                if st is None:
                    continue
                if kind == _QUERY:
                    st.query, st.query_ts = _loads(value), t
                else:
                    st.waiting[cid] = [_loads(value), attempts]
        return states

    def _save(self, batch: Batch, states: dict[int, JoinKey]) -> None:
        """The ids' rows and holds, as :meth:`Joiner._save` (an id with nothing keeps no rows)."""
        rows: list[tuple[int, int, str, int, int, bytes]] = []
        for c, st in states.items():
            if st.query is not None:
                rows.append((c, _QUERY, "", st.query_ts, 0, _dumps(st.query)))  # type: ignore[arg-type]
            rows += [
                (c, _CLICK, cid, click[self.cfg.ts_field], attempts, _dumps(click))
                for cid, (click, attempts) in st.waiting.items()
            ]
        codes = np.fromiter(states, np.int64, len(states))
        frame = pd.DataFrame(rows, columns=["code", *_COLUMNS])
        frame.insert(0, "key", batch.key_column(frame.pop("code").to_numpy(np.int64)))
        batch.set_state(
            frame.astype({"kind": "int8", "ts": "int64", "attempts": "int64"}),
            keys=batch.key_column(codes),
        )
        batch.hold_watermark(batch.key_column(codes), [self.hold(st) for st in states.values()])


class _Collect:
    """:class:`~.joiner.KeyEffects` of the columnar joiner: productions and timer changes
    collected in order, handed to the batch in runs (:meth:`flush`)."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.key: Any = None
        self.now = batch.now
        self.prods: list[tuple[str, Any, dict[str, Any], int, str, bool]] = []
        self.ops: list[tuple[str, Any, str, int, TimeDomain]] = []

    def produce(
        self, stream: str, value: dict[str, Any], timestamp: int, once_id: str, once_tentative: bool
    ) -> None:
        self.prods.append((stream, self.key, value, timestamp, once_id, once_tentative))

    def set_timer(self, family: str, name: str, timestamp: int) -> None:
        spec = _FAMILIES[family]
        self.ops.append(("set", self.key, spec.tag(name), timestamp, spec.domain))

    def delete_timer(self, family: str, name: str) -> None:
        self.ops.append(("delete", self.key, _FAMILIES[family].tag(name), 0, _LW))

    def flush(self) -> None:
        """Productions per stream run (per key their order is kept), then timer changes in order."""
        b = self.batch
        for run in _runs(self.prods, lambda p: p[0]):
            b.produce(
                run[0][0],
                [p[2] for p in run],
                keys=[p[1] for p in run],
                timestamps=np.array([p[3] for p in run], np.int64),
                once_ids=[p[4] for p in run],
                once_tentative=[p[5] for p in run],
            )
        for run in _runs(self.ops, lambda o: (o[0], o[4])):
            if run[0][0] == "set":
                b.set_timers(
                    [o[1] for o in run],
                    [o[2] for o in run],
                    np.array([o[3] for o in run], np.int64),
                    run[0][4],
                )
            else:
                b.delete_timers([o[1] for o in run], [o[2] for o in run])
        self.prods, self.ops = [], []


def _runs(items: list[Any], by: Any) -> list[list[Any]]:
    """``items`` cut into maximal runs of equal ``by(item)``, in order."""
    out: list[list[Any]] = []
    for it in items:
        if out and by(out[-1][0]) == by(it):
            out[-1].append(it)
        else:
            out.append([it])
    return out


__all__ = ["ColumnarJoiner", "PhotonConfig"]
