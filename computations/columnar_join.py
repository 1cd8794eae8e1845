"""``ColumnarWindowedJoin``: ``join.py``'s ``WindowedJoin`` on the columnar path (``millwheel/_columnar.py``).

The same rules (:class:`~computations.join.JoinWindow`: a record matched at once against
the other side's buffered records of its key, a left record's result emitted once the
low watermark closes its window, the ``close`` timer and the hold), the same
productions — values, timestamps and ids, per key in the same order — over a
micro-batch of many keys per call: one call for the batch's records, one for its due
timers, the state of the batch's keys read and written in bulk, the timers, holds and
productions handed over as columns. Each key's records still go through the rules one
by one (the matching is a scan of the key's buffered records: there is no batch-wide
vectorised form of it that keeps the per-record form's order of matches and ids).

State rows ``(key, data)``: the key's :class:`~computations.join.JoinBuffer`, pickled.

>>> from millwheel.testing import Harness
>>> h = Harness.for_computation(ColumnarWindowedJoin, inputs={"views": lambda r: r.value["id"], "clicks": lambda r: r.value["id"]},
...                             outputs=["joined"], params={"left": "views", "before_ms": 0, "after_ms": 1_000, "how": "left"})
>>> h.inject("clicks", [h.record({"id": "a", "x": 1}, 1_400)])
>>> h.inject("views", [h.record({"id": "a"}, 1_000), h.record({"id": "b"}, 1_100)])
>>> h.finish("views"); h.finish("clicks")
>>> [(v["key"], v["right"]) for v in h.run().values("joined")]
[('a', {'id': 'a', 'x': 1}), ('b', None)]
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pandas as pd

from millwheel import Batch, ColumnarComputation

from .join import JoinBuffer, JoinWindow, buffer_of


class ColumnarWindowedJoin(JoinWindow, ColumnarComputation):
    """``WindowedJoin`` over a batch of many keys per call; see the module docstring."""

    record_columns = ("key", "id", "timestamp", "stream", "value")

    def process_batch(self, batch: Batch) -> None:
        r = batch.records
        codes = batch.key_codes(r["key"])
        states = self._states(batch)
        for c, rid, ts, stream, value in zip(
            codes.tolist(),
            r["id"].tolist(),
            r["timestamp"].tolist(),
            r["stream"].tolist(),
            r["value"].tolist(),
            strict=True,
        ):
            st = states.get(c)
            if st is None:
                st = states[c] = JoinBuffer()
            self.arrived(st, stream, ts, rid, value)
        self._save(batch, states, _Collect(batch))

    def process_timers(self, batch: Batch, timers: pd.DataFrame) -> None:
        states = self._states(batch)
        fx = _Collect(batch)
        for c in dict.fromkeys(
            batch.key_codes(timers["key"]).tolist()
        ):  # one "close" timer per key
            fx.key = batch.keys[c]
            st = states.get(c)
            if st is None:
                st = states[c] = JoinBuffer()
            self.close(fx, st, batch.low_watermark)
        self._save(batch, states, fx)

    @staticmethod
    def _states(batch: Batch) -> dict[int, JoinBuffer]:
        """The keys' :class:`~computations.join.JoinBuffer` by key code (pickled in the
        ``data`` column; a run from before the state was typed stored dicts, converted)."""
        old = batch.state
        if not len(old):
            return {}
        return {
            c: buffer_of(pickle.loads(d))
            for c, d in zip(batch.key_codes(old["key"]).tolist(), old["data"].tolist(), strict=True)
        }

    def _save(self, batch: Batch, states: dict[int, JoinBuffer], fx: _Collect) -> None:
        kept = []
        for c, st in states.items():
            fx.key = batch.keys[c]
            if self.settle(fx, st):
                kept.append(c)
        rows = pd.DataFrame(
            {
                "key": batch.key_column(np.array(kept, np.int64)),
                "data": [pickle.dumps(states[c], pickle.HIGHEST_PROTOCOL) for c in kept],
            }
        )
        batch.set_state(rows, keys=batch.key_column(np.fromiter(states, np.int64, len(states))))
        fx.flush(self.output)


class _Collect:
    """:class:`~computations.join.JoinEffects` collected as columns, handed to the batch by :meth:`flush`."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.key: Any = None
        self.prods: list[tuple[Any, dict[str, Any], int]] = []
        self.closes: dict[Any, int | None] = {}
        self.holds: dict[Any, int | None] = {}

    def produce(self, value: dict[str, Any], timestamp: int) -> None:
        self.prods.append((self.key, value, timestamp))

    def close_at(self, timestamp: int | None) -> None:
        self.closes[self.key] = timestamp

    def hold(self, timestamp: int | None) -> None:
        self.holds[self.key] = timestamp

    def flush(self, output: str) -> None:
        b = self.batch
        if self.prods:
            b.produce(
                output,
                [p[1] for p in self.prods],
                keys=[p[0] for p in self.prods],
                timestamps=np.array([p[2] for p in self.prods], np.int64),
            )
        sets = [(k, t) for k, t in self.closes.items() if t is not None]
        if sets:
            b.set_timers(
                [k for k, _ in sets],
                ["close"] * len(sets),
                np.array([t for _, t in sets], np.int64),
            )
        gone = [k for k, t in self.closes.items() if t is None]
        if gone:
            b.delete_timers(gone, ["close"] * len(gone))
        if self.holds:
            b.hold_watermark(list(self.holds), list(self.holds.values()))
