"""The per-key step: the one pure function both backends run (docs/architecture.md "One semantics, two backends").

``StepRunner.step(key, envelope, records, low_watermark=..., now=...)`` takes one key's
stored envelope and its new input, and returns the new envelope, the productions, the
dead letters and counters. It performs, per record, MillWheel's exactly-once sequence
(§6.1.1): dedup check, late check (§4.5), user code; then it fires the key's due timers in
timestamp order (§4.6), including timers that ``process_timer`` sets and that are
already due; then it folds the new record ids into the dedup index and garbage-collects
old ones. The in-memory harness and the Spark runtime differ only in where envelopes are
stored and how productions travel. The rules it applies — dedup stamps and horizon, the late
rule and policy, timer order, dead letters, production lives and ids — are the delivery
contract's (``_contract.py``), which the columnar runner applies too; what user code
reaches during the step, and careful mode's savepoints, are ``_keycontext.py``.

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
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter

from millwheel._codec import decode_value, encode_value
from millwheel._computation import Computation, _NoKey
from millwheel._contract import (
    LateRule,
    dedup_horizon,
    dedup_stamp,
    due_timers,
    failure_letter,
    unacknowledged,
)
from millwheel._counters import StepMetrics
from millwheel._deadletter import Stage
from millwheel._envelope import DedupStats, Envelope, PendingProduction
from millwheel._keycontext import DOMAINS, Careful, Failure, StepContext
from millwheel._options import ComputationOptions, ErrorPolicy, LateAction
from millwheel._record import Key, Production, Record, TimeDomain, Timer, production_time
from millwheel._versions import located

_LW = int(TimeDomain.LOW_WATERMARK)


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
        self.late = LateRule(self.options.late)
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
        late_watermark: int | Sequence[int] | None = None,
        life: int | None = None,
    ) -> StepResult:
        """Process ``records`` for ``key`` then fire its due timers; see the module docstring.

        ``low_watermark`` is the input low watermark: low-watermark timers at or before it
        fire. A record is late if its timestamp is below ``late_watermark`` (default:
        ``low_watermark``): the backend passes the watermark that was in force when the
        records were delivered, or one per record when they arrived under several
        (``_delivery.plan_steps``). Dedup ids older than the smaller of the two (the oldest
        of several), minus the slack, are collected; in a step without records, older than
        the low watermark less the slack (any later delivery arrives under a watermark at
        least as new).

        ``life``: the life the key starts if it makes its first production (since it was
        made from nothing) in this step (``millwheel/_identity.py``: fixed by the batch, so a
        replay numbers its productions alike and a key forgotten and made again later does
        not); ``None``: none known, ids of the key and its sequence alone (as envelopes
        written before lives keep).

        The backend must not pass a ``low_watermark`` beyond input it has already
        delivered for this key and not yet stepped: such records would find their windows
        closed (``millwheel/_delivery.py``'s ``plan_steps`` cuts a key's input so).
        """
        late_wm: int | list[int]
        if isinstance(late_watermark, (list, tuple)):  # one per record (``plan_steps``)
            late_wm = list(late_watermark)
        else:
            late_wm = low_watermark if late_watermark is None else late_watermark  # type: ignore[assignment]
        try:
            try:
                return self._attempt(
                    key, envelope, records, low_watermark, now, late_wm, None, life
                )
            except Failure as failure:
                if self.options.on_error is ErrorPolicy.RAISE:
                    raise located(failure.exc, self.name, key) from None
            # something failed: run the step again from the stored envelope, with a
            # savepoint before each record and timer, so each failure costs one rollback
            # (linear in the step's input however many records fail)
            return self._attempt(key, envelope, records, low_watermark, now, late_wm, [], life)
        finally:
            self.computation._ctx = _NoKey(self.name)  # type: ignore[assignment]
            self.computation.__dict__.pop("state", None)

    def _dead_letter(self, key: Key, failure: Failure, now: int) -> Production | None:
        """The dead letter of a failure; ``None`` for a dead letter that failed (terminal rule)."""
        exc = located(failure.exc, self.name, key)  # a state version error names its key
        return failure_letter(self.name, key, exc, failure.what, failure.record, failure.timer, now)

    def _attempt(
        self,
        key: Key,
        envelope: bytes | None,
        records: Sequence[Record],
        low_watermark: int,
        now: int,
        late_wm: int | list[int],
        failures: list[Failure] | None,
        life: int | None = None,
    ) -> StepResult:
        """One run of the step. ``failures is None``: the fast mode, which raises
        :class:`Failure` at the first failure; a list: careful mode (:class:`Careful`),
        which rolls back to a savepoint and collects each failure."""
        comp = self.computation
        env = Envelope.decode(envelope)
        ctx = StepContext(self, key, env, low_watermark, now, life)
        comp._ctx = ctx
        comp.__dict__["state"] = ctx.state  # see Computation.state
        c = StepMetrics()
        stats = DedupStats()
        careful = None if failures is None else Careful(ctx, failures)
        # a step without records delivered none under an older watermark: its ids are judged
        # against the low watermark alone (a later delivery arrives under a later one)
        arrived = (min(late_wm) if isinstance(late_wm, list) else late_wm) if records else None
        records, late = self._admit(env, records, late_wm, c, stats)
        if late is None and careful is None:
            self._records_fast(ctx, records, c)  # the common case: nothing late, nothing failed
        else:
            self._records(ctx, records, late, c, careful)
        self._fire_timers(ctx, c, careful)
        return self._checkpoint(key, env, ctx, c, stats, careful, arrived)

    def _admit(
        self,
        env: Envelope,
        records: Sequence[Record],
        late_wm: int | list[int],
        c: StepMetrics,
        stats: DedupStats,
    ) -> tuple[Sequence[Record], list[bool] | None]:
        """Dedup (§6.1.1): the step's records not seen before, and which are late (``None``:
        none). ``late_wm``: the watermark they arrived under, or each record's."""
        n = c.records_in = len(records)
        if not n:
            return records, None
        tss = list(map(_timestamp_of, records))
        in_order = tss == sorted(
            tss
        )  # records usually arrive in time order: the oldest is the first
        lates: Sequence[int]
        if isinstance(late_wm, list):
            lates = late_wm
            any_late = any(map(operator.lt, tss, lates))
        else:
            any_late = (tss[0] if in_order else min(tss)) < late_wm
            lates = (late_wm,) * n if any_late else ()
        dedup = env.dedup if self.options.exactly_once else None
        if dedup is not None:
            # one call for the whole step: fingerprints and Bloom checks in C-level passes.
            # A late record is remembered under the watermark it was late for, so a
            # re-delivery is a duplicate and not counted late again
            kept = dedup.admit(
                list(map(_id_of, records)),
                list(map(dedup_stamp, tss, lates)) if any_late else tss,
                stats,
                in_order,
            )
            if kept is not None:
                records = list(compress(records, kept))
                c.duplicates = n - len(records)
                if any_late:
                    tss, lates = list(compress(tss, kept)), list(compress(lates, kept))
        return records, list(map(operator.lt, tss, lates)) if any_late else None

    def _records_fast(self, ctx: StepContext, records: Sequence[Record], c: StepMetrics) -> None:
        """``process_record`` for each record, none late: the per-record hot loop."""
        process_record = self.computation.process_record
        rec = None
        try:
            for rec in records:
                ctx.default_ts = rec.timestamp
                process_record(rec)
        except Exception as exc:
            raise Failure(exc, Stage.PROCESS_RECORD, record=rec) from None
        c.processed = len(records)

    def _records(
        self,
        ctx: StepContext,
        records: Sequence[Record],
        lates: list[bool] | None,
        c: StepMetrics,
        careful: Careful | None,
    ) -> None:
        """Records some of which are late (``lates``, one flag per record; ``None``: none is)
        (§4.5: counted, then dropped, sent to the late stream or processed), or any records
        in careful mode."""
        late = self.late
        process_record = self.computation.process_record
        for rec, is_late in zip(records, lates or repeat(False, len(records)), strict=True):
            ts = rec.timestamp
            if is_late:
                action = late.route(c)
                if action is LateAction.DROP:
                    continue
                if action is LateAction.TO_STREAM:
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
                raise Failure(exc, Stage.PROCESS_RECORD, record=rec) from None
            c.processed += 1

    def _fire_timers(self, ctx: StepContext, c: StepMetrics, careful: Careful | None) -> None:
        """Due timers in timestamp order (§4.6), including ones set while firing that are due."""
        timers = ctx.timers
        if not timers:
            return
        heap = ctx.due_heap
        low_watermark, now = ctx.low_watermark, ctx.now
        heap += due_timers(timers, low_watermark, now)  # popped in ``timer_order``
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
            timer = Timer(tag, ts, DOMAINS[d])
            ctx.default_ts = production_time(ts if d == _LW else low_watermark)
            if careful is not None:
                if careful.run(process_timer, timer, Stage.PROCESS_TIMER, timer=timer):
                    c.timers_fired += 1
                continue
            try:
                process_timer(timer)
            except Exception as exc:
                raise Failure(exc, Stage.PROCESS_TIMER, timer=timer) from None
            c.timers_fired += 1
        ctx.firing = False

    def _checkpoint(
        self,
        key: Key,
        env: Envelope,
        ctx: StepContext,
        c: StepMetrics,
        stats: DedupStats,
        careful: Careful | None,
        arrived: int | None,
    ) -> StepResult:
        """The new envelope (§6.2): state, timers, sequence, hold, pending strong
        productions (§6.1.2) and dedup ids, with the step's counters and dead letters.
        ``arrived``: the watermark the step's records arrived under (``None``: it had none)."""
        opts = self.options
        if careful is not None:
            env.state = careful.saved
        else:
            try:
                env.state = ctx.state.encoded()
            except Exception as exc:
                raise Failure(exc, Stage.CHECKPOINT) from None  # careful mode finds the culprit
        env.seq, env.life = ctx.seq, ctx.life
        env.held = ctx.held
        productions = ctx.productions
        # records the late policy sent on are not productions of user code (``_counters.COUNTERS``)
        c.productions = len(productions) - c.late_to_stream
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
            horizon = dedup_horizon(ctx.low_watermark, arrived, dd.slack_ms)
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
        if opts.exactly_once:
            next_lw = env.collect_wake(next_lw, opts.dedup.slack_ms, opts.dedup.gc_interval_ms)
        return StepResult(
            envelope=None if env.is_empty() else env.encode(),
            productions=productions,
            dead_letters=dead,
            metrics=c,
            hold=hold,
            next_low_watermark_timer=next_lw,
            next_wall_timer=next_wall,
        )


#: a record's timestamp and id, for C-level passes over a step's records
_timestamp_of = attrgetter("timestamp")
_id_of = _pending_id = attrgetter("id")


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
        env.pending = unacknowledged(env.pending, ids, _pending_id)
        envelope = None if env.is_empty() else env.encode()
    return envelope, env.hold()
