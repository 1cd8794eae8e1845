"""Delivery: everything between a stream and the per-key step, shared by both backends.

The per-key step (``_step.py``) is one pure function; this module is the rest of the
delivery path, also pure, so that the in-memory harness is only queues and clocks and
the Spark interval function only Arrow/pandas plumbing around the same calls:

* :func:`record_problem` — what is wrong with a record's id or timestamp, checked where
  records enter (injectors, ``Harness.inject``), so a bad one becomes a dead letter at
  the boundary instead of stalling a key downstream;
* :func:`key_record` — the consumer's key extractor applied to a record (MillWheel
  §4.2): a keyed record carrying its input stream, or a dead letter with the reason;
* :func:`plan_steps` — a key's delivered records cut into step calls: each call allowed
  to fire timers only up to what the key's next, still unprocessed, records allow (§4.6),
  each record judged late against the watermark it arrived under (§4.5);
* :func:`timers_due` — whether a key without input has a timer to fire;
* :func:`run_key` — the per-key loop both backends run: a key's delivered records
  through :func:`plan_steps` and the step, with its counters, into a :class:`KeyOutcome`;
  :func:`commit_once` — a round's ``once_id`` productions committed in one call;
* :func:`low_watermark` — the one formula of a computation's low watermark (§4.5, §7.2).

>>> from millwheel._record import Record
>>> rec = Record(None, {"query": "cats"}, 1_500, "r1")
>>> keyed, dead = key_record("Counter", "queries", lambda r: r.value["query"], rec)
>>> keyed.key, keyed.stream, dead
('cats', 'queries', None)
>>> keyed, dead = key_record("Counter", "queries", lambda r: r.value["nope"], rec)
>>> keyed, dead.value.stage, dead.value.reason
(None, 'key_extractor', "KeyError: 'nope'")
>>> [(len(s.records), s.late_watermark, s.low_watermark) for s in plan_steps([(rec, 1_000), (rec, 2_000)], 5_000)]
[(1, 1000, 2000), (1, 2000, 5000)]
>>> [(s.late_watermark, s.low_watermark) for s in plan_steps([(rec, None)], 5_000, arrival=1_200)]
[(1200, 5000)]
>>> [(len(s.records), s.late_watermark, s.low_watermark) for s in plan_steps([(rec, 1_000), (rec, 2_000)], 900)]
[(2, [1000, 2000], 900)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from millwheel._counters import StepMetrics
from millwheel._deadletter import (
    DEAD_LETTER_STREAM,
    DeadLetter,
    Stage,
    dead_letter_record,
    reason_of,
)
from millwheel._errors import KeyExtractorError
from millwheel._identity import call_life
from millwheel._once import OnceOutcome, OnceRegistry, resolve_once
from millwheel._options import ErrorPolicy
from millwheel._record import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Key,
    Production,
    Record,
    key_problem,
    short_repr,
    utf8_text,
)

if TYPE_CHECKING:
    from millwheel._step import StepRunner


def record_problem(record: Any) -> str | None:
    """Why ``record`` cannot enter a stream, or ``None`` if it can.

    The id must be a non-empty ``str`` (exactly-once deduplicates on it, §6.1.1), the
    timestamp an ``int`` of milliseconds strictly between ``MIN_TIMESTAMP`` and
    ``MAX_TIMESTAMP`` (which mean "nothing known" and "finished", §4.5).

    >>> record_problem(Record(None, 1, 1_000, "a")) is None
    True
    >>> record_problem(Record(None, 1, "1000", "a"))
    "timestamp must be an int (ms since the epoch), got str '1000'"
    >>> record_problem(Record(None, 1, 1_000, "a\\ud800"))
    "id 'a\\\\ud800' holds a lone surrogate: it has no UTF-8 form to deduplicate and store it by"
    """
    if not isinstance(record, Record):
        return f"expected a millwheel Record, got {type(record).__name__}"
    rid = record.id
    if type(rid) is not str or not rid:
        return f"id must be a non-empty str (exactly-once deduplicates on it), got {type(rid).__name__} {short_repr(rid)}"
    if not utf8_text(rid):
        return f"id {short_repr(rid)} holds a lone surrogate: it has no UTF-8 form to deduplicate and store it by"
    ts = record.timestamp
    if type(ts) is not int:
        return f"timestamp must be an int (ms since the epoch), got {type(ts).__name__} {short_repr(ts)}"
    if not MIN_TIMESTAMP < ts < MAX_TIMESTAMP:
        return f"timestamp {ts} is outside the 64-bit range of millwheel timestamps"
    return None


def invalid_record(
    injector: str, stream: str, record: Any, problem: str, seq: int | tuple[int, ...]
) -> Record:
    """The dead letter of a record refused at an injector boundary (``seq``: its position,
    a number or a tuple of them)."""
    rec = record if isinstance(record, Record) else None
    ts = (
        rec.timestamp
        if rec is not None
        and type(rec.timestamp) is int
        and MIN_TIMESTAMP < rec.timestamp < MAX_TIMESTAMP
        else MIN_TIMESTAMP
    )
    letter = DeadLetter(Stage.INVALID_RECORD, problem, injector=injector, stream=stream, record=rec)
    return dead_letter_record(letter, ts, short_repr(getattr(rec, "id", None)), seq)


def key_record(
    consumer: str,
    stream: str,
    extractor: Callable[[Record], Any],
    record: Record,
    on_error: ErrorPolicy = ErrorPolicy.DEAD_LETTER,
) -> tuple[Record | None, Record | None]:
    """Apply ``consumer``'s key extractor for ``stream`` to ``record`` (§4.2).

    Returns ``(keyed record, None)`` — the record with the consumer's key and ``stream`` —
    or ``(None, dead letter)`` when the extractor raises or returns something that is not
    a key. A dead letter read from :data:`DEAD_LETTER_STREAM` that its consumer cannot
    key gives ``(None, None)``: dead letters of dead letters are not made (the caller
    counts it as ``dead_letters_dropped``), so dead-letter consumers never loop.

    The one keying-failure rule of both backends: under ``ErrorPolicy.RAISE`` (the
    consumer's ``on_error``) a failed extractor raises :class:`KeyExtractorError` instead
    (the harness raises it to the test; on Spark it fails the consumer's query with this
    message), as a failing ``process_record`` does.
    """
    try:
        key = extractor(record)
        why = key_problem(key)
    except Exception as exc:
        why = reason_of(exc)
    else:
        if why is None:
            return Record(key, record.value, record.timestamp, record.id, stream), None
        why = f"TypeError: the key extractor returned an invalid key: {why}"
    if stream == DEAD_LETTER_STREAM:
        return None, None
    if on_error is ErrorPolicy.RAISE:
        msg = f"computation {consumer!r}: its key extractor failed: {why} (stream {stream!r}, record {record.id!r})"
        raise KeyExtractorError(msg)
    letter = DeadLetter(
        Stage.KEY_EXTRACTOR, why, computation=consumer, stream=stream, record=record
    )
    return None, dead_letter_record(letter, record.timestamp, record.id)


@dataclass(slots=True)
class StepInput:
    """One call of the per-key step: records, the timers' watermark, the lateness watermark."""

    records: list[Record]
    #: low-watermark timers at or before it fire
    low_watermark: int
    #: records older than it are late (§4.5); a list: each record's, for a call whose records
    #: arrived under several watermarks
    late_watermark: int | list[int]


def plan_steps(
    items: Sequence[tuple[Record, int | None]], low_watermark: int, arrival: int | None = None
) -> list[StepInput]:
    """Cut one key's delivered ``(record, arrival watermark)`` pairs into step calls.

    A record is late if it is older than the watermark it arrived under (``None``: the
    watermark in force when it was delivered, ``arrival``; by default the current
    ``low_watermark``: a runtime batch whose heartbeat raised it passes the watermark
    before), whatever batch it travels in; dead letters are never late. Records are put back in the
    order they were sent — arrival watermarks only grow, so a stable sort on them restores
    it across files a Spark batch read in any order — and cut into runs of one arrival
    watermark (almost always a single run). A run may fire low-watermark timers only up
    to the next run's arrival watermark (and the batch's): the next run's records are not
    late, so their windows must still be open. Runs whose calls would see the same
    watermark are one call — nothing could fire between them that does not fire after them
    all — in which each record is still judged against its own arrival watermark (the
    call's ``late_watermark`` is then a list). With no records, one call fires the due timers.
    """
    if not items:
        return [StepInput([], low_watermark, low_watermark)]
    unknown = low_watermark if arrival is None else arrival
    w0 = items[0][1]
    if all(w == w0 for _, w in items) and all(r.stream != DEAD_LETTER_STREAM for r, _ in items):
        # the common case, without the general path's bookkeeping: one arrival watermark, one run
        return [StepInput([r for r, _ in items], low_watermark, unknown if w0 is None else w0)]
    # dead letters are never late: they record that something failed, whenever it happens
    late = [
        MIN_TIMESTAMP if r.stream == DEAD_LETTER_STREAM else unknown if w is None else w
        for r, w in items
    ]
    order = list(range(len(items)))
    if any(w != late[0] for w in late):
        order.sort(key=late.__getitem__)  # stable
    # runs of one arrival watermark, each seeing the next one's (capped by the batch's)
    runs: list[tuple[int, list[int]]] = []
    for i in order:
        if runs and late[runs[-1][1][0]] == late[i]:
            runs[-1][1].append(i)
        else:
            runs.append((low_watermark, [i]))
    runs = [
        (min(low_watermark, late[nxt[1][0]]), rows)
        for (_, rows), nxt in zip(runs, runs[1:], strict=False)
    ] + [runs[-1]]
    # one call per watermark seen: runs whose calls would see the same one are one call, each
    # record still judged against its own arrival watermark (``_contract.py``)
    merged: list[tuple[int, list[int]]] = []
    for seen, rows in runs:
        if merged and merged[-1][0] == seen:
            merged[-1][1].extend(rows)
        else:
            merged.append((seen, list(rows)))
    calls = []
    for seen, rows in merged:
        lates = [late[i] for i in rows]
        one = all(w == lates[0] for w in lates)
        calls.append(StepInput([items[i][0] for i in rows], seen, lates[0] if one else lates))
    return calls


def timers_due(
    next_low_watermark_timer: int | None, next_wall_timer: int | None, low_watermark: int, now: int
) -> bool:
    """Whether a key whose earliest timers are these has one to fire (§4.6)."""
    return (next_low_watermark_timer is not None and next_low_watermark_timer <= low_watermark) or (
        next_wall_timer is not None and next_wall_timer <= now
    )


def count_keying(metrics: StepMetrics, dropped: bool) -> None:
    """Count a record its consumer could not key: a dead letter, or (``dropped``) a dead
    letter that failed again, which makes none."""
    metrics.records_in += 1
    if dropped:
        metrics.dead_letters_dropped += 1
    else:
        metrics.dead_letters += 1


@dataclass(slots=True)
class KeyOutcome:
    """What one key's share of a round leaves: its new envelope and what to schedule, and
    what it sent."""

    #: the new envelope, ``None``: the key keeps nothing
    envelope: bytes | None
    #: oldest pending work kept in the envelope (low-watermark timers, pending productions)
    hold: int | None = None
    next_low_watermark_timer: int | None = None
    next_wall_timer: int | None = None
    #: what user code produced, in order, and the dead letters of its failures
    productions: list[Production] = field(default_factory=list)
    dead_letters: list[Production] = field(default_factory=list)

    @property
    def keeps_nothing_to_schedule(self) -> bool:
        return (
            self.hold is None
            and self.next_low_watermark_timer is None
            and self.next_wall_timer is None
        )


def run_key(
    runner: StepRunner,
    key: Key,
    envelope: bytes | None,
    items: Sequence[tuple[Record, int | None]],
    *,
    low_watermark: int,
    now: int,
    metrics: StepMetrics,
    life: int | None = None,
    arrival: int | None = None,
) -> KeyOutcome:
    """The per-key loop of both backends: ``items`` (a key's delivered ``(record, arrival
    watermark)`` pairs in send order; none: a timer is due) cut by :func:`plan_steps` and
    run through :meth:`StepRunner.step` one call after the other, the envelope of each the
    input of the next; the counters are added to ``metrics``. ``life``: the batch's
    (``_identity.py``); a key forgotten by one call starts another in the next. ``arrival``:
    the watermark a record whose own is not known arrived under (:func:`plan_steps`)."""
    out = KeyOutcome(envelope)
    res = None
    forgotten = 0
    for call in plan_steps(items, low_watermark, arrival):
        res = runner.step(
            key,
            out.envelope,
            call.records,
            low_watermark=call.low_watermark,
            now=now,
            late_watermark=call.late_watermark,
            life=call_life(life, forgotten),
        )
        out.envelope = res.envelope
        forgotten += res.envelope is None
        metrics.add(res.metrics)
        out.productions += res.productions
        out.dead_letters += res.dead_letters
    if res is not None and out.envelope is not None:
        out.hold, out.next_low_watermark_timer, out.next_wall_timer = (
            res.hold,
            res.next_low_watermark_timer,
            res.next_wall_timer,
        )
    return out


def commit_once(
    productions: Sequence[tuple[Key | None, Production]],
    registry: OnceRegistry | None,
    *,
    pipeline: str,
    computation: str,
    metrics: StepMetrics,
) -> OnceOutcome:
    """A round's ``once_id`` productions committed to the IdRegistry in one call (Photon §2),
    counted in ``metrics`` (``once_committed``, ``once_conflicts`` and the dead letters of
    ids too old to deduplicate); the caller drops ``outcome.dropped`` and sends
    ``outcome.dead_letters``."""
    outcome = resolve_once(productions, registry, pipeline=pipeline, computation=computation)
    metrics.once_committed += outcome.committed
    metrics.once_conflicts += outcome.conflicts
    metrics.dead_letters += len(outcome.dead_letters)
    return outcome


def low_watermark(oldest_work: int | None, input_low_watermark: int) -> int:
    """A computation's (or key interval's) low watermark (§4.5, §7.2): the older of its
    oldest pending work (``None``: none) and its input low watermark — the one formula of
    both backends; publishing then keeps the maximum (published values never go back).

    >>> low_watermark(None, 5_000), low_watermark(3_000, 5_000), low_watermark(7_000, 5_000)
    (5000, 3000, 5000)
    """
    return (
        input_low_watermark
        if oldest_work is None or oldest_work > input_low_watermark
        else oldest_work
    )
