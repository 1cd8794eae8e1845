"""Windowed aggregations per key over event time: ``WindowCounter`` (MillWheel Fig. 9,
``Windower``) and ``WindowAggregate`` (count, sum, min, max, mean; tumbling or sliding
windows; allowed lateness).

A window fires on a low-watermark timer at its end: once the low watermark passes it, the
data for it is complete (§4.5, §4.6). The helpers here (:func:`window_starts`,
:func:`close_bucket`, :func:`number_of`, ...) are the one definition of the windows and
firing rules; ``columnar_windowing.py`` runs the same computations on the columnar path
with them. The per-record classes keep typed state (:class:`Buckets`, :class:`Windows`)
and timer families named by the window's start, as ``docs/concepts.md`` teaches; the
columnar ones keep state rows and tag their timers with :func:`fire_tag` /
:func:`collect_tag` (the per-record classes' tags before they had families, which they
still read: a run stored before resumes, ``tests/computations/test_windowing_resume.py``).

``WindowCounter``: each record adds to its bucket's count; the bucket's timer produces
the count with the bucket's end as timestamp. Empty buckets matter to dip detection (a
query that stops arriving produces nothing), so after a bucket fires the counter keeps a
timer on the next bucket and emits zero counts for up to ``trailing_empty`` consecutive
empty buckets before letting the key go.

>>> from millwheel import Record
>>> from millwheel.testing import Harness
>>> h = Harness.for_computation(WindowCounter, inputs={"q": lambda r: r.value}, outputs=["window_counts"],
...                             params={"trailing_empty": 1})
>>> h.inject("q", [h.record("cats", 1_100), h.record("cats", 1_200), h.record("cats", 2_050)])
>>> h.advance_watermark("q", 4_000)
>>> [(v["window_start"], v["count"]) for v in h.run().values("window_counts")]
[(1000, 2), (2000, 1), (3000, 0)]
>>> h.inject("q", [h.record("cats", 5_500)]); h.finish("q")
>>> [(v["window_start"], v["count"]) for v in h.run().values("window_counts")]
[(5000, 1)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgpack

from computations._untyped import PickledBefore, move_untyped_timers, untyped_tag
from millwheel import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Computation,
    ComputationError,
    ComputationOptions,
    DataclassCodec,
    Record,
    StateCodecError,
    Timer,
    TimerFamily,
)

AGGREGATES = ("count", "sum", "min", "max", "mean")


# ---------------------------------------------------------------------------- shared helpers
def fire_tag(start: int) -> str:
    """The tag of the columnar timer that fires the window (bucket) starting at ``start``
    (and of the per-record one, before it had a family)."""
    return f"w{start}"


def collect_tag(start: int) -> str:
    """The tag of the columnar timer that drops the window starting at ``start`` once its
    allowed lateness is over (and of the per-record one, before it had a family)."""
    return f"x{start}"


def window_starts(ts: int, window_ms: int, slide_ms: int) -> list[int]:
    """The starts of the windows holding ``ts``, oldest first: multiples of ``slide_ms`` in
    ``(ts - window_ms, ts]`` (one window when ``slide_ms == window_ms``: tumbling).

    >>> window_starts(2_500, 1_000, 1_000), window_starts(2_500, 3_000, 1_000)
    ([2000], [0, 1000, 2000])
    """
    last = ts // slide_ms * slide_ms
    return [
        s
        for s in range(
            last - (windows_per_record(window_ms, slide_ms) - 1) * slide_ms, last + 1, slide_ms
        )
        if s + window_ms > ts
    ]


def windows_per_record(window_ms: int, slide_ms: int) -> int:
    """The most windows one timestamp falls in."""
    return -(-window_ms // slide_ms)


def check_window(
    name: str,
    aggregate: str,
    field: str | None,
    window_ms: int,
    slide_ms: int | None,
    allowed_lateness_ms: int,
) -> int:
    """Validate a windowed aggregation's parameters (at construction: the topology's build); the slide."""
    slide = window_ms if slide_ms is None else slide_ms
    if aggregate not in AGGREGATES:
        msg = f"{name}: aggregate must be one of {AGGREGATES}, got {aggregate!r}"
        raise ComputationError(msg)
    if aggregate != "count" and not field:
        msg = f"{name}: aggregate={aggregate!r} needs field=... (the value's field to aggregate)"
        raise ComputationError(msg)
    if (
        type(window_ms) is not int
        or type(slide) is not int
        or window_ms <= 0
        or slide <= 0
        or slide > window_ms
    ):
        msg = f"{name}: window_ms and slide_ms must be ints with 0 < slide_ms <= window_ms, got {window_ms!r}, {slide_ms!r}"
        raise ComputationError(msg)
    if type(allowed_lateness_ms) is not int or allowed_lateness_ms < 0:
        msg = f"{name}: allowed_lateness_ms must be an int >= 0, got {allowed_lateness_ms!r}"
        raise ComputationError(msg)
    return slide


def number_of(value: Any, field: str, record_id: str) -> float:
    """The number a record carries in ``field``, as a float; raises (the record is dead-lettered) if it has none."""
    v = value.get(field) if isinstance(value, dict) else None
    if type(v) is not int and type(v) is not float or not math.isfinite(v):
        msg = f"record {record_id!r}: field {field!r} must be a finite number, got {type(v).__name__} {str(v)[:40]}"
        raise ValueError(msg)
    return float(v)


def update_time(low_watermark: int) -> int:
    """The timestamp of a late update (a window fired again): the low watermark, so it is
    never behind the output watermark (inside the range records carry)."""
    return min(max(low_watermark, MIN_TIMESTAMP + 1), MAX_TIMESTAMP - 1)


def aggregate_value(
    aggregate: str,
    key: Any,
    start: int,
    window_ms: int,
    count: int,
    total: float,
    lo: float,
    hi: float,
    update: int,
) -> dict[str, Any]:
    """A window's production: ``key``, ``window_start``, ``window_end``, ``count``, the aggregate, ``update``."""
    out = {"key": key, "window_start": start, "window_end": start + window_ms, "count": count}
    if aggregate == "sum":
        out["sum"] = total
    elif aggregate == "mean":
        out["mean"] = total / count
    elif aggregate == "min":
        out["min"] = lo
    elif aggregate == "max":
        out["max"] = hi
    out["update"] = update
    return out


@dataclass(frozen=True, slots=True)
class BucketClose:
    """What firing one ``WindowCounter`` bucket decides (:func:`close_bucket`)."""

    #: the count to produce (``None``: nothing)
    count: int | None
    empty_run: int
    #: the next bucket to keep a timer on (``None``: none)
    next_start: int | None
    #: whether the key keeps state
    keep: bool


def close_bucket(
    counts: dict[int, int],
    empty_run: int,
    start: int,
    window_ms: int,
    trailing_empty: int,
    *,
    finished: bool,
) -> BucketClose:
    """Fire bucket ``start`` of a key whose buckets are ``counts`` (popped from it): the
    ``WindowCounter``'s rule, shared by both paths. Once every input is finished, buckets
    past the end of the data are not "empty" and produce nothing."""
    count = counts.pop(start, 0)
    if not count and finished:
        return BucketClose(None, empty_run, None, bool(counts))
    empty_run = 0 if count else empty_run + 1
    if empty_run < trailing_empty:
        return BucketClose(count, empty_run, start + window_ms, True)
    return BucketClose(count, empty_run, None, bool(counts))


# ----------------------------------------------------------------------------- typed state
@dataclass
class Buckets:
    """A :class:`WindowCounter` key's state: its open buckets' counts by start, and how many
    empty buckets it has produced in a row."""

    counts: dict[int, int] = field(default_factory=dict)
    empty_run: int = 0


class Window:
    """One open window of a :class:`WindowAggregate` key: what its records add up to, and how
    often it has fired."""

    __slots__ = ("count", "total", "low", "high", "fired")

    def __init__(
        self,
        count: int = 0,
        total: float = 0.0,
        low: float = math.inf,
        high: float = -math.inf,
        fired: int = 0,
    ) -> None:
        self.count, self.total, self.low, self.high, self.fired = count, total, low, high, fired

    def add(self, v: float | None) -> None:
        """One record more, with its number (``None``: counted only)."""
        self.count += 1
        if v is not None:
            self.total += v
            self.low = min(self.low, v)
            self.high = max(self.high, v)

    def stored(self) -> list[Any]:
        return [self.count, self.total, self.low, self.high, self.fired]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled compactly: a topology's ``options=`` gives the pickle codec."""
        return (Window, (self.count, self.total, self.low, self.high, self.fired))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Window) and self.stored() == other.stored()

    def __repr__(self) -> str:
        return f"Window(count={self.count}, total={self.total}, low={self.low}, high={self.high}, fired={self.fired})"


@dataclass
class Windows:
    """A :class:`WindowAggregate` key's state: its open windows by start, and the end of the
    newest window it dropped (a record for a window ending there or before is too late)."""

    open: dict[int, Window] = field(default_factory=dict)
    closed: int = MIN_TIMESTAMP


class WindowsCodec:
    """:class:`Windows` as msgpack: ``{"open": {start: [count, total, low, high, fired]},
    "closed": end}``."""

    name = "windowing:windows"

    def encode(self, value: Any) -> bytes:
        if type(value) is not Windows:
            msg = f"{self.name}: state must be a Windows, got {type(value).__name__}"
            raise StateCodecError(msg)
        stored = {s: win.stored() for s, win in value.open.items()}
        return msgpack.packb({"open": stored, "closed": value.closed}, use_bin_type=True)

    def decode(self, data: bytes) -> Any:
        try:
            stored = msgpack.unpackb(data, raw=False, strict_map_key=False)
            return Windows({s: Window(*acc) for s, acc in stored["open"].items()}, stored["closed"])
        except Exception as exc:
            msg = f"{self.name}: cannot decode state ({len(data)} bytes): {exc}"
            raise StateCodecError(msg) from exc


# ------------------------------------------------------------------------------ WindowCounter
class WindowCounter(Computation):
    """Counts records per key in ``window_ms`` buckets; produces ``{"key", "window_start", "count"}``.

    State: :class:`Buckets`. Timers: ``bucket``, one per open bucket, named by its start."""

    #: typed state; state stored untyped (pickled) by an older run is read too (``_untyped.py``)
    options = ComputationOptions(state_codec=PickledBefore(DataclassCodec(Buckets)))
    bucket = TimerFamily(tag="w")  # fires at the bucket's end

    def __init__(
        self, window_ms: int = 1_000, output: str = "window_counts", trailing_empty: int = 10
    ) -> None:
        self.window_ms = window_ms
        self.output = output
        self.trailing_empty = trailing_empty

    def buckets(self) -> Buckets:
        """The key's state; state stored untyped by an older run is converted, and its timers
        moved to the ``bucket`` family."""
        st = self.state.get()
        if st is None:
            return Buckets()
        if type(st) is dict:
            move_untyped_timers(self, {"w": self.bucket})
            return Buckets(st["counts"], st["empty_run"])
        return st

    def process_record(self, record: Record) -> None:
        w = self.window_ms
        start = record.timestamp // w * w
        st = self.buckets()
        st.counts[start] = st.counts.get(start, 0) + 1
        st.empty_run = 0
        self.state.set(st)
        self.bucket.set(start + w, name=str(start))

    def process_timer(self, timer: Timer) -> None:
        """Timers of the ``bucket`` family; and a bucket timer an older run set under its
        untyped tag (``"w<start>"``), until the key's state is read once."""
        old = untyped_tag(timer.tag, ("w",))
        if old is not None:
            self.bucket_closed(str(old[1]), timer)
        else:
            super().process_timer(timer)

    @bucket.on_fire
    def bucket_closed(self, _name: str, timer: Timer) -> None:
        w = self.window_ms
        start = timer.timestamp - w
        st = self.buckets()
        res = close_bucket(
            st.counts,
            st.empty_run,
            start,
            w,
            self.trailing_empty,
            finished=self.low_watermark == MAX_TIMESTAMP,
        )
        st.empty_run = res.empty_run
        if res.count is not None:
            self.produce(
                self.output,
                {"key": self.key, "window_start": start, "count": res.count},
                timestamp=timer.timestamp,
            )
        if res.next_start is not None:
            self.bucket.set(res.next_start + w, name=str(res.next_start))
        if res.keep:
            self.state.set(st)
        else:
            self.state.clear()  # idle key: keep nothing


# ---------------------------------------------------------------------------- WindowAggregate
class WindowAggregateSettings:
    """A windowed aggregation's settings, checked when the topology is built (:func:`check_window`):
    the one constructor both :class:`WindowAggregate` and ``ColumnarWindowAggregate`` take."""

    def __init__(
        self,
        aggregate: str = "count",
        field: str | None = None,
        window_ms: int = 1_000,
        slide_ms: int | None = None,
        allowed_lateness_ms: int = 0,
        output: str = "window_aggregates",
    ) -> None:
        self.slide_ms = check_window(
            type(self).__name__, aggregate, field, window_ms, slide_ms, allowed_lateness_ms
        )
        self.aggregate = aggregate
        self.field = field
        self.window_ms = window_ms
        self.allowed_lateness_ms = allowed_lateness_ms
        self.output = output


class WindowAggregate(WindowAggregateSettings, Computation):
    """``aggregate`` (count, sum, min, max, mean) of ``field`` per key and event-time window.

    Windows are ``window_ms`` long and start every ``slide_ms`` (default: ``window_ms``,
    tumbling; smaller: sliding, a record in each window that holds it). A window fires once
    the low watermark passes its end (a low-watermark timer, §4.6) and produces
    ``{"key", "window_start", "window_end", "count", <aggregate>, "update": 0}`` with its end
    as timestamp; an empty window produces nothing.

    **Allowed lateness.** With ``LatePolicy.process()`` records behind the low watermark
    reach the computation (§4.5). A window is kept ``allowed_lateness_ms`` of event time
    after its end (a second timer); a record for a window still kept updates it, and the
    window fires again after the batch's records with ``"update": n`` (n-th late update,
    the aggregate over everything so far), timestamped with the low watermark. A record for
    a window the key has already dropped is dropped (the key remembers the newest dropped
    window's end as long as it keeps any window). With ``LatePolicy.drop()`` (the default)
    no record reaches a window that has fired.

    ``field`` must hold a finite number (int or float); a record without one is
    dead-lettered (the other records of its key go on). Sums are float sums in record
    order. State: :class:`Windows`. Timers, named by the window's start: ``fire`` at its
    end, ``collect`` at its end plus the allowed lateness.

    >>> from millwheel.testing import Harness
    >>> h = Harness.for_computation(WindowAggregate, inputs={"q": lambda r: r.value["q"]}, outputs=["window_aggregates"],
    ...                             params={"aggregate": "mean", "field": "ms", "window_ms": 2_000, "slide_ms": 1_000})
    >>> h.inject("q", [h.record({"q": "cats", "ms": 10}, 1_100), h.record({"q": "cats", "ms": 30}, 2_050)])
    >>> h.finish("q")
    >>> [(v["window_start"], v["count"], v["mean"]) for v in h.run().values("window_aggregates")]
    [(0, 1, 10.0), (1000, 2, 20.0), (2000, 1, 30.0)]
    """

    #: typed state; state stored untyped (pickled) by an older run is read too (``_untyped.py``)
    options = ComputationOptions(state_codec=PickledBefore(WindowsCodec()))
    fire = TimerFamily(tag="w")  # the window's end: it fires (again, for a late update)
    collect = TimerFamily(tag="x")  # its end plus the allowed lateness: it is dropped

    def windows(self) -> Windows:
        """The key's state; state stored untyped by an older run is converted, and its timers
        moved to their families."""
        st = self.state.get()
        if st is None:
            return Windows()
        if type(st) is dict:
            move_untyped_timers(self, {"w": self.fire, "x": self.collect})
            return Windows({s: Window(*acc) for s, acc in st["w"].items()}, st["closed"])
        return st

    def process_record(self, record: Record) -> None:
        v = None if self.aggregate == "count" else number_of(record.value, self.field, record.id)  # type: ignore[arg-type]
        w, late = self.window_ms, self.allowed_lateness_ms
        st = self.windows()
        for s in window_starts(record.timestamp, w, self.slide_ms):
            if s + w <= st.closed:
                continue  # its window was dropped: later than the allowed lateness
            win = st.open.get(s)
            if win is None:
                win = st.open[s] = Window()
                if late:
                    self.collect.set(s + w + late, name=str(s))
            win.add(v)
            self.fire.set(s + w, name=str(s))  # a window that fired fires again (a late update)
        if st.open:
            self.state.set(st)

    def process_timer(self, timer: Timer) -> None:
        """Timers of the ``fire`` and ``collect`` families; and those an older run set under
        their untyped tags (``"w<start>"``, ``"x<start>"``), until the key's state is read once."""
        old = untyped_tag(timer.tag, ("w", "x"))
        if old is None:
            super().process_timer(timer)
        elif old[0] == "w":
            self.fired(str(old[1]), timer)
        else:
            self.collected(str(old[1]), timer)

    @fire.on_fire
    def fired(self, name: str, timer: Timer) -> None:
        s, w = int(name), self.window_ms
        st = self.windows()
        win = st.open.get(s)
        if win is None:
            return
        ts = s + w if win.fired == 0 else update_time(self.low_watermark)
        self.produce(
            self.output,
            aggregate_value(
                self.aggregate, self.key, s, w, win.count, win.total, win.low, win.high, win.fired
            ),
            timestamp=ts,
        )
        win.fired += 1
        if self.allowed_lateness_ms:
            self.state.set(st)
        else:
            self._drop(st, s)

    @collect.on_fire
    def collected(self, name: str, timer: Timer) -> None:
        self._drop(self.windows(), int(name))

    def _drop(self, st: Windows, s: int) -> None:
        st.open.pop(s, None)
        st.closed = max(st.closed, s + self.window_ms)
        if st.open:
            self.state.set(st)
        else:
            self.state.clear()  # no window left: keep nothing
