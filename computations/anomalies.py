"""Zeitgeist's anomaly detectors: ``SpikeDetector`` and ``DipDetector`` (MillWheel §2, §4.6, Fig. 9).

Both compare a query's traffic in a 1-second bucket with the model's prediction
(``ModelCalculator``) and follow Fig. 9: a per-key *confidence* is updated for each bucket
and an anomaly is produced while ``confidence > confidence_threshold``
(``kConfidenceThreshold``). Confidence is the number of consecutive anomalous buckets, so
``confidence_threshold=1`` asks for two in a row (§2: "consistently different over a
non-trivial number of buckets"). One anomaly record is produced per anomalous bucket
past the threshold, to the ``anomalies`` stream:

    {"query", "kind": "spike"|"dip", "window_start", "window_end", "actual", "expected",
     "confidence", "detected_at", "low_watermark"}

``detected_at`` is the wall time (``self.now``) and ``low_watermark`` the input low
watermark at production, for measuring delay and for checking the dip rule.

* :class:`SpikeDetector` uses **no timers** (§4.6: "Zeitgeist can detect spiking queries
  without timers, since a spike may be evident even without a complete picture of the
  data"): it counts the raw query events as they arrive and fires as soon as the running
  count of a bucket exceeds the threshold, once per bucket; late data could only add to it.
* :class:`DipDetector` uses a **low-watermark timer per bucket** (§4.6: "set a low
  watermark timer for the end of a given time bucket, and report a dip if the observed
  traffic falls well below the model's prediction"; §2 on telling delayed data from
  missing data): a bucket is judged only once the low watermark has passed its end.
  Timers fire in timestamp order per key (§4.6), so confidence runs over buckets in
  time order even if windows arrive out of order.

Thresholds are a frozen :class:`Thresholds` (Poisson-style: a ratio *and* a z-score, so
small counts do not trigger on noise):

* spike if ``count > max(spike_ratio * E, E + spike_z * sqrt(E), spike_min_count)``;
* dip if ``E >= dip_min_expected`` and ``count < min(dip_ratio * E, E - dip_z * sqrt(E))``.

>>> Thresholds().is_spike(40, expected=10.0), Thresholds().is_spike(20, expected=10.0)
(True, False)
>>> Thresholds().is_dip(1, expected=20.0), Thresholds().is_dip(1, expected=4.0)
(True, False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from computations.model import expected_count
from millwheel import Computation, Record, Timer, TopologyError

ANOMALIES = "anomalies"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a bucket is anomalous, and how many in a row make an anomaly (Fig. 9)."""

    spike_ratio: float = 2.5
    spike_z: float = 4.0
    spike_min_count: int = 10
    dip_ratio: float = 0.4
    dip_z: float = 2.5
    dip_min_expected: float = 12.0
    #: Fig. 9's ``kConfidenceThreshold``: produce while confidence (consecutive anomalous buckets) exceeds it
    confidence_threshold: int = 1

    def __post_init__(self) -> None:
        if self.spike_ratio <= 1 or not 0 < self.dip_ratio < 1:
            msg = f"Thresholds: need spike_ratio > 1 and 0 < dip_ratio < 1, got {self.spike_ratio}, {self.dip_ratio}"
            raise TopologyError(msg)
        if self.confidence_threshold < 0:
            msg = f"Thresholds: confidence_threshold must be >= 0, got {self.confidence_threshold}"
            raise TopologyError(msg)

    def spike_threshold(self, expected: float) -> float:
        return max(
            self.spike_ratio * expected,
            expected + self.spike_z * math.sqrt(expected),
            self.spike_min_count,
        )

    def is_spike(self, count: int, *, expected: float) -> bool:
        return count > self.spike_threshold(expected)

    def is_dip(self, count: int, *, expected: float) -> bool:
        if expected < self.dip_min_expected:
            return False
        return count < min(self.dip_ratio * expected, expected - self.dip_z * math.sqrt(expected))


def _anomaly(
    comp: Computation,
    kind: str,
    start: int,
    window_ms: int,
    actual: int,
    expected: float,
    confidence: int,
) -> dict[str, Any]:
    return {
        "query": comp.key,
        "kind": kind,
        "window_start": start,
        "window_end": start + window_ms,
        "actual": actual,
        "expected": round(expected, 3),
        "confidence": confidence,
        "detected_at": comp.now,
        "low_watermark": comp.low_watermark,
    }


class SpikeDetector(Computation):
    """Spikes from running bucket counts, without timers (§4.6).

    Inputs, both keyed by query: the raw query events (any value without
    ``"window_start"``), counted into ``window_ms`` buckets as they arrive, and
    ``ModelCalculator``'s ``window_models`` records, whose ``model`` snapshot predicts
    the buckets still filling. State keeps the latest model and the last ``keep_windows``
    buckets' counts; there is nothing to wait for, so there are no timers.

    Buckets counted while the key has no model yet are judged when a model arrives: a
    replay that reads the raw events faster than the model stream follows (Spark reading
    a whole log directory) still finds its spikes. They are kept until then (at most
    ``max_unjudged``), so memory grows with that skew (§8.4).

    >>> from millwheel.testing import Harness
    >>> from computations.model import new_model
    >>> model = new_model(60_000, 3_000); model.update(level=5.0, windows=20)
    >>> h = Harness.for_computation(SpikeDetector, outputs=["anomalies"],
    ...     inputs={"queries": lambda r: r.value["query"], "window_models": lambda r: r.value["key"]})
    >>> h.inject("window_models", [h.record({"key": "cats", "window_start": 0, "model": model}, 1_000)])
    >>> h.inject("queries", [h.record({"query": "cats"}, 10_000 + i * 20) for i in range(40)])
    >>> h.run().values("anomalies")          # first bucket: confidence 1, nothing reported
    []
    >>> h.inject("queries", [h.record({"query": "cats"}, 11_000 + i * 20) for i in range(40)])
    >>> [(a["kind"], a["window_start"], a["actual"], a["confidence"]) for a in h.run().values("anomalies")]
    [('spike', 11000, 14, 2)]
    """

    def __init__(
        self,
        output: str = ANOMALIES,
        thresholds: Thresholds | None = None,
        window_ms: int = 1_000,
        keep_windows: int = 30,
        max_unjudged: int = 3_600,
    ) -> None:
        self.output = output
        self.thresholds = thresholds or Thresholds()
        self.window_ms = window_ms
        self.keep_windows = keep_windows
        self.max_unjudged = max_unjudged

    def process_record(self, record: Record) -> None:
        value = record.value
        s = self.state.get() or {
            "model": None,
            "counts": {},
            "flagged": set(),
            "fired": set(),
            "newest": None,
            "unjudged": set(),
        }
        if "window_start" in value:  # a model update from ModelCalculator
            if value.get("model") is not None:
                s["model"] = value["model"]
                for b in sorted(s["unjudged"]):  # counted before there was a model: judge now
                    self._judge(s, b)
                s["unjudged"] = set()
                self.state.set(s)
            return
        w = self.window_ms
        bucket = record.timestamp // w * w
        counts = s["counts"]
        count = counts.get(bucket, 0) + 1
        counts[bucket] = count
        if s["newest"] is None or bucket > s["newest"]:
            s["newest"] = bucket
            self._collect(s)
        if s["model"] is None:
            s["unjudged"].add(bucket)
            if len(s["unjudged"]) > self.max_unjudged:
                s["unjudged"].discard(min(s["unjudged"]))
        else:
            self._judge(s, bucket)
        self.state.set(s)

    def _judge(self, s: dict[str, Any], bucket: int) -> None:
        if bucket in s["flagged"] or bucket not in s["counts"]:
            return
        expected = expected_count(s["model"], bucket)
        if expected is not None and self.thresholds.is_spike(
            s["counts"][bucket], expected=expected
        ):
            s["flagged"].add(bucket)
            self._fire(s, bucket)

    def _fire(self, s: dict[str, Any], bucket: int) -> None:
        """Bucket ``bucket`` just became anomalous: fire it and any later run it completes."""
        w, flagged, fired = self.window_ms, s["flagged"], s["fired"]
        confidence = 1
        b = bucket - w
        while b in flagged:
            confidence += 1
            b -= w
        b = bucket
        while b in flagged:  # buckets flagged earlier, out of order, gain confidence too
            if confidence > self.thresholds.confidence_threshold and b not in fired:
                fired.add(b)
                expected = expected_count(s["model"], b) or 0.0
                self.produce(
                    self.output,
                    _anomaly(self, "spike", b, w, s["counts"].get(b, 0), expected, confidence),
                )
            b += w
            confidence += 1

    def _collect(self, s: dict[str, Any]) -> None:
        horizon = s["newest"] - self.keep_windows * self.window_ms
        if min(s["counts"]) < horizon:
            keep = s["unjudged"]
            s["counts"] = {b: c for b, c in s["counts"].items() if b >= horizon or b in keep}
            s["flagged"] = {b for b in s["flagged"] if b >= horizon}
            s["fired"] = {b for b in s["fired"] if b >= horizon}


class DipDetector(Computation):
    """Dips from complete buckets only: a low-watermark timer per bucket (§4.6, Fig. 9).

    Consumes ``ModelCalculator``'s ``window_models`` records (``{"key", "window_start",
    "count", "expected"}``, keyed by query). Each window is stored with a low-watermark
    timer at its end; when the timer fires, the input low watermark has passed the
    bucket, so the count is final (§2, §4.5), and the bucket is judged against the
    model's prediction, updating the confidence as in Fig. 9's
    ``DipDetector::ProcessRecord``.

    >>> from millwheel.testing import Harness
    >>> h = Harness.for_computation(DipDetector, inputs={"w": lambda r: r.value["key"]}, outputs=["anomalies"])
    >>> counts = [20, 20, 2, 1, 1, 20]
    >>> h.inject("w", [h.record({"key": "cats", "window_start": i * 1000, "count": c, "expected": 20.0},
    ...                         (i + 1) * 1000) for i, c in enumerate(counts)])
    >>> h.advance_watermark("w", 3_500)
    >>> h.run().values("anomalies")    # bucket 3000 is not complete yet: nothing is judged
    []
    >>> h.advance_watermark("w", 4_000)
    >>> [(a["kind"], a["window_start"], a["confidence"], a["low_watermark"]) for a in h.run().values("anomalies")]
    [('dip', 3000, 2, 4000)]
    >>> h.finish("w")
    >>> [a["window_start"] for a in h.run().values("anomalies")]
    [4000]
    >>> [a["window_start"] for a in h.values("anomalies")]     # every run's
    [3000, 4000]
    """

    def __init__(
        self, output: str = ANOMALIES, thresholds: Thresholds | None = None, window_ms: int = 1_000
    ) -> None:
        self.output = output
        self.thresholds = thresholds or Thresholds()
        self.window_ms = window_ms

    def process_record(self, record: Record) -> None:
        window = record.value
        start = window["window_start"]
        s = self.state.get() or {"pending": {}, "last": None, "confidence": 0}
        s["pending"][start] = (window["count"], window.get("expected"))
        self.state.set(s)
        # Fig. 9 / §4.6: judge the bucket only once the low watermark has passed its end
        self.set_timer(f"dip{start}", start + self.window_ms)

    def process_timer(self, timer: Timer) -> None:
        w = self.window_ms
        start = timer.timestamp - w
        s = self.state.get() or {"pending": {}, "last": None, "confidence": 0}
        count, expected = s["pending"].pop(start, (None, None))
        if s["last"] is not None and s["last"] != start - w:
            s["confidence"] = 0  # a gap: the run of anomalous buckets is broken
        s["last"] = start
        if (
            count is not None
            and expected is not None
            and self.thresholds.is_dip(count, expected=expected)
        ):
            s["confidence"] += 1  # UpdateConfidence(prediction, actual)
            if s["confidence"] > self.thresholds.confidence_threshold:
                self.produce(
                    self.output,
                    _anomaly(self, "dip", start, w, count, expected, s["confidence"]),
                    timestamp=timer.timestamp,
                )
        else:
            s["confidence"] = 0
        if not s["pending"] and s["confidence"] == 0:
            self.state.clear()  # nothing to remember: a quiet key keeps nothing
        else:
            self.state.set(s)
