"""``WindowCounter``: per-key counts over fixed event-time buckets (MillWheel Fig. 9, ``Windower``).

Each record adds to its bucket's count and sets a low-watermark timer at the bucket's
end; the timer fires once the low watermark passes the bucket, i.e. once the data for it
is complete (§4.5, §4.6), and produces the count with the bucket's end as timestamp.

Empty buckets matter to dip detection (a query that stops arriving produces nothing),
so after a bucket fires the counter keeps a timer on the next bucket and emits zero
counts for up to ``trailing_empty`` consecutive empty buckets before letting the key go.

>>> from millwheel import Record
>>> from millwheel.testing import Harness
>>> h = Harness.for_computation(WindowCounter, inputs={"q": lambda r: r.value}, outputs=["window_counts"],
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

from millwheel import MAX_TIMESTAMP, Computation, Record, Timer


class WindowCounter(Computation):
    """Counts records per key in ``window_ms`` buckets; produces ``{"key", "window_start", "count"}``."""

    def __init__(self, window_ms: int = 1_000, output: str = "window_counts", trailing_empty: int = 10) -> None:
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
        self.set_timer(f"w{start}", start + w)

    def process_timer(self, timer: Timer) -> None:
        w = self.window_ms
        start = timer.timestamp - w
        state = self.state.get() or {"counts": {}, "empty_run": 0}
        count = state["counts"].pop(start, 0)
        if not count and self.low_watermark == MAX_TIMESTAMP:
            # every input is finished: buckets past the end of the data are not "empty"
            if state["counts"]:
                self.state.set(state)
            else:
                self.state.clear()
            return
        state["empty_run"] = 0 if count else state["empty_run"] + 1
        self.produce(self.output, {"key": self.key, "window_start": start, "count": count}, timestamp=timer.timestamp)
        if state["empty_run"] < self.trailing_empty:
            self.set_timer(f"w{start + w}", start + 2 * w)
            self.state.set(state)
        elif state["counts"]:
            self.state.set(state)
        else:
            self.state.clear()  # idle key: keep nothing
