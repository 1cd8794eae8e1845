"""Runs of the built-in computations from before their state was typed resume with the
typed ones (``computations/windowing.py``, ``computations/anomalies.py``,
``computations/_untyped.py``; issue 37). State and timers stored by the old classes
(below, verbatim but for their names and docstrings: a pickled dict, timers
``"w<start>"`` / ``"x<start>"`` / ``"dip<start>"``) are read, converted and moved to the
timer families in the first step that touches a key, and the productions — values,
timestamps, ids — are the ones the old classes would have made: with the class's codec,
and with the pickle codec that a topology's ``options=`` gives.

The seed is fresh on every run and printed; ``RESUME_SEED=<n>`` replays one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import random
from collections import Counter
from typing import Any

import pytest

from computations.anomalies import (
    ANOMALIES,
    DipDetector,
    SpikeDetector,
    Thresholds,
    _anomaly,
)
from computations.columnar_join import ColumnarWindowedJoin
from computations.join import HOWS, JoinBuffer, Left, Right, WindowedJoin
from computations.join import buffer_of as buffer_of_
from computations.model import expected_count, new_model
from computations.windowing import (
    Buckets,
    Window,
    WindowAggregate,
    WindowAggregateSettings,
    WindowCounter,
    Windows,
    aggregate_value,
    close_bucket,
    collect_tag,
    fire_tag,
    number_of,
    update_time,
    window_starts,
)
from millwheel import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Computation,
    ComputationError,
    ComputationOptions,
    LatePolicy,
    PickleCodec,
    Record,
    Timer,
)
from millwheel._envelope import Envelope
from millwheel.testing import Harness


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("RESUME_SEED") or random.randrange(1 << 30))
    print(f"RESUME_SEED={value}")
    return value


# --------------------------------------------------------------- the classes as they were
class OldWindowCounter(Computation):
    """The per-record ``WindowCounter`` as it was (state ``{"counts": {start: n}, "empty_run": n}``,
    timers ``"w<start>"``)."""

    def __init__(
        self, window_ms: int = 1_000, output: str = "window_counts", trailing_empty: int = 10
    ) -> None:
        self.window_ms = window_ms
        self.output = output
        self.trailing_empty = trailing_empty

    def process_record(self, record: Record) -> None:
        w = self.window_ms
        start = record.timestamp // w * w
        state = self.state.get() or {"counts": {}, "empty_run": 0}
        counts = state["counts"]
        counts[start] = counts.get(start, 0) + 1
        state["empty_run"] = 0
        self.state.set(state)
        self.set_timer(fire_tag(start), start + w)

    def process_timer(self, timer: Timer) -> None:
        w = self.window_ms
        start = timer.timestamp - w
        state = self.state.get() or {"counts": {}, "empty_run": 0}
        res = close_bucket(
            state["counts"],
            state["empty_run"],
            start,
            w,
            self.trailing_empty,
            finished=self.low_watermark == MAX_TIMESTAMP,
        )
        state["empty_run"] = res.empty_run
        if res.count is not None:
            self.produce(
                self.output,
                {"key": self.key, "window_start": start, "count": res.count},
                timestamp=timer.timestamp,
            )
        if res.next_start is not None:
            self.set_timer(fire_tag(res.next_start), res.next_start + w)
        if res.keep:
            self.state.set(state)
        else:
            self.state.clear()  # idle key: keep nothing


class OldWindowAggregate(WindowAggregateSettings, Computation):
    """The per-record ``WindowAggregate`` as it was (state ``{"w": {start: [count, sum, min,
    max, updates]}, "closed": end}``, timers ``"w<start>"`` / ``"x<start>"``)."""

    def process_record(self, record: Record) -> None:
        v = None if self.aggregate == "count" else number_of(record.value, self.field, record.id)  # type: ignore[arg-type]
        w, late = self.window_ms, self.allowed_lateness_ms
        st = self.state.get() or {"w": {}, "closed": MIN_TIMESTAMP}
        windows = st["w"]
        for s in window_starts(record.timestamp, w, self.slide_ms):
            if s + w <= st["closed"]:
                continue  # its window was dropped: later than the allowed lateness
            acc = windows.get(s)
            if acc is None:
                acc = windows[s] = [0, 0.0, math.inf, -math.inf, 0]
                if late:
                    self.set_timer(collect_tag(s), s + w + late)
            acc[0] += 1
            if v is not None:
                acc[1] += v
                acc[2] = min(acc[2], v)
                acc[3] = max(acc[3], v)
            self.set_timer(fire_tag(s), s + w)  # a window that fired fires again (a late update)
        if windows:
            self.state.set(st)

    def process_timer(self, timer: Timer) -> None:
        st = self.state.get() or {"w": {}, "closed": MIN_TIMESTAMP}
        windows, w = st["w"], self.window_ms
        if timer.tag[0] == "w":
            s = int(timer.tag[1:])
            acc = windows.get(s)
            if acc is None:
                return
            n, total, lo, hi, update = acc
            ts = s + w if update == 0 else update_time(self.low_watermark)
            self.produce(
                self.output,
                aggregate_value(self.aggregate, self.key, s, w, n, total, lo, hi, update),
                timestamp=ts,
            )
            acc[4] += 1
            if self.allowed_lateness_ms:
                self.state.set(st)
                return
        else:
            s = int(timer.tag[1:])
        windows.pop(s, None)
        st["closed"] = max(st["closed"], s + w)
        if windows:
            self.state.set(st)
        else:
            self.state.clear()  # no window left: keep nothing


class OldSpikeDetector(Computation):
    """The ``SpikeDetector`` as it was (state: a dict with sets)."""

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


class OldDipDetector(Computation):
    """The ``DipDetector`` as it was (state: a dict; timers ``"dip<start>"``)."""

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


class OldJoinWindow:
    """The join's rules as they were, on ``{"L": [[ts, id, value, matches]], "R": [...]}``."""

    def __init__(
        self,
        left: str,
        before_ms: int = 0,
        after_ms: int = 1_000,
        how: str = "inner",
        output: str = "joined",
    ) -> None:
        if how not in HOWS:
            msg = f"{type(self).__name__}: how must be one of {HOWS}, got {how!r}"
            raise ComputationError(msg)
        if before_ms < 0 or after_ms < 0:
            msg = f"{type(self).__name__}: before_ms and after_ms must be >= 0, got {before_ms}, {after_ms}"
            raise ComputationError(msg)
        self.left = left
        self.before_ms = before_ms
        self.after_ms = after_ms
        self.how = how
        self.output = output

    def arrived(
        self, st: dict[str, Any], stream: str | None, ts: int, rid: str, value: Any
    ) -> None:
        """A record: matched at once against what the other side has buffered, then buffered."""
        if stream == self.left:
            matches = [r[1] for r in st["R"] if ts - self.before_ms <= r[0] <= ts + self.after_ms]
            for r in st["R"]:
                if r[1] in matches:
                    r[3] = True
            st["L"].append([ts, rid, value, matches])
        else:
            matched = False
            for lrec in st["L"]:
                if lrec[0] - self.before_ms <= ts <= lrec[0] + self.after_ms:
                    lrec[3].append(rid)
                    matched = True
            st["R"].append([ts, rid, value, matched])

    def close(self, fx: Any, st: dict[str, Any], lw: int) -> None:
        """Everything the low watermark ``lw`` closed is emitted and dropped."""
        rights = {r[1]: r for r in st["R"]}
        keep_l = []
        for ts, rid, value, matches in sorted(st["L"], key=lambda x: (x[0], x[1])):
            if ts + self.after_ms >= lw:
                keep_l.append([ts, rid, value, matches])
                continue
            for m in sorted(matches, key=lambda i: (rights[i][0], i)):
                fx.produce({"key": fx.key, "left": value, "right": rights[m][2]}, ts)
            if not matches and self.how != "inner":
                fx.produce({"key": fx.key, "left": value, "right": None}, ts)
        needed = {m for lrec in keep_l for m in lrec[3]}
        keep_r = []
        for r in sorted(st["R"], key=lambda x: (x[0], x[1])):
            if r[0] + self.before_ms >= lw or r[1] in needed:
                keep_r.append(r)
            elif not r[3] and self.how == "outer":
                fx.produce({"key": fx.key, "left": None, "right": r[2]}, r[0])
        st["L"], st["R"] = keep_l, keep_r

    def settle(self, fx: Any, st: dict[str, Any]) -> bool:
        """The key's timer and hold for its state; whether it keeps any."""
        if not st["L"] and not st["R"]:
            fx.hold(None)
            fx.close_at(None)
            return False
        needed = {
            m for lrec in st["L"] for m in lrec[3]
        }  # rights an open left will emit: dropped with it
        closes = [lrec[0] + self.after_ms for lrec in st["L"]] + [
            r[0] + self.before_ms for r in st["R"] if r[1] not in needed
        ]
        fx.close_at(min(closes) + 1)  # a window [.., c] is closed once the watermark is past c
        emits = [lrec[0] for lrec in st["L"]] + (
            [r[0] for r in st["R"] if not r[3]] if self.how == "outer" else []
        )
        fx.hold(min(emits) if emits else None)
        return True


class OldWindowedJoin(OldJoinWindow, Computation):
    """The per-record ``WindowedJoin`` as it was (one timer, ``"close"``)."""

    def process_record(self, record: Record) -> None:
        st = self.state.get() or {"L": [], "R": []}
        self.arrived(st, record.stream, record.timestamp, record.id, record.value)
        self._save(st)

    def process_timer(self, timer: Timer) -> None:  # noqa: ARG002 - everything closed by the watermark goes
        st = self.state.get() or {"L": [], "R": []}
        self.close(_OldOwn(self), st, self.low_watermark)
        self._save(st)

    def _save(self, st: dict[str, Any]) -> None:
        if self.settle(_OldOwn(self), st):
            self.state.set(st)
        else:
            self.state.clear()


class _OldOwn:
    """:class:`JoinEffects` of the per-record join: its own calls."""

    __slots__ = ("c",)

    def __init__(self, c: OldWindowedJoin) -> None:
        self.c = c

    @property
    def key(self) -> Any:
        return self.c.key

    def produce(self, value: dict[str, Any], timestamp: int) -> None:
        self.c.produce(self.c.output, value, timestamp=timestamp)

    def close_at(self, timestamp: int | None) -> None:
        if timestamp is None:
            self.c.delete_timer("close")
        else:
            self.c.set_timer("close", timestamp)

    def hold(self, timestamp: int | None) -> None:
        self.c.hold_watermark(timestamp)


# ------------------------------------------------------------------------------ resuming
def batches_of(seed: int, n: int = 24, keys: int = 5) -> list[list[Record]]:
    """Batches with disorder, duplicates re-sent later and records far behind (late)."""
    rng = random.Random(seed)
    sent: list[Record] = []
    out, t = [], 10_000
    for b in range(n):
        batch = []
        for i in range(rng.randrange(5, 30)):
            ts = t + rng.randrange(-1_500, 3_000) - (6_000 if rng.random() < 0.05 else 0)
            v = round(rng.uniform(-5, 50), 3) if rng.random() < 0.8 else rng.randrange(100)
            batch.append(Record(None, {"q": f"k{rng.randrange(keys)}", "ms": v}, ts, f"r{b}-{i}"))
        sent += batch
        batch += [rng.choice(sent) for _ in range(rng.randrange(0, 3))]
        rng.shuffle(batch)
        out.append(batch)
        t += rng.randrange(300, 2_000)
    return out


def dip_batches(seed: int, n: int = 24, keys: int = 4) -> list[list[Record]]:
    """``ModelCalculator``-like windows: counts around what is expected, with runs of dips,
    some without an expectation; in disorder within a batch, duplicates re-sent. The last key
    dips two buckets in a row in each half, whatever the seed (a seed with no run of dips
    judged nothing: RESUME_SEED=205871161)."""
    rng = random.Random(seed)
    out, sent = [], []
    for b in range(n):
        batch = []
        for k in range(keys):
            start = 10_000 + (b + 2 * k) * 1_000  # keys apart: some buckets still open
            run = k == keys - 1 and b % (n // 2) in (n // 4, n // 4 + 1)
            dip = rng.random() < 0.3 or run
            count = rng.randrange(0, 3) if dip else rng.randrange(15, 26)
            expected = None if rng.random() < 0.1 and not run else 20.0
            value = {"key": f"k{k}", "window_start": start, "count": count, "expected": expected}
            batch.append(Record(None, value, start + 1_000, f"w{b}-{k}"))
        sent += batch
        batch += [rng.choice(sent) for _ in range(rng.randrange(0, 2))]
        rng.shuffle(batch)
        out.append(batch)
    return out


def spike_batches(seed: int, n: int = 24, keys: int = 4) -> list[list[Record]]:
    """Query events (bursts now and then) and model updates, some keys' models late."""
    rng = random.Random(seed)
    model = new_model(60_000, 3_000)
    model.update(level=5.0, windows=20)
    out = []
    for b in range(n):
        t = 10_000 + b * 1_000
        batch = []
        for k in range(keys):
            if b == 2 * k:  # key k gets its model in batch 2k: its earlier buckets wait
                value = {"key": f"k{k}", "window_start": t - 1_000, "model": model}
                batch.append(Record(None, value, t, f"m{b}-{k}"))
            for i in range(rng.randrange(20, 40) if rng.random() < 0.3 else rng.randrange(0, 8)):
                ts = t + rng.randrange(0, 1_000) - (3_000 if rng.random() < 0.05 else 0)
                batch.append(Record(None, {"query": f"k{k}"}, ts, f"e{b}-{k}-{i}"))
        rng.shuffle(batch)
        out.append(batch)
    return out


def join_batches(seed: int, n: int = 24, keys: int = 5) -> list[list[Record]]:
    """Views (left) and clicks (right) of a few ids, in disorder, duplicates re-sent."""
    rng = random.Random(seed)
    out, sent, t = [], [], 10_000
    for b in range(n):
        batch = []
        for i in range(rng.randrange(3, 12)):
            stream = "views" if rng.random() < 0.5 else "clicks"
            ts = t + rng.randrange(-800, 1_500)
            value = {"id": f"k{rng.randrange(keys)}", "n": i}
            batch.append(Record(None, value, ts, f"{stream[0]}{b}-{i}", stream))
        sent += batch
        batch += [rng.choice(sent) for _ in range(rng.randrange(0, 2))]
        rng.shuffle(batch)
        out.append(batch)
        t += rng.randrange(300, 1_200)
    return out


def by_id(r: Record) -> str:
    return r.value["id"]


def by_key(r: Record) -> str:
    return r.value["key"]


def by_key_or_query(r: Record) -> str:
    return r.value["key"] if "key" in r.value else r.value["query"]


def by_query(r: Record) -> str:
    return r.value["q"]


def harness(
    cls: type, params: dict, options: ComputationOptions | None, inputs: dict | None = None
) -> Harness:
    return Harness.for_computation(
        cls,
        name="Win",
        inputs=inputs or {"q": by_query},
        outputs=["out"],
        options=options,
        params={**params, "output": "out"},
    )


def transplant(old: Harness, new: Harness, name: str = "Win") -> int:
    """``new`` takes over ``old``'s envelopes and clocks, as a driver started on a run
    directory does; the number of keys whose state is in the old form."""
    untyped = 0
    for key, raw in old._envelopes[name].items():
        env = Envelope.decode(raw)
        untyped += env.state is not None and env.state[:2] == b"\x80\x05"
        hold, next_lw, next_wall = env.schedule()
        new._store(name, key, raw, hold, (next_lw, next_wall))
    new._rounds[name] = old._rounds[name]
    new._published[name] = old._published[name]
    new._injector_wm.update(old._injector_wm)
    return untyped


def finish(h: Harness) -> None:
    for injector in h.topology.injectors:
        h.finish(injector)
    h.run()


def plain(value: Any) -> Any:
    """A state, old (a dict) or typed, as plain data to compare: the old dict's names are
    the typed state's fields."""
    if isinstance(value, Window):
        return plain(value.stored())
    if dataclasses.is_dataclass(value):
        return plain(vars(value))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, set):
        return sorted(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def productions(records: list[Record]) -> Counter:
    return Counter((r.id, r.timestamp, repr(sorted(r.value.items()))) for r in records)


CASES = [
    (OldWindowedJoin, WindowedJoin, {"left": "views", "after_ms": 1_000, "how": "inner"}),
    (
        OldWindowedJoin,
        WindowedJoin,
        {"left": "views", "before_ms": 500, "after_ms": 2_000, "how": "outer"},
    ),
    (OldDipDetector, DipDetector, {}),
    (OldDipDetector, DipDetector, {"thresholds": Thresholds(confidence_threshold=0)}),
    (OldSpikeDetector, SpikeDetector, {}),
    (OldSpikeDetector, SpikeDetector, {"keep_windows": 3, "max_unjudged": 2}),
    (OldWindowCounter, WindowCounter, {"trailing_empty": 3}),
    (OldWindowCounter, WindowCounter, {"window_ms": 2_000, "trailing_empty": 0}),
    (OldWindowAggregate, WindowAggregate, {"aggregate": "sum", "field": "ms"}),
    (
        OldWindowAggregate,
        WindowAggregate,
        {"aggregate": "mean", "field": "ms", "window_ms": 3_000, "slide_ms": 1_000},
    ),
    (
        OldWindowAggregate,
        WindowAggregate,
        {
            "aggregate": "min",
            "field": "ms",
            "window_ms": 2_000,
            "slide_ms": 500,
            "allowed_lateness_ms": 4_000,
        },
    ),
    (
        OldWindowAggregate,
        WindowAggregate,
        {"aggregate": "count", "window_ms": 1_000, "allowed_lateness_ms": 10_000},
    ),
]


@pytest.mark.parametrize(("old_cls", "new_cls", "params"), CASES)
@pytest.mark.parametrize("codec", ["class", "pickle"])
@pytest.mark.parametrize("late", ["drop", "process"])
def test_a_run_of_the_untyped_classes_resumes_with_the_typed_ones(
    seed, old_cls, new_cls, params, codec, late, drive_windows
):
    batches, inputs = {
        DipDetector: (dip_batches(seed), {"q": by_key}),
        SpikeDetector: (spike_batches(seed), {"q": by_key_or_query}),
        WindowedJoin: (join_batches(seed), {"views": by_id, "clicks": by_id}),
    }.get(new_cls, (batches_of(seed), None))
    policy = LatePolicy.process() if late == "process" else LatePolicy.drop()
    old_options = ComputationOptions(late=policy)  # the default codec then: pickle
    new_options = ComputationOptions(
        late=policy,
        state_codec=new_cls.options.state_codec if codec == "class" else PickleCodec(),
    )
    cut = len(batches) // 2

    whole = harness(old_cls, params, old_options, inputs)
    drive = drive_windows
    wm = drive(whole, batches[:cut], MIN_TIMESTAMP)
    before = whole.output("out")
    old = harness(old_cls, params, old_options, inputs)
    assert drive(old, batches[:cut], MIN_TIMESTAMP) == wm
    assert old.output("out") == before
    drive(whole, batches[cut:], wm)
    finish(whole)

    resumed = harness(new_cls, params, new_options, inputs)
    assert transplant(old, resumed) > 0  # keys in the old form, with their old timers
    assert new_cls is SpikeDetector or any(  # the spike detector sets no timers
        ":" not in t.tag for key in resumed.keys("Win") for t in resumed.timers("Win", key)
    )
    drive(resumed, batches[cut:], wm)
    finish(resumed)

    after = resumed.output("out")
    assert productions(before + after) == productions(whole.output("out"))
    assert len(whole.output("out")) > 0 and resumed.metrics("Win")["processed"] > 0
    keys = sorted(whole.keys("Win"), key=repr)
    assert sorted(resumed.keys("Win"), key=repr) == keys  # the detectors keep long-term state
    for key in keys:
        assert plain(resumed.state("Win", key)) == plain(whole.state("Win", key)), key
    assert (
        resumed.metrics("Win")["timers_fired"]
        == whole.metrics("Win")["timers_fired"] - (old.metrics("Win")["timers_fired"])
    )


def test_the_first_step_on_an_old_key_moves_its_timers_to_the_families():
    old = harness(OldWindowAggregate, {"aggregate": "sum", "field": "ms"}, None)
    old.inject("q", [Record(None, {"q": "a", "ms": 1}, 1_100, "r1")])
    old.inject("q", [Record(None, {"q": "a", "ms": 2}, 2_100, "r2")])
    old.run()
    assert [t.tag for t in old.timers("Win", "a")] == ["w1000", "w2000"]
    new = harness(WindowAggregate, {"aggregate": "sum", "field": "ms"}, None)
    transplant(old, new)
    new.inject("q", [Record(None, {"q": "a", "ms": 4}, 1_500, "r3")])
    assert new.run().values("out") == []
    assert [(t.tag, t.timestamp) for t in new.timers("Win", "a")] == [
        ("w:1000", 2_000),
        ("w:2000", 3_000),
    ]
    state = new.state("Win", "a")
    assert state == Windows({1000: Window(2, 5.0, 1.0, 4.0, 0), 2000: Window(1, 2.0, 2.0, 2.0, 0)})
    new.advance_watermark("q", 3_000)
    got = [(v["window_start"], v["sum"], v["count"]) for v in new.run().values("out")]
    assert got == [(1_000, 5.0, 2), (2_000, 2.0, 1)]


def test_an_old_timer_that_fires_first_is_handled_and_the_others_move():
    old = harness(OldWindowCounter, {"trailing_empty": 0}, None)
    old.inject("q", [Record(None, {"q": "a"}, t, f"r{t}") for t in (1_100, 2_100, 5_100)])
    old.run()
    new = harness(WindowCounter, {"trailing_empty": 0}, None)
    transplant(old, new)
    new.advance_watermark("q", 2_000)  # w1000 fires, in its old form
    assert [(v["window_start"], v["count"]) for v in new.run().values("out")] == [(1_000, 1)]
    assert [t.tag for t in new.timers("Win", "a")] == ["w:2000", "w:5000"]
    assert new.state("Win", "a") == Buckets({2000: 1, 5000: 1}, 0)
    new.finish("q")
    assert [v["window_start"] for v in new.run().values("out")] == [2_000, 5_000]


def test_the_codecs_read_both_forms():
    buckets, windows = WindowCounter.options.state_codec, WindowAggregate.options.state_codec
    b = Buckets({1000: 3, -2000: 1}, 2)
    assert buckets.decode(buckets.encode(b)) == b
    w = Windows({0: Window(2, 3.5, 1.0, 2.5, 1), 1000: Window()}, 500)
    back = windows.decode(windows.encode(w))
    assert back == w and back.open[1000].low == math.inf
    assert windows.decode(windows.encode(Windows())) == Windows()
    old = {"w": {0: [1, 1.0, 1.0, 1.0, 0]}, "closed": MIN_TIMESTAMP}
    assert windows.decode(pickle.dumps(old, 5)) == old  # the old form, for windows() to convert
    assert buckets.decode(pickle.dumps({"counts": {}, "empty_run": 0}, 5)) == {
        "counts": {},
        "empty_run": 0,
    }


def test_the_columnar_join_reads_the_untyped_state_of_an_older_run():
    import pandas as pd

    h = Harness.for_computation(
        ColumnarWindowedJoin,
        inputs={"views": by_id, "clicks": by_id},
        outputs=["joined"],
        params={"left": "views", "after_ms": 1_000, "how": "left"},
    )
    old = {"L": [[1_000, "v1", {"id": "a"}, []]], "R": [[900, "c0", {"id": "a", "x": 0}, False]]}
    rows = pd.DataFrame({"data": [pickle.dumps(old, 5)]})
    h.set_state("ColumnarWindowedJoin", "a", rows)
    h.inject("clicks", [Record(None, {"id": "a", "x": 1}, 1_400, "c1")])
    h.finish("views")
    h.finish("clicks")
    got = [(v["left"], v["right"]) for v in h.run().values("joined")]
    assert got == [({"id": "a"}, {"id": "a", "x": 1})]
    assert h.state("ColumnarWindowedJoin", "a") is None  # all emitted: nothing kept


def test_join_buffer_of_the_untyped_state():
    old = {"L": [[1, "l", "v", ("r",)]], "R": [[2, "r", "w", 1]]}
    assert buffer_of_(old) == JoinBuffer([Left(1, "l", "v", ["r"])], [Right(2, "r", "w", True)])
    assert HOWS == ("inner", "left", "outer")
