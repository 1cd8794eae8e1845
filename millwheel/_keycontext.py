"""What user code reaches during one per-key step, and careful mode's savepoints (``_step.py``).

:class:`StepContext` is behind ``self.key``, ``self.state``, ``self.set_timer``,
``self.produce`` ... of a :class:`~millwheel.Computation` while the step runs one key: the
key's state, timers, hold and production sequence, and the productions made so far, with
the delivery contract's rules for timers and production ids (``_contract.py``).
:class:`Careful` is the step's careful mode: a savepoint before each record and timer, a
rollback to it when user code fails (:class:`Failure`), so a key keeps the effects of its
other records.
"""

from __future__ import annotations

import heapq
from typing import Any, Protocol

from millwheel._codec import encode_value
from millwheel._computation import State
from millwheel._contract import check_output, key_life, production_id_of, timer_due
from millwheel._deadletter import Stage
from millwheel._envelope import Envelope
from millwheel._errors import ComputationError, StateCodecError
from millwheel._identity import id_prefix
from millwheel._record import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Key,
    Production,
    Record,
    TimeDomain,
    Timer,
    key_problem,
    production_time,
    short_repr,
)


class Runner(Protocol):
    """What a step's context reads of its runner (``_step.StepRunner``)."""

    name: str
    outputs: frozenset[str]
    codec: Any


_LW = int(TimeDomain.LOW_WATERMARK)
_WALL = int(TimeDomain.WALL_TIME)
DOMAINS = {_LW: TimeDomain.LOW_WATERMARK, _WALL: TimeDomain.WALL_TIME}
_LW_DOMAIN, _WALL_DOMAIN = TimeDomain.LOW_WATERMARK, TimeDomain.WALL_TIME


class Failure(Exception):
    """A record or timer failed at ``what`` (a :class:`~millwheel.Stage`)."""

    def __init__(
        self,
        exc: BaseException,
        what: str,
        record: Record | None = None,
        timer: Timer | None = None,
    ) -> None:
        super().__init__(what)
        self.exc = exc
        self.what = what
        self.record = record
        self.timer = timer


class StepContext:
    """What ``self.key``, ``self.state``, ``self.set_timer`` ... reach during one step."""

    __slots__ = (
        "runner",
        "key",
        "state",
        "now",
        "low_watermark",
        "timers",
        "productions",
        "seq",
        "default_ts",
        "due_heap",
        "firing",
        "behind_watermark",
        "held",
        "life",
        "new_life",
        "id_prefix",
    )

    def __init__(
        self,
        runner: Runner,
        key: Key,
        env: Envelope,
        low_watermark: int,
        now: int,
        new_life: int | None,
    ) -> None:
        self.runner = runner
        self.key = key
        self.state = State(runner.codec, env.state)
        self.now = now
        self.low_watermark = low_watermark
        self.timers = env.timers
        self.productions: list[Production] = []
        self.seq = env.seq
        self.default_ts = production_time(low_watermark)
        self.due_heap: list[tuple[int, int, str]] = []
        self.firing = False
        self.behind_watermark = 0
        self.held = env.held
        self.life = env.life
        #: the life the key's first production starts, if it has made none (``_identity.py``)
        self.new_life = new_life
        #: what the key's production ids hash before their sequence number, made at its first production
        self.id_prefix: str | None = None

    def set_timer(self, tag: str, timestamp: int, domain: TimeDomain) -> None:
        if (
            type(tag) is str
            and type(timestamp) is int
            and MIN_TIMESTAMP < timestamp < MAX_TIMESTAMP
            and (domain is _LW_DOMAIN or domain is _WALL_DOMAIN)
        ):
            # the usual call, valid at a glance (the checks below say what is wrong otherwise)
            d = _LW if domain is _LW_DOMAIN else _WALL
            self.timers[tag] = (timestamp, d)
            if self.firing and timer_due(timestamp, d, self.low_watermark, self.now):
                heapq.heappush(self.due_heap, (timestamp, d, tag))
            return
        name = self.runner.name
        if type(tag) is not str:
            msg = f"{name}: set_timer tag must be a str, got {type(tag).__name__} {short_repr(tag)}"
            raise ComputationError(msg)
        if type(timestamp) is not int:
            msg = f"{name}: set_timer({tag!r}) timestamp must be an int (ms since epoch), got {type(timestamp).__name__} {short_repr(timestamp)}"
            raise ComputationError(msg)
        d = int(domain) if isinstance(domain, int) else -1
        if d not in DOMAINS:
            msg = f"{name}: set_timer({tag!r}) domain must be a TimeDomain, got {domain!r}"
            raise ComputationError(msg)
        if timestamp == MAX_TIMESTAMP and d != _LW:
            msg = (
                f"{name}: set_timer({tag!r}, MAX_TIMESTAMP) on wall time would never fire; an event-time timer "
                f"at MAX_TIMESTAMP fires when the input is finished, delete_timer({tag!r}) cancels one"
            )
            raise ComputationError(msg)
        if not MIN_TIMESTAMP < timestamp <= MAX_TIMESTAMP:
            msg = f"{name}: set_timer({tag!r}) timestamp {timestamp} is outside the 64-bit range of millwheel timestamps"
            raise ComputationError(msg)
        self.timers[tag] = (timestamp, d)
        if self.firing and timer_due(timestamp, d, self.low_watermark, self.now):
            heapq.heappush(self.due_heap, (timestamp, d, tag))

    def delete_timer(self, tag: str) -> None:
        self.timers.pop(tag, None)

    def pending_timers(self) -> list[Timer]:
        return [
            Timer(tag, ts, DOMAINS[d])
            for tag, (ts, d) in sorted(
                self.timers.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0])
            )
        ]

    def hold_watermark(self, timestamp: int | None) -> None:
        if timestamp is not None and (
            type(timestamp) is not int or not MIN_TIMESTAMP < timestamp < MAX_TIMESTAMP
        ):
            msg = f"{self.runner.name}: hold_watermark takes an int timestamp (ms) or None, got {short_repr(timestamp)}"
            raise ComputationError(msg)
        self.held = timestamp

    def produce(
        self,
        stream: str,
        value: Any,
        timestamp: int | None,
        key: Key | None,
        once_id: str | None = None,
        once_tentative: bool = False,
    ) -> None:
        runner = self.runner
        if once_id is not None and (type(once_id) is not str or not once_id):
            msg = f"computation {runner.name!r}: produce({stream!r}, once_id=...) takes a non-empty str, got {short_repr(once_id)}"
            raise ComputationError(msg)
        check_output(runner.name, runner.outputs, stream)
        ts = self.default_ts if timestamp is None else timestamp
        if type(ts) is not int or not MIN_TIMESTAMP < ts < MAX_TIMESTAMP:
            msg = f"computation {runner.name!r}: produce({stream!r}) timestamp must be an int of ms inside the 64-bit range, got {type(ts).__name__} {short_repr(ts)}"
            raise ComputationError(msg)
        if key is not None:
            why = key_problem(key)
            if why is not None:
                msg = f"computation {runner.name!r}: produce({stream!r}, key=...): {why}"
                raise ComputationError(msg)
        # the value is encoded now: a value that cannot be stored fails the record (or
        # timer) that produced it, inside the per-key error boundary, and later mutations
        # of the object by user code do not change what was produced
        try:
            encoded = encode_value(value)
        except StateCodecError as exc:
            msg = f"computation {runner.name!r}: produce({stream!r}): {exc}"
            raise ComputationError(msg) from None
        if ts < self.low_watermark:
            # §4.5: a production should be no older than its sources; this one will be
            # late for every consumer
            self.behind_watermark += 1
        rkey = self.key if key is None else key
        prefix = self.id_prefix
        if prefix is None:
            self.life = key_life(
                self.life, self.seq, self.new_life
            )  # a first production starts a life
            prefix = self.id_prefix = id_prefix(runner.name, self.key, self.life)
        rid = production_id_of(prefix, self.seq)
        self.seq += 1
        self.productions.append(
            Production(
                stream,
                Record(rkey, value, ts, rid, stream),
                encoded,
                once_id,
                once_tentative and once_id is not None,
            )
        )

    # ---- careful mode: a savepoint before each record or timer -----------------------
    def savepoint(self, state_bytes: bytes | None) -> tuple[Any, ...]:
        return (
            state_bytes,
            dict(self.timers),
            len(self.productions),
            self.seq,
            self.behind_watermark,
            self.held,
        )

    def rollback(self, sp: tuple[Any, ...]) -> None:
        state_bytes, timers, n, self.seq, self.behind_watermark, self.held = sp
        self.state.reset(state_bytes)  # the same object: the computation holds it for the step
        self.timers.clear()
        self.timers.update(timers)
        del self.productions[n:]


class Careful:
    """Careful mode: a savepoint before each record and timer, a rollback to it on
    failure, so the key keeps the effects of its other records (module docstring)."""

    __slots__ = ("ctx", "failures", "saved")

    def __init__(self, ctx: StepContext, failures: list[Failure]) -> None:
        self.ctx = ctx
        self.failures = failures
        #: the state's bytes after the last record or timer that succeeded
        self.saved = ctx.state.encoded()

    def run(
        self,
        fn: Any,
        arg: Any,
        stage: str,
        *,
        record: Record | None = None,
        timer: Timer | None = None,
    ) -> bool:
        """``fn(arg)`` and the state it leaves encoded; on failure, roll back and keep the failure."""
        ctx = self.ctx
        sp = ctx.savepoint(self.saved)
        try:
            fn(arg)
        except Exception as exc:
            ctx.rollback(sp)
            self.failures.append(Failure(exc, stage, record=record, timer=timer))
            return False
        try:
            self.saved = ctx.state.encoded()
        except Exception as exc:
            ctx.rollback(sp)
            self.failures.append(
                Failure(
                    exc,
                    Stage.CHECKPOINT if record is not None else stage,
                    record=record,
                    timer=timer,
                )
            )
            return False
        return True
