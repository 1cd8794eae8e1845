"""``DipDetector``: flags windows whose count falls well below the model's prediction (MillWheel Fig. 9).

The model is an exponentially weighted moving average of the key's past window counts.
Confidence grows by one for each consecutive window below ``dip_ratio`` × prediction and
resets otherwise; once it exceeds ``confidence_threshold`` a dip is produced (Fig. 9's
``kConfidenceThreshold``). Windows arrive complete because ``WindowCounter`` only emits a
bucket once the low watermark has passed it.

>>> from millwheel.testing import Harness
>>> h = Harness.for_computation(DipDetector, inputs={"w": lambda r: r.value["key"]}, outputs=["dips"],
...                             params={"confidence_threshold": 1, "warmup_windows": 3})
>>> counts = [10, 10, 10, 10, 1, 1, 10]
>>> h.inject("w", [h.record({"key": "cats", "window_start": i * 1000, "count": c}, (i + 1) * 1000)
...                for i, c in enumerate(counts)])
>>> h.finish("w"); h.run()
>>> [(d["window_start"], d["actual"]) for d in h.values("dips")]
[(4000, 1)]
"""

from __future__ import annotations

from millwheel import Computation, Record


class DipDetector(Computation):
    """Consumes ``{"key", "window_start", "count"}`` windows; produces dips."""

    def __init__(
        self,
        output: str = "dips",
        dip_ratio: float = 0.5,
        confidence_threshold: int = 1,
        alpha: float = 0.2,
        warmup_windows: int = 5,
    ) -> None:
        self.output = output
        self.dip_ratio = dip_ratio
        self.confidence_threshold = confidence_threshold
        self.alpha = alpha
        self.warmup_windows = warmup_windows

    def process_record(self, record: Record) -> None:
        window = record.value
        actual = window["count"]
        s = self.state.get() or {"model": None, "seen": 0, "confidence": 0}
        prediction = s["model"]
        if prediction is not None and s["seen"] >= self.warmup_windows and actual < self.dip_ratio * prediction:
            s["confidence"] += 1
            if s["confidence"] == self.confidence_threshold:  # once per dip episode
                self.produce(
                    self.output,
                    {
                        "key": self.key,
                        "window_start": window["window_start"],
                        "actual": actual,
                        "predicted": prediction,
                        "confidence": s["confidence"],
                    },
                    timestamp=record.timestamp,
                )
        else:
            s["confidence"] = 0
            # the model learns from normal traffic only, so a long dip does not become the norm
            s["model"] = actual if prediction is None else (1 - self.alpha) * prediction + self.alpha * actual
        s["seen"] += 1
        self.state.set(s)
