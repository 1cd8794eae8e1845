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

from typing import Any, Protocol

from millwheel import Computation, ComputationError, Record, Timer

HOWS = ("inner", "left", "outer")


class JoinEffects(Protocol):
    """What the join rules of one key do: the per-record :class:`WindowedJoin` through its own
    calls, the columnar one (``columnar_join.py``) by collecting columns."""

    key: Any

    def produce(self, value: dict[str, Any], timestamp: int) -> None: ...

    def close_at(self, timestamp: int | None) -> None:
        """Set the ``close`` timer (``None``: delete it)."""

    def hold(self, timestamp: int | None) -> None: ...


class JoinWindow:
    """The windowed join's settings and its rules for one key's state ``{"L": [...], "R": [...]}``:
    the one definition both :class:`WindowedJoin` and ``ColumnarWindowedJoin`` run."""

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

    def close(self, fx: JoinEffects, st: dict[str, Any], lw: int) -> None:
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

    def settle(self, fx: JoinEffects, st: dict[str, Any]) -> bool:
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


class WindowedJoin(JoinWindow, Computation):
    """Joins ``left`` with every other input stream (the right side) per key, within
    ``[t - before_ms, t + after_ms]`` of each left record; see the module docstring.

    State: ``{"L": [[ts, id, value, [right ids]]], "R": [[ts, id, value, matched]]}``;
    one low-watermark timer, ``close``, at the earliest moment something can be emitted.
    The rules are :class:`JoinWindow`'s.
    """

    def process_record(self, record: Record) -> None:
        st = self.state.get() or {"L": [], "R": []}
        self.arrived(st, record.stream, record.timestamp, record.id, record.value)
        self._save(st)

    def process_timer(self, timer: Timer) -> None:  # noqa: ARG002 - everything closed by the watermark goes
        st = self.state.get() or {"L": [], "R": []}
        self.close(_Own(self), st, self.low_watermark)
        self._save(st)

    def _save(self, st: dict[str, Any]) -> None:
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
            self.c.delete_timer("close")
        else:
            self.c.set_timer("close", timestamp)

    def hold(self, timestamp: int | None) -> None:
        self.c.hold_watermark(timestamp)
