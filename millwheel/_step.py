"""The per-key step: the one pure function both backends run (docs/architecture.md "One semantics, two backends").

``StepRunner.step(key, envelope, records, low_watermark=..., now=...)`` takes one key's
stored envelope and its new input, and returns the new envelope, the productions, the
dead letters and counters. It performs, per record, MillWheel's exactly-once sequence
(§6.1.1): dedup check, late check (§4.5), user code; then it fires the key's due timers in
timestamp order (§4.6), including timers that ``process_timer`` sets and that are
already due; then it folds the new record ids into the dedup index and garbage-collects
old ones. The in-memory harness and the Spark runtime differ only in where envelopes are
stored and how productions travel.

Failure handling: everything that can fail for one record or timer — user code, a value
that cannot be encoded (checked when produced), state that cannot be encoded — fails that
record or timer only. The step then runs again from the stored envelope in *careful
mode*: a savepoint before each record and timer, a rollback to it on failure, so the
key keeps the effects of every other record, and each failure costs one rollback (linear
time). The failed record or timer goes to the dead-letter stream with the reason
(``millwheel/_deadletter.py``). Other records of the key, and other keys, go on.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter
from typing import Any

from millwheel._codec import decode_value, encode_value
from millwheel._computation import Computation, State, _NoKey
from millwheel._counters import StepMetrics
from millwheel._deadletter import (
    DEAD_LETTER_STREAM,
    DeadLetter,
    Stage,
    dead_letter_record,
    reason_of,
)
from millwheel._envelope import DedupStats, Envelope, PendingProduction
from millwheel._errors import ComputationError, StateCodecError
from millwheel._identity import _hexdigest, id_prefix
from millwheel._options import ComputationOptions, ErrorPolicy, LateAction
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

_LW = int(TimeDomain.LOW_WATERMARK)
_WALL = int(TimeDomain.WALL_TIME)
_DOMAINS = {_LW: TimeDomain.LOW_WATERMARK, _WALL: TimeDomain.WALL_TIME}
_LW_DOMAIN, _WALL_DOMAIN = TimeDomain.LOW_WATERMARK, TimeDomain.WALL_TIME


@dataclass(slots=True)
class StepResult:
    """What one step returns for one key."""

    #: the new envelope, or ``None`` if the key keeps nothing (delete its row)
    envelope: bytes | None
    #: productions in the order user code made them (strong and weak)
    productions: list[Production]
    #: records and timers that failed, as productions to :data:`DEAD_LETTER_STREAM`
    dead_letters: list[Production]
    metrics: StepMetrics
    #: oldest pending work kept in the envelope: low-watermark timers, pending productions
    hold: int | None
    #: earliest pending low-watermark timer and wall-time timer, for scheduling the next fire
    next_low_watermark_timer: int | None = None
    next_wall_timer: int | None = None


class _Failure(Exception):
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


class _KeyContext:
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
        runner: StepRunner,
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

    def _is_due(self, ts: int, domain: int) -> bool:
        return ts <= (self.low_watermark if domain == _LW else self.now)

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
            if self.firing and self._is_due(timestamp, d):
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
        if d not in _DOMAINS:
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
        if self.firing and self._is_due(timestamp, d):
            heapq.heappush(self.due_heap, (timestamp, d, tag))

    def delete_timer(self, tag: str) -> None:
        self.timers.pop(tag, None)

    def pending_timers(self) -> list[Timer]:
        return [
            Timer(tag, ts, _DOMAINS[d])
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
        if stream not in runner.outputs:
            declared = ", ".join(sorted(runner.outputs)) or "none"
            msg = (
                f"computation {runner.name!r} produced to stream {stream!r}, which it does not declare "
                f"(declared outputs: {declared}); add it to outputs=[...] in Topology.computation"
            )
            raise ComputationError(msg)
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
            if self.life is None and self.seq == 0:
                self.life = self.new_life  # the key's first production: it starts a life
            prefix = self.id_prefix = id_prefix(runner.name, self.key, self.life)
        rid = _hexdigest(f"{prefix}{self.seq}".encode())
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


class StepRunner:
    """Runs the per-key step for one computation instance."""

    def __init__(
        self,
        computation: Computation,
        *,
        name: str,
        outputs: Iterable[str],
        options: ComputationOptions | None = None,
    ) -> None:
        self.computation = computation
        self.name = name
        self.options = options or type(computation).options
        self.codec = self.options.state_codec
        outs = set(outputs)
        if self.options.late.action is LateAction.TO_STREAM and self.options.late.stream:
            outs.add(self.options.late.stream)
        self.outputs = frozenset(outs)
        computation.name = name
        computation._ctx = _NoKey(name)  # type: ignore[assignment]

    # ------------------------------------------------------------------------------
    def step(
        self,
        key: Key,
        envelope: bytes | None,
        records: Sequence[Record] = (),
        *,
        low_watermark: int,
        now: int,
        late_watermark: int | None = None,
        life: int | None = None,
    ) -> StepResult:
        """Process ``records`` for ``key`` then fire its due timers; see the module docstring.

        ``low_watermark`` is the input low watermark: low-watermark timers at or before it
        fire. A record is late if its timestamp is below ``late_watermark`` (default:
        ``low_watermark``): the backend passes the watermark that was in force when the
        records were delivered. Dedup ids older than the smaller of the two, minus the
        slack, are collected.

        ``life``: the life the key starts if it makes its first production (since it was
        made from nothing) in this step (``millwheel/_identity.py``: fixed by the batch, so a
        replay numbers its productions alike and a key forgotten and made again later does
        not); ``None``: none known, ids of the key and its sequence alone (as envelopes
        written before lives keep).

        The backend must not pass a ``low_watermark`` beyond input it has already
        delivered for this key and not yet stepped: such records would find their windows
        closed (``millwheel/_delivery.py``'s ``plan_steps`` cuts a key's input so).
        """
        late_wm = low_watermark if late_watermark is None else late_watermark
        try:
            try:
                return self._attempt(
                    key, envelope, records, low_watermark, now, late_wm, None, life
                )
            except _Failure as failure:
                if self.options.on_error is ErrorPolicy.RAISE:
                    raise failure.exc from None
            # something failed: run the step again from the stored envelope, with a
            # savepoint before each record and timer, so each failure costs one rollback
            # (linear in the step's input however many records fail)
            return self._attempt(key, envelope, records, low_watermark, now, late_wm, [], life)
        finally:
            self.computation._ctx = _NoKey(self.name)  # type: ignore[assignment]
            self.computation.__dict__.pop("state", None)

    def _dead_letter(self, key: Key, failure: _Failure, now: int) -> Production | None:
        """The dead letter of a failure; ``None`` for a dead letter that failed (terminal rule)."""
        rec, timer = failure.record, failure.timer
        if rec is not None and rec.stream == DEAD_LETTER_STREAM:
            return None
        letter = DeadLetter(
            failure.what,
            reason_of(failure.exc),
            computation=self.name,
            stream=rec.stream if rec else None,
            key=key,
            record=rec,
            timer=timer,
        )
        parts: tuple[Any, ...]
        if timer is not None:
            ts, parts = timer.timestamp, (key, timer.tag, timer.timestamp, int(timer.domain))
        else:
            ts, parts = (
                (rec.timestamp if rec is not None else now),
                (rec.id if rec is not None else key,),
            )
        return Production(DEAD_LETTER_STREAM, dead_letter_record(letter, ts, *parts))

    def _attempt(
        self,
        key: Key,
        envelope: bytes | None,
        records: Sequence[Record],
        low_watermark: int,
        now: int,
        late_wm: int,
        failures: list[_Failure] | None,
        life: int | None = None,
    ) -> StepResult:
        """One run of the step. ``failures is None``: the fast mode, which raises
        :class:`_Failure` at the first failure; a list: careful mode (:class:`_Careful`),
        which rolls back to a savepoint and collects each failure."""
        comp = self.computation
        env = Envelope.decode(envelope)
        ctx = _KeyContext(self, key, env, low_watermark, now, life)
        comp._ctx = ctx
        comp.__dict__["state"] = ctx.state  # see Computation.state
        c = StepMetrics()
        stats = DedupStats()
        careful = None if failures is None else _Careful(ctx, failures)
        records, any_late = self._admit(env, records, late_wm, c, stats)
        if not any_late and careful is None:
            self._records_fast(ctx, records, c)  # the common case: nothing late, nothing failed
        else:
            self._records(ctx, records, late_wm, c, careful)
        self._fire_timers(ctx, c, careful)
        return self._checkpoint(key, env, ctx, c, stats, careful, late_wm)

    def _admit(
        self,
        env: Envelope,
        records: Sequence[Record],
        late_wm: int,
        c: StepMetrics,
        stats: DedupStats,
    ) -> tuple[Sequence[Record], bool]:
        """Dedup (§6.1.1): the step's records not seen before, and whether any is late."""
        n = c.records_in = len(records)
        if not n:
            return records, False
        tss = list(map(_timestamp_of, records))
        in_order = tss == sorted(
            tss
        )  # records usually arrive in time order: the oldest is the first
        any_late = (tss[0] if in_order else min(tss)) < late_wm
        dedup = env.dedup if self.options.exactly_once else None
        if dedup is not None:
            # one call for the whole step: fingerprints and Bloom checks in C-level passes.
            # A late record is remembered under the watermark it was late for, so a
            # re-delivery is a duplicate and not counted late again
            kept = dedup.admit(
                list(map(_id_of, records)),
                [t if t >= late_wm else late_wm for t in tss] if any_late else tss,
                stats,
                in_order,
            )
            if kept is not None:
                records = list(compress(records, kept))
                c.duplicates = n - len(records)
        return records, any_late

    def _records_fast(self, ctx: _KeyContext, records: Sequence[Record], c: StepMetrics) -> None:
        """``process_record`` for each record, none late: the per-record hot loop."""
        process_record = self.computation.process_record
        rec = None
        try:
            for rec in records:
                ctx.default_ts = rec.timestamp
                process_record(rec)
        except Exception as exc:
            raise _Failure(exc, Stage.PROCESS_RECORD, record=rec) from None
        c.processed = len(records)

    def _records(
        self,
        ctx: _KeyContext,
        records: Sequence[Record],
        late_wm: int,
        c: StepMetrics,
        careful: _Careful | None,
    ) -> None:
        """Records some of which are late (§4.5: counted, then dropped, sent to the late
        stream or processed), or any records in careful mode."""
        late = self.options.late
        process_record = self.computation.process_record
        for rec in records:
            ts = rec.timestamp
            if ts < late_wm:
                c.late += 1
                if late.action is LateAction.DROP:
                    c.late_dropped += 1
                    continue
                if late.action is LateAction.TO_STREAM:
                    c.late_to_stream += 1
                    ctx.productions.append(Production(late.stream, rec))  # type: ignore[arg-type]
                    continue
            ctx.default_ts = ts
            if careful is not None:
                if careful.run(process_record, rec, Stage.PROCESS_RECORD, record=rec):
                    c.processed += 1
                continue
            try:
                process_record(rec)
            except Exception as exc:
                raise _Failure(exc, Stage.PROCESS_RECORD, record=rec) from None
            c.processed += 1

    def _fire_timers(self, ctx: _KeyContext, c: StepMetrics, careful: _Careful | None) -> None:
        """Due timers in timestamp order (§4.6), including ones set while firing that are due."""
        timers = ctx.timers
        if not timers:
            return
        heap = ctx.due_heap
        low_watermark, now = ctx.low_watermark, ctx.now
        for tag, (ts, d) in timers.items():
            if ts <= (low_watermark if d == _LW else now):
                heap.append((ts, d, tag))
        if not heap:
            return
        heapq.heapify(heap)
        ctx.firing = True
        budget = self.options.max_timer_fires_per_step
        process_timer = self.computation.process_timer
        while heap:
            ts, d, tag = heapq.heappop(heap)
            if timers.get(tag) != (ts, d):
                continue  # replaced or deleted since it was queued
            if budget == 0:
                c.timers_deferred += 1 + sum(1 for t in heap if timers.get(t[2]) == (t[0], t[1]))
                break
            budget -= 1
            del timers[tag]  # a failed timer stays deleted: it is dead-lettered
            timer = Timer(tag, ts, _DOMAINS[d])
            ctx.default_ts = production_time(ts if d == _LW else low_watermark)
            if careful is not None:
                if careful.run(process_timer, timer, Stage.PROCESS_TIMER, timer=timer):
                    c.timers_fired += 1
                continue
            try:
                process_timer(timer)
            except Exception as exc:
                raise _Failure(exc, Stage.PROCESS_TIMER, timer=timer) from None
            c.timers_fired += 1
        ctx.firing = False

    def _checkpoint(
        self,
        key: Key,
        env: Envelope,
        ctx: _KeyContext,
        c: StepMetrics,
        stats: DedupStats,
        careful: _Careful | None,
        late_wm: int,
    ) -> StepResult:
        """The new envelope (§6.2): state, timers, sequence, hold, pending strong
        productions (§6.1.2) and dedup ids, with the step's counters and dead letters."""
        opts = self.options
        if careful is not None:
            env.state = careful.saved
        else:
            try:
                env.state = ctx.state.encoded()
            except Exception as exc:
                raise _Failure(exc, Stage.CHECKPOINT) from None  # careful mode finds the culprit
        env.seq, env.life = ctx.seq, ctx.life
        env.held = ctx.held
        productions = ctx.productions
        c.productions = len(productions)
        c.productions_behind_watermark = ctx.behind_watermark
        if opts.strong_productions and productions:
            env.pending.extend(
                PendingProduction(
                    p.stream,
                    p.record.key,
                    p.encoded if p.encoded is not None else encode_value(p.record.value),
                    p.record.timestamp,
                    p.record.id,
                )
                for p in productions
            )
        if opts.exactly_once:
            dd = opts.dedup
            # ids of records that may still be re-delivered: anything not behind the watermark
            # these records arrived under (later deliveries are judged against a later one)
            horizon = min(ctx.low_watermark, late_wm) - dd.slack_ms
            env.dedup.finish(horizon, dd.bloom_fpr, dd.bloom_capacity, dd.gc_interval_ms, stats)
        c.bloom_maybe, c.bloom_false_positive = stats.bloom_maybe, stats.bloom_false_positive
        c.dedup_gc_runs, c.dedup_ids_collected = stats.gc_runs, stats.ids_collected
        if careful is not None and careful.failures:
            letters = [self._dead_letter(key, f, ctx.now) for f in careful.failures]
            dead = [d for d in letters if d is not None]
            c.dead_letters = len(dead)
            c.dead_letters_dropped = len(letters) - len(dead)
        else:
            dead = []
        hold, next_lw, next_wall = env.schedule()
        return StepResult(
            envelope=None if env.is_empty() else env.encode(),
            productions=productions,
            dead_letters=dead,
            metrics=c,
            hold=hold,
            next_low_watermark_timer=next_lw,
            next_wall_timer=next_wall,
        )


class _Careful:
    """Careful mode: a savepoint before each record and timer, a rollback to it on
    failure, so the key keeps the effects of its other records (module docstring)."""

    __slots__ = ("ctx", "failures", "codec", "saved")

    def __init__(self, ctx: _KeyContext, failures: list[_Failure]) -> None:
        self.ctx = ctx
        self.failures = failures
        self.codec = ctx.runner.codec
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
            self.failures.append(_Failure(exc, stage, record=record, timer=timer))
            return False
        try:
            self.saved = _encoded(ctx.state, self.codec)
        except Exception as exc:
            ctx.rollback(sp)
            self.failures.append(
                _Failure(
                    exc,
                    Stage.CHECKPOINT if record is not None else stage,
                    record=record,
                    timer=timer,
                )
            )
            return False
        return True


#: a record's timestamp and id, for C-level passes over a step's records
_timestamp_of = attrgetter("timestamp")
_id_of = attrgetter("id")


def _encoded(state: State, codec: Any) -> bytes | None:
    """The state's bytes as of now (careful mode), without changing what the step stores."""
    if not state.dirty:
        return state._raw
    return None if state._value is None else codec.encode(state._value)


def pending_productions(envelope: bytes | None) -> list[Production]:
    """The strong productions checkpointed in an envelope and not yet acknowledged (§6.1.2)."""
    env = Envelope.decode(envelope)
    return [
        Production(
            p.stream, Record(p.key, decode_value(p.value), p.timestamp, p.id, p.stream), p.value
        )
        for p in env.pending
    ]


def acknowledge(
    envelope: bytes | None, ids: Iterable[str] | None = None
) -> tuple[bytes | None, int | None]:
    """Drop acknowledged pending productions (all if ``ids`` is None) from an envelope.

    Returns the new envelope (``None``: nothing left to keep) and its hold (oldest pending work).
    """
    env = Envelope.decode(envelope)
    if env.pending:
        if ids is None:
            env.pending = []
        else:
            acked = set(ids)
            env.pending = [p for p in env.pending if p.id not in acked]
        envelope = None if env.is_empty() else env.encode()
    return envelope, env.hold()
