"""``WindowedJoin``: a bounded-delay stream-stream join, as in Adform's "Join: Storm in a Teacup".

Two streams joined on a key within a time window: a *left* record at ``t`` matches the
*right* records of the same key with timestamps in ``[t - before_ms, t + after_ms]``. Both
sides are buffered in the key's state; each arriving record is matched at once against
what the other side has buffered (so a pair is found whatever the arrival order), and
the left record's result is **emitted when the low watermark closes its window**
(``t + after_ms`` passed, a low-watermark timer): nothing that could still match it can
arrive any more (MillWheel §4.5, §4.6). Where the Adform bolt synchronises its two
spouts with a "sync time" and a "sync-delay", the low watermark is that sync time, and
its lag behind the slowest input partition is what the write-up builds by hand.

* ``how="inner"``: one ``{"key", "left", "right"}`` per pair; ``"left"`` also emits a left
  record that matched nothing, with ``"right": None``; ``"outer"`` also a right record
  that matched nothing (``"left": None``) once no future left record can match it
  (its ``t + before_ms`` passed).
* Outputs carry the left record's timestamp (the right one's for an unmatched right);
  the key holds its output watermark at the oldest record it may still emit, so they
  are never late downstream.
* Exactly once within a pipeline (dedup by record id, strong productions). A record that
  arrives after its window closed is late (§4.5): the computation's ``LatePolicy``
  decides (dropped and counted by default).

State is both sides within the window: ``before_ms + after_ms`` of right records and
``after_ms`` of left records per key, plus the low watermark's lag. For a join whose
delay is unbounded (a click hours after its query), that must join exactly once across
pipelines, see Photon (``topologies/photon``, ``docs/photon.md``).

>>> from millwheel.testing import Harness
>>> h = Harness.for_computation(WindowedJoin, inputs={"views": lambda r: r.value["id"], "clicks": lambda r: r.value["id"]},
...                             outputs=["joined"], params={"left": "views", "before_ms": 0, "after_ms": 1_000, "how": "left"})
>>> h.inject("clicks", [h.record({"id": "a", "x": 1}, 1_400)])
>>> h.inject("views", [h.record({"id": "a"}, 1_000), h.record({"id": "b"}, 1_100)])
>>> h.advance_watermark("views", 2_000); h.advance_watermark("clicks", 2_000)
>>> h.run().values("joined")    # a's window [1000, 2000] is not closed yet: 2000 may still come
[]
>>> h.advance_watermark("views", 2_101); h.advance_watermark("clicks", 2_101)
>>> [(v["key"], v["right"]) for v in h.run().values("joined")]
[('a', {'id': 'a', 'x': 1}), ('b', None)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from millwheel import Computation, ComputationError, Record, Timer, TimerFamily

HOWS = ("inner", "left", "outer")


class JoinEffects(Protocol):
    """What the join rules of one key do: the per-record :class:`WindowedJoin` through its own
    calls, the columnar one (``columnar_join.py``) by collecting columns."""

    key: Any

    def produce(self, value: dict[str, Any], timestamp: int) -> None: ...

    def close_at(self, timestamp: int | None) -> None:
        """Set the key's ``"close"`` timer (``None``: delete it)."""

    def hold(self, timestamp: int | None) -> None: ...


@dataclass(slots=True)
class Left:
    """A buffered left record, and the ids of the right records it matched so far."""

    ts: int
    id: str
    value: Any
    matches: list[str]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled compactly (the state codec is pickle: values are any picklable)."""
        return (Left, (self.ts, self.id, self.value, self.matches))


@dataclass(slots=True)
class Right:
    """A buffered right record, and whether a left record matched it."""

    ts: int
    id: str
    value: Any
    matched: bool

    def __reduce__(self) -> tuple[Any, ...]:
        return (Right, (self.ts, self.id, self.value, self.matched))


@dataclass
class JoinBuffer:
    """A key's state: both sides' records that their windows still hold."""

    left: list[Left] = field(default_factory=list)
    right: list[Right] = field(default_factory=list)


def buffer_of(stored: Any) -> JoinBuffer:
    """A key's state as stored: ``None`` (nothing yet), a :class:`JoinBuffer`, or the dict
    runs stored before the state was typed (``{"L": [[ts, id, value, matches]], "R": [[ts,
    id, value, matched]]}``, converted)."""
    if stored is None:
        return JoinBuffer()
    if type(stored) is dict:
        return JoinBuffer(
            [Left(ts, rid, v, list(m)) for ts, rid, v, m in stored["L"]],
            [Right(ts, rid, v, bool(m)) for ts, rid, v, m in stored["R"]],
        )
    return stored


class JoinWindow:
    """The windowed join's settings and its rules for one key's :class:`JoinBuffer`: the
    one definition both :class:`WindowedJoin` and ``ColumnarWindowedJoin`` run."""

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

    def arrived(self, st: JoinBuffer, stream: str | None, ts: int, rid: str, value: Any) -> None:
        """A record: matched at once against what the other side has buffered, then buffered."""
        if stream == self.left:
            matches = [r.id for r in st.right if ts - self.before_ms <= r.ts <= ts + self.after_ms]
            for r in st.right:
                if r.id in matches:
                    r.matched = True
            st.left.append(Left(ts, rid, value, matches))
        else:
            matched = False
            for lrec in st.left:
                if lrec.ts - self.before_ms <= ts <= lrec.ts + self.after_ms:
                    lrec.matches.append(rid)
                    matched = True
            st.right.append(Right(ts, rid, value, matched))

    def close(self, fx: JoinEffects, st: JoinBuffer, lw: int) -> None:
        """Everything the low watermark ``lw`` closed is emitted and dropped."""
        rights = {r.id: r for r in st.right}
        keep_l = []
        for lrec in sorted(st.left, key=lambda x: (x.ts, x.id)):
            if lrec.ts + self.after_ms >= lw:
                keep_l.append(lrec)
                continue
            for m in sorted(lrec.matches, key=lambda i: (rights[i].ts, i)):
                fx.produce({"key": fx.key, "left": lrec.value, "right": rights[m].value}, lrec.ts)
            if not lrec.matches and self.how != "inner":
                fx.produce({"key": fx.key, "left": lrec.value, "right": None}, lrec.ts)
        needed = {m for lrec in keep_l for m in lrec.matches}
        keep_r = []
        for r in sorted(st.right, key=lambda x: (x.ts, x.id)):
            if r.ts + self.before_ms >= lw or r.id in needed:
                keep_r.append(r)
            elif not r.matched and self.how == "outer":
                fx.produce({"key": fx.key, "left": None, "right": r.value}, r.ts)
        st.left, st.right = keep_l, keep_r

    def settle(self, fx: JoinEffects, st: JoinBuffer) -> bool:
        """The key's timer and hold for its state; whether it keeps any."""
        if not st.left and not st.right:
            fx.hold(None)
            fx.close_at(None)
            return False
        needed = {m for lrec in st.left for m in lrec.matches}  # rights an open left emits
        closes = [lrec.ts + self.after_ms for lrec in st.left] + [
            r.ts + self.before_ms for r in st.right if r.id not in needed
        ]
        fx.close_at(min(closes) + 1)  # a window [.., c] is closed once the watermark is past c
        emits = [lrec.ts for lrec in st.left] + (
            [r.ts for r in st.right if not r.matched] if self.how == "outer" else []
        )
        fx.hold(min(emits) if emits else None)
        return True


class WindowedJoin(JoinWindow, Computation):
    """Joins ``left`` with every other input stream (the right side) per key, within
    ``[t - before_ms, t + after_ms]`` of each left record; see the module docstring.

    State: a :class:`JoinBuffer` (pickled: values are any picklable); one low-watermark
    timer, ``closing``, at the earliest moment something can be emitted. The rules are
    :class:`JoinWindow`'s.
    """

    closing = TimerFamily(tag="close")  # a family of one: its timer's tag is "close"

    def process_record(self, record: Record) -> None:
        st = buffer_of(self.state.get())
        self.arrived(st, record.stream, record.timestamp, record.id, record.value)
        self._save(st)

    @closing.on_fire
    def closed(self, _name: str, _timer: Timer) -> None:
        """Everything closed by the watermark goes."""
        st = buffer_of(self.state.get())
        self.close(_Own(self), st, self.low_watermark)
        self._save(st)

    def _save(self, st: JoinBuffer) -> None:
        if self.settle(_Own(self), st):
            self.state.set(st)
        else:
            self.state.clear()


class _Own:
    """:class:`JoinEffects` of the per-record join: its own calls."""

    __slots__ = ("c",)

    def __init__(self, c: WindowedJoin) -> None:
        self.c = c

    @property
    def key(self) -> Any:
        return self.c.key

    def produce(self, value: dict[str, Any], timestamp: int) -> None:
        self.c.produce(self.c.output, value, timestamp=timestamp)

    def close_at(self, timestamp: int | None) -> None:
        if timestamp is None:
            self.c.closing.delete()
        else:
            self.c.closing.set(timestamp)

    def hold(self, timestamp: int | None) -> None:
        self.c.hold_watermark(timestamp)
