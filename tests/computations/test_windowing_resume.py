"""Runs of the windowing computations from before their state was typed resume with the
typed ones (``computations/windowing.py``, issue 37). State and timers stored by the old
classes (below, verbatim but for their names and docstrings: a pickled dict, timers
``"w<start>"`` / ``"x<start>"``) are read, converted and moved to the timer families in the
first step that touches a key, and the productions — values, timestamps, ids — are the
ones the old classes would have made: with the class's codec, and with the pickle codec
that a topology's ``options=`` gives.

The seed is fresh on every run and printed; ``WINDOWING_SEED=<n>`` replays one.
"""

from __future__ import annotations

import math
import os
import pickle
import random
from collections import Counter

import pytest

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
    value = int(os.environ.get("WINDOWING_SEED") or random.randrange(1 << 30))
    print(f"WINDOWING_SEED={value}")
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


def harness(cls: type, params: dict, options: ComputationOptions | None) -> Harness:
    return Harness.for_computation(
        cls,
        name="Win",
        inputs={"q": lambda r: r.value["q"]},
        outputs=["out"],
        options=options,
        params={**params, "output": "out"},
    )


def drive(h: Harness, batches: list[list[Record]], wm: int) -> int:
    for i, batch in enumerate(batches):
        h.inject("q", batch)
        if i % 2:
            wm = max(wm, sorted(r.timestamp for r in batch)[len(batch) // 3])
            h.advance_watermark("q", wm)
        h.run()
    return wm


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


def productions(records: list[Record]) -> Counter:
    return Counter((r.id, r.timestamp, repr(sorted(r.value.items()))) for r in records)


CASES = [
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
    seed, old_cls, new_cls, params, codec, late
):
    batches = batches_of(seed)
    policy = LatePolicy.process() if late == "process" else LatePolicy.drop()
    old_options = ComputationOptions(late=policy)  # the default codec then: pickle
    new_options = ComputationOptions(
        late=policy,
        state_codec=new_cls.options.state_codec if codec == "class" else PickleCodec(),
    )
    cut = len(batches) // 2

    whole = harness(old_cls, params, old_options)
    wm = drive(whole, batches[:cut], MIN_TIMESTAMP)
    before = whole.output("out")
    old = harness(old_cls, params, old_options)
    assert drive(old, batches[:cut], MIN_TIMESTAMP) == wm
    assert old.output("out") == before
    drive(whole, batches[cut:], wm)
    whole.finish("q")
    whole.run()

    resumed = harness(new_cls, params, new_options)
    assert transplant(old, resumed) > 0  # keys in the old form, with their old timers
    assert any(
        t.tag[:1] in "wx" and ":" not in t.tag
        for key in resumed.keys("Win")
        for t in resumed.timers("Win", key)
    )
    drive(resumed, batches[cut:], wm)
    resumed.finish("q")
    resumed.run()

    after = resumed.output("out")
    assert productions(before + after) == productions(whole.output("out"))
    assert len(after) > 0
    assert resumed.keys("Win") == [] and whole.keys("Win") == []
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
