"""``ColumnarModelCalculator``: ``model.py``'s ``ModelCalculator`` on the columnar path
(``millwheel/_columnar.py``).

The same rule (:meth:`~computations.model.ModelCalculator.learn`: a window learnt into the
key's seasonal model, the production of the window with the prediction made before it and
the model's snapshot), the same productions — values, timestamps and ids, per key in the
same order — over a micro-batch of many queries per call. The rule runs window by window (a
model is an EWMA: each window's prediction depends on every window before it); what the
columnar path saves is the per-record envelope around it.

State rows ``(key, data)``: the key's model (a plain dict), pickled.

>>> from millwheel.testing import Harness
>>> h = Harness.for_computation(ColumnarModelCalculator, inputs={"w": lambda r: r.value["key"]},
...                             outputs=["window_models"], params={"day_ms": 6_000, "slot_ms": 1_000, "warmup_windows": 4})
>>> counts = [10, 20, 30, 30, 20, 10] * 3 + [40]
>>> h.inject("w", [h.record({"key": "cats", "window_start": i * 1000, "count": c}, (i + 1) * 1000)
...                for i, c in enumerate(counts)])
>>> h.finish("w")
>>> out = h.run().values("window_models")
>>> [round(m["expected"]) for m in out[-7:]]   # learnt the seasonal pattern (smoothed)
[12, 19, 27, 27, 20, 12, 12]
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pandas as pd

from millwheel import Batch, ColumnarComputation

from .model import ModelCalculator


class ColumnarModelCalculator(ModelCalculator, ColumnarComputation):
    """``ModelCalculator`` over a batch of many keys per call; see the module docstring."""

    record_columns = ("key", "timestamp", "value")

    def process_batch(self, batch: Batch) -> None:
        r = batch.records
        old = batch.state
        stored: dict[int, Any] = (
            dict(zip(batch.key_codes(old["key"]).tolist(), old["data"].tolist(), strict=True))
            if len(old)
            else {}
        )
        models: dict[int, dict[str, Any]] = {}
        keys, values, stamps = [], [], []
        learn = self.learn
        for c, ts, window in zip(
            batch.key_codes(r["key"]).tolist(),
            r["timestamp"].tolist(),
            r["value"].tolist(),
            strict=True,
        ):
            model = models.get(c)
            if model is None:
                data = stored.get(c)
                model = models[c] = self.new() if data is None else pickle.loads(data)
            key = batch.keys[c]
            value, at = learn(key, model, window, ts)
            keys.append(key)
            values.append(value)
            stamps.append(at)
        kept = np.fromiter(models, np.int64, len(models))
        batch.set_state(
            pd.DataFrame(
                {
                    "key": batch.key_column(kept),
                    "data": [
                        pickle.dumps(models[c], pickle.HIGHEST_PROTOCOL) for c in kept.tolist()
                    ],
                }
            ),
            keys=batch.key_column(kept),
        )
        batch.produce(self.output, values, keys=keys, timestamps=np.array(stamps, np.int64))
