"""``ColumnarSpikeDetector`` and ``ColumnarDipDetector``: ``anomalies.py``'s detectors on the
columnar path (``millwheel/_columnar.py``).

The same rules (:class:`~computations.anomalies.SpikeRules`: a raw event counted into its
bucket and judged against the key's model, a model update judging the buckets counted
before it, the confidence run of Fig. 9), the same productions — values, timestamps and
ids, per key in the same order — over a micro-batch of many queries per call. What the
columnar path saves is the per-record envelope: dedup, the late rule, the state's decode
and encode and a record object per event, which cost the per-record detector far more
than the rule itself on a busy stream (the main job's first batch of raw events). The
rule still runs event by event (the running count decides *when* a bucket fires, and so
the ``actual`` it reports), on plain Python values read from a few columns; a value is
never decoded whole: a raw event's ``value.window_start`` and ``value.model`` are null
(a stream that declares its fields carries neither), a model update's are read from its
pickled value.

State rows ``(key, data)``: the key's :class:`~computations.anomalies.SpikeWatch`, pickled.

``ColumnarDipDetector`` is the same for :class:`~computations.anomalies.DipRules`: a batch's
windows kept with a low-watermark timer each (timers as columns), the due buckets judged key
by key in timestamp order; state rows ``(key, data)``, the key's
:class:`~computations.anomalies.DipRun` pickled, none for a key with nothing to keep.

>>> from millwheel.testing import Harness
>>> from computations.model import new_model
>>> model = new_model(60_000, 3_000); model.update(level=5.0, windows=20)
>>> h = Harness.for_computation(ColumnarSpikeDetector, outputs=["anomalies"],
...     inputs={"queries": lambda r: r.value["query"], "window_models": lambda r: r.value["key"]})
>>> h.inject("window_models", [h.record({"key": "cats", "window_start": 0, "model": model}, 1_000)])
>>> h.inject("queries", [h.record({"query": "cats"}, 10_000 + i * 20) for i in range(80)])
>>> [(a["kind"], a["window_start"], a["actual"], a["confidence"]) for a in h.run().values("anomalies")]
[('spike', 11000, 14, 2)]
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pandas as pd

from millwheel import Batch, ColumnarComputation

from .anomalies import DipRules, DipRun, SpikeRules, SpikeWatch, watch_of


class ColumnarSpikeDetector(SpikeRules, ColumnarComputation):
    """``SpikeDetector`` over a batch of many keys per call; see the module docstring."""

    record_columns = ("key", "timestamp", "value.window_start", "value.model")

    def process_batch(self, batch: Batch) -> None:
        r = batch.records
        codes = batch.key_codes(r["key"]).tolist()
        stamps = r["timestamp"].tolist()
        starts = r["value.window_start"].tolist()
        models = r["value.model"].tolist()
        stored = _pickled(batch)
        fx = _Collect(batch)
        states: dict[int, SpikeWatch] = {}
        counted, arrived = self.counted, self.model_arrived
        key = -1
        st = SpikeWatch()
        for c, ts, start, model in zip(codes, stamps, starts, models, strict=True):
            if c != key:
                key, fx.key = c, batch.keys[c]
                st = states.get(c)  # type: ignore[assignment]
                if st is None:
                    st = watch_of(stored.get(c))
            fx.at = ts
            if _null(start):  # a raw event (as ``anomalies.is_model_update`` tells them apart)
                counted(fx, st, ts)
                states[c] = st
            elif not _null(model):
                arrived(fx, st, model)
                states[c] = st
        if states:
            _save(batch, states, set(states), set(states))
        fx.flush()


def _null(v: Any) -> bool:
    """A null of a ``value.<field>`` column: ``None``, or pandas' ``NA`` / NaN of a typed one."""
    return v is None or v is pd.NA or (type(v) is float and v != v)


class _Collect:
    """What :class:`~computations.anomalies.SpikeRules` needs of ``fx``: the key, the call's
    wall time and low watermark, and productions collected as columns, each stamped with the
    record being processed (``at``), as a per-record computation's ``produce`` is."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.now = batch.now
        self.low_watermark = batch.low_watermark
        self.key: Any = None
        self.at = 0
        self.prods: dict[str, list[tuple[Any, Any, int]]] = {}

    def produce(self, stream: str, value: Any, timestamp: int | None = None) -> None:
        self.prods.setdefault(stream, []).append(
            (self.key, value, self.at if timestamp is None else timestamp)
        )

    def flush(self) -> None:
        for stream, prods in self.prods.items():
            self.batch.produce(
                stream,
                [p[1] for p in prods],
                keys=[p[0] for p in prods],
                timestamps=np.array([p[2] for p in prods], np.int64),
            )


class ColumnarDipDetector(DipRules, ColumnarComputation):
    """``DipDetector`` over a batch of many keys per call; see the module docstring."""

    record_columns = ("key", "value")

    def process_batch(self, batch: Batch) -> None:
        states = _pickled(batch)
        timers: dict[tuple[int, int], int] = {}  # (key code, start) -> due; a start again replaces
        w, arrived = self.window_ms, self.window_arrived
        for c, window in zip(
            batch.key_codes(batch.records["key"]).tolist(),
            batch.records["value"].tolist(),
            strict=True,
        ):
            st = states.get(c)
            if st is None:
                st = states[c] = DipRun()
            start = arrived(st, window)
            timers[(c, start)] = start + w
        _save(batch, states, set(states), set(states))
        codes = np.fromiter((c for c, _ in timers), np.int64, len(timers))
        batch.set_timers(
            batch.key_column(codes),
            [DipRules.judge.tag(str(start)) for _, start in timers],
            np.fromiter(timers.values(), np.int64, len(timers)),
        )

    def process_timers(self, batch: Batch, timers: pd.DataFrame) -> None:
        states = _pickled(batch)
        fx = _Collect(batch)
        keep, touched = set(), set()
        w, complete, name_of = self.window_ms, self.bucket_complete, DipRules.judge.name_of
        for c, tag, at in zip(
            batch.key_codes(timers["key"]).tolist(),
            timers["tag"].tolist(),
            timers["timestamp"].tolist(),
            strict=True,
        ):
            if name_of(tag) is None:
                continue  # not this computation's (it sets no other)
            fx.key = batch.keys[c]
            touched.add(c)
            st = states.get(c)
            if st is None:
                st = states[c] = DipRun()
            if complete(fx, st, at - w, at):
                keep.add(c)
            else:
                keep.discard(c)
        _save(batch, states, keep, touched)
        fx.flush()


def _pickled(batch: Batch) -> dict[int, Any]:
    """The call's keys' state, unpickled, by key code."""
    old = batch.state
    if not len(old):
        return {}
    return {
        c: pickle.loads(d)
        for c, d in zip(batch.key_codes(old["key"]).tolist(), old["data"].tolist(), strict=True)
    }


def _save(batch: Batch, states: dict[int, Any], keep: set[int], keys: set[int]) -> None:
    """The state of the keys ``keys``: their ``states`` pickled for those in ``keep``, none
    for the others."""
    kept = np.fromiter(sorted(keep), np.int64, len(keep))
    batch.set_state(
        pd.DataFrame(
            {
                "key": batch.key_column(kept),
                "data": [pickle.dumps(states[c], pickle.HIGHEST_PROTOCOL) for c in kept.tolist()],
            }
        ),
        keys=batch.key_column(np.fromiter(keys, np.int64, len(keys))),
    )
