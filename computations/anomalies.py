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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from computations._untyped import PickledBefore, move_untyped_timers, untyped_tag
from computations.model import expected_count
from millwheel import (
    Computation,
    ComputationOptions,
    DataclassCodec,
    Record,
    Timer,
    TimerFamily,
    TopologyError,
)

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
    comp: Any,
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


@dataclass
class SpikeWatch:
    """A :class:`SpikeDetector` key's state (pickled, the default codec: it holds sets and the
    model's snapshot)."""

    #: the latest model snapshot (``ModelCalculator``'s), or ``None`` before the first
    model: dict[str, Any] | None = None
    #: events so far per bucket start, for the last ``keep_windows`` buckets
    counts: dict[int, int] = field(default_factory=dict)
    #: buckets found anomalous
    flagged: set[int] = field(default_factory=set)
    #: buckets reported (an anomaly produced)
    fired: set[int] = field(default_factory=set)
    #: the newest bucket counted
    newest: int | None = None
    #: buckets counted while there was no model yet, judged when one arrives
    unjudged: set[int] = field(default_factory=set)


@dataclass
class DipRun:
    """A :class:`DipDetector` key's state."""

    #: windows waiting for their bucket to complete: start -> ``[count, expected]``
    pending: dict[int, list[Any]] = field(default_factory=dict)
    #: the last bucket judged
    last: int | None = None
    #: Fig. 9's confidence: how many anomalous buckets in a row
    confidence: int = 0


class SpikeRules:
    """The spike rule of one key, shared by :class:`SpikeDetector` and
    :class:`~computations.columnar_anomalies.ColumnarSpikeDetector`: the settings, and what
    a model update and a raw event do to a key's :class:`SpikeWatch`.

    Each rule acts through ``fx``: the key's computation (per record) or the columnar
    form's collector, with ``key``, ``now`` and ``low_watermark`` attributes and
    ``produce(stream, value)`` (timestamped with the record being processed)."""

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

    def model_arrived(self, fx: Any, st: SpikeWatch, model: dict[str, Any]) -> None:
        """A model snapshot from ``ModelCalculator``: kept, and the buckets counted before
        there was one judged now, oldest first."""
        st.model = model
        for b in sorted(st.unjudged):
            self._judge(fx, st, b)
        st.unjudged = set()

    def counted(self, fx: Any, st: SpikeWatch, timestamp: int) -> None:
        """A raw query event at ``timestamp``: counted into its bucket, which is judged at
        once if there is a model (else kept to judge when one arrives)."""
        w = self.window_ms
        bucket = timestamp // w * w
        st.counts[bucket] = st.counts.get(bucket, 0) + 1
        if st.newest is None or bucket > st.newest:
            st.newest = bucket
            self._collect(st)
        if st.model is None:
            st.unjudged.add(bucket)
            if len(st.unjudged) > self.max_unjudged:
                st.unjudged.discard(min(st.unjudged))
        else:
            self._judge(fx, st, bucket)

    def _judge(self, fx: Any, st: SpikeWatch, bucket: int) -> None:
        if bucket in st.flagged or bucket not in st.counts:
            return
        expected = expected_count(st.model, bucket)
        if expected is not None and self.thresholds.is_spike(st.counts[bucket], expected=expected):
            st.flagged.add(bucket)
            self._fire(fx, st, bucket)

    def _fire(self, fx: Any, st: SpikeWatch, bucket: int) -> None:
        """Bucket ``bucket`` just became anomalous: fire it and any later run it completes."""
        w, flagged, fired = self.window_ms, st.flagged, st.fired
        confidence = 1
        b = bucket - w
        while b in flagged:
            confidence += 1
            b -= w
        b = bucket
        while b in flagged:  # buckets flagged earlier, out of order, gain confidence too
            if confidence > self.thresholds.confidence_threshold and b not in fired:
                fired.add(b)
                expected = expected_count(st.model, b) or 0.0
                fx.produce(
                    self.output,
                    _anomaly(fx, "spike", b, w, st.counts.get(b, 0), expected, confidence),
                )
            b += w
            confidence += 1

    def _collect(self, st: SpikeWatch) -> None:
        horizon = st.newest - self.keep_windows * self.window_ms  # type: ignore[operator]
        if min(st.counts) < horizon:
            keep = st.unjudged
            st.counts = {b: c for b, c in st.counts.items() if b >= horizon or b in keep}
            st.flagged = {b for b in st.flagged if b >= horizon}
            st.fired = {b for b in st.fired if b >= horizon}


def is_model_update(value: Any) -> bool:
    """A ``window_models`` record (``ModelCalculator``'s): a mapping with a ``window_start``
    that is not ``None``. Anything else reaching a spike detector is a raw query event."""
    return isinstance(value, Mapping) and value.get("window_start") is not None


def watch_of(st: Any) -> SpikeWatch:
    """A key's stored state as a :class:`SpikeWatch` (state an older run stored as a dict is converted)."""
    if st is None:
        return SpikeWatch()
    if type(st) is dict:
        return SpikeWatch(**st)
    return st


class SpikeDetector(SpikeRules, Computation):
    """Spikes from running bucket counts, without timers (§4.6).

    Inputs, both keyed by query: the raw query events (any value that is not a model
    update, :func:`is_model_update`), counted into ``window_ms`` buckets as they arrive, and
    ``ModelCalculator``'s ``window_models`` records, whose ``model`` snapshot predicts
    the buckets still filling. State keeps the latest model and the last ``keep_windows``
    buckets' counts; there is nothing to wait for, so there are no timers.

    Buckets counted while the key has no model yet are judged when a model arrives: a
    replay that reads the raw events faster than the model stream follows (Spark reading
    a whole log directory) still finds its spikes. They are kept until then (at most
    ``max_unjudged``), so memory grows with that skew (§8.4).

    The rules are :class:`SpikeRules`; ``computations.columnar_anomalies.ColumnarSpikeDetector``
    runs them over a micro-batch of many keys, with the same productions.

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

    def watch(self) -> SpikeWatch:
        """The key's state (state an older run stored as a dict is converted)."""
        return watch_of(self.state.get())

    def process_record(self, record: Record) -> None:
        value = record.value
        if is_model_update(value):
            if value.get("model") is not None:
                st = self.watch()
                self.model_arrived(self, st, value["model"])
                self.state.set(st)
            return
        st = self.watch()
        self.counted(self, st, record.timestamp)
        self.state.set(st)


class DipRules:
    """The dip rule of one key, shared by :class:`DipDetector` and
    :class:`~computations.columnar_anomalies.ColumnarDipDetector`: a window kept until its
    bucket is complete, and a complete bucket judged (Fig. 9). ``fx`` as for
    :class:`SpikeRules`, its ``produce`` taking a ``timestamp``."""

    #: one timer per bucket, at its end; named by its start
    judge = TimerFamily(tag="dip")

    def __init__(
        self, output: str = ANOMALIES, thresholds: Thresholds | None = None, window_ms: int = 1_000
    ) -> None:
        self.output = output
        self.thresholds = thresholds or Thresholds()
        self.window_ms = window_ms

    def window_arrived(self, st: DipRun, window: Any) -> int:
        """A window from ``ModelCalculator`` kept to judge: returns its start (its timer is
        due at ``start + window_ms``)."""
        start = window["window_start"]
        st.pending[start] = [window["count"], window.get("expected")]
        return start

    def bucket_complete(self, fx: Any, st: DipRun, start: int, at: int) -> bool:
        """The bucket starting at ``start`` is complete (its timer fired at ``at``): judged,
        a dip produced while the confidence exceeds the threshold. Returns whether the key
        still has anything to keep."""
        w = self.window_ms
        count, expected = st.pending.pop(start, (None, None))
        if st.last is not None and st.last != start - w:
            st.confidence = 0  # a gap: the run of anomalous buckets is broken
        st.last = start
        if (
            count is not None
            and expected is not None
            and self.thresholds.is_dip(count, expected=expected)
        ):
            st.confidence += 1  # UpdateConfidence(prediction, actual)
            if st.confidence > self.thresholds.confidence_threshold:
                fx.produce(
                    self.output,
                    _anomaly(fx, "dip", start, w, count, expected, st.confidence),
                    timestamp=at,
                )
        else:
            st.confidence = 0
        return bool(st.pending) or st.confidence != 0


class DipDetector(DipRules, Computation):
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

    #: typed state; state stored untyped (pickled) by an older run is read too (``_untyped.py``)
    options = ComputationOptions(state_codec=PickledBefore(DataclassCodec(DipRun)))

    def run(self) -> DipRun:
        """The key's state; state an older run stored as a dict is converted, and its timers
        moved to the ``judge`` family."""
        st = self.state.get()
        if st is None:
            return DipRun()
        if type(st) is dict:
            move_untyped_timers(self, {"dip": self.judge})
            pending = {start: list(cv) for start, cv in st["pending"].items()}
            return DipRun(pending, st["last"], st["confidence"])
        return st

    def process_record(self, record: Record) -> None:
        st = self.run()
        start = self.window_arrived(st, record.value)
        self.state.set(st)
        # Fig. 9 / §4.6: judge the bucket only once the low watermark has passed its end
        self.judge.set(start + self.window_ms, name=str(start))

    def process_timer(self, timer: Timer) -> None:
        """Timers of the ``judge`` family; and one an older run set under its untyped tag
        (``"dip<start>"``), until the key's state is read once."""
        old = untyped_tag(timer.tag, ("dip",))
        if old is None:
            super().process_timer(timer)
        else:
            self.judged(str(old[1]), timer)

    @DipRules.judge.on_fire
    def judged(self, _name: str, timer: Timer) -> None:
        st = self.run()
        if self.bucket_complete(self, st, timer.timestamp - self.window_ms, timer.timestamp):
            self.state.set(st)
        else:
            self.state.clear()  # nothing to remember: a quiet key keeps nothing
