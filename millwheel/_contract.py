"""The delivery contract: the rules both kinds of computation run under (docs/architecture.md
"One semantics, two backends").

A per-record computation (``_step.py``: one key's records, one call each) and a columnar one
(``_colrunner.py``: many keys' records as columns) differ in how user code is called, not in
what reaches it. Each rule of delivery is written once, here, in a scalar form for the
per-key step and, where the columnar runner needs one, a vectorised form (numpy over the
batch's columns, imported when first called: ``import millwheel`` loads no numpy for it):

* **admission** (§6.1.1): a record reaches user code once per ``(key, id)``; an id is
  remembered under :func:`dedup_stamp` (a late record under the watermark it was late
  for, so a re-delivery is a duplicate and not counted late again) and collected behind
  :func:`dedup_horizon`. The indexes (``_dedup.py`` per key, ``_coldedup.py`` per key
  interval) answer "seen before?" with a Bloom filter whose "no" is final and whose
  "maybe" the exact ids decide;
* **lateness** (§4.5): a record is late if it is older than the watermark it arrived under
  (:func:`late_watermark`, :func:`late_watermarks`); dead letters are never late; what the
  computation's :class:`~millwheel.LatePolicy` does with a late record, and how it is
  counted, is :class:`LateRule`;
* **timers** (§4.6): due at or before the low watermark (event time) or now (wall time)
  (:func:`timer_due`, :func:`due_timers`, :func:`timers_due`); a key's due timers fire by timestamp, then
  domain, then tag (:func:`timer_order`, :func:`timers_order`); at most
  ``max_timer_fires_per_step`` per key and step (:func:`within_budget`);
* **dead letters**: a record or timer whose user code failed goes to the dead-letter stream
  with its reason, under the same id on both paths; a failed dead letter makes none
  (:func:`failure_letter`);
* **once-productions** (§6.1.2, Photon §2): a key's productions are numbered in its life
  (:func:`key_life`, :func:`production_ids`), strong productions kept until acknowledged
  (:func:`unacknowledged`), ``once_id`` productions committed in one call per round
  (``_delivery.commit_once``).

>>> late_watermark("queries", None, 5_000), late_watermark("queries", 3_000, 5_000)
(5000, 3000)
>>> dedup_stamp(900, 1_000), dedup_stamp(1_200, 1_000)
(1000, 1200)
>>> sorted([("b", 10, 0), ("a", 10, 0), ("c", 5, 1)], key=lambda t: timer_order(t[1], t[2], t[0]))
[('c', 5, 1), ('a', 10, 0), ('b', 10, 0)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from millwheel._deadletter import DEAD_LETTER_STREAM, DeadLetter, dead_letter_record, reason_of
from millwheel._errors import ComputationError
from millwheel._identity import _hexdigest
from millwheel._options import LateAction, LatePolicy
from millwheel._record import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Key,
    Production,
    Record,
    TimeDomain,
    Timer,
)

if TYPE_CHECKING:
    import numpy as np

    from millwheel._counters import StepMetrics

_LW = int(TimeDomain.LOW_WATERMARK)
_T = TypeVar("_T")


# ---- admission (§6.1.1) ----------------------------------------------------------------------
def dedup_stamp(timestamp: int, late_wm: int) -> int:
    """The time a new record id is remembered under: its timestamp, or for a late record the
    watermark it was late for (a re-delivery of it is then a duplicate, not late again)."""
    return timestamp if timestamp >= late_wm else late_wm


def dedup_stamps(timestamps: np.ndarray, late_wms: np.ndarray) -> np.ndarray:
    """:func:`dedup_stamp` over columns."""
    import numpy as np

    return np.maximum(timestamps, late_wms)


def judged_watermark(low_watermark: int, oldest_late_wm: int | None) -> int:
    """The watermark a step collects its ids against (:func:`dedup_horizon`): the older of the
    low watermark and the oldest watermark the step's records arrived under (``None``: it
    had none). Older than ``low_watermark``, the interval's summary says so
    (``IntervalSummary.judged``), so that a tick collects them later.

    At the final low watermark (+inf) the low watermark's alone: nothing is delivered after
    it but late against +inf (a computation's low watermark reaches +inf only once it has
    read every file its producers wrote: a heartbeat counts the files it covers), and within
    a batch the step at +inf is a key's last (``_delivery.plan_steps`` runs the records of an
    older arrival watermark first, under it). A key that kept only ids is forgotten there and
    then, not by a batch of ticks after it.

    >>> judged_watermark(5_000, 3_000), judged_watermark(MAX_TIMESTAMP, 3_000) == MAX_TIMESTAMP
    (3000, True)
    """
    if oldest_late_wm is None or low_watermark >= MAX_TIMESTAMP:
        return low_watermark
    return min(low_watermark, oldest_late_wm)


def dedup_horizon(low_watermark: int, oldest_late_wm: int | None, slack_ms: int) -> int:
    """Ids older than this may be collected after a step: none of them can be delivered again
    without being late, judged against :func:`judged_watermark`, less the slack.

    >>> dedup_horizon(5_000, 3_000, 100), dedup_horizon(MAX_TIMESTAMP, 3_000, 100) == MAX_TIMESTAMP - 100
    (2900, True)
    """
    return judged_watermark(low_watermark, oldest_late_wm) - slack_ms


def dedup_collect_at(oldest: int | None, slack_ms: int, gc_interval_ms: int) -> int | None:
    """The low watermark from which a step with no records collects a key's oldest ids,
    remembered under ``oldest`` (:func:`dedup_horizon` passes ``oldest`` by more than the
    collection interval); ``None``: no ids, or never. A key that keeps ids is stepped then
    even with nothing else due, as for a low-watermark timer that holds nothing: else a key
    seen once would keep its ids, and its envelope, for ever.

    >>> dedup_collect_at(1_000, 600_000, 60_000)
    661001
    >>> dedup_collect_at(None, 600_000, 60_000) is None
    True
    """
    if oldest is None:
        return None
    at = oldest + slack_ms + gc_interval_ms + 1
    return at if at <= MAX_TIMESTAMP else None


def with_collect_at(
    next_lw: int | None, oldest: int | None, slack_ms: int, gc_interval_ms: int
) -> int | None:
    """The earlier of a low-watermark wake-up ``next_lw`` and :func:`dedup_collect_at`."""
    at = dedup_collect_at(oldest, slack_ms, gc_interval_ms)
    return at if at is not None and (next_lw is None or at < next_lw) else next_lw


# ---- lateness (§4.5) -------------------------------------------------------------------------
def late_watermark(stream: str | None, arrival: int | None, low_watermark: int) -> int:
    """The watermark a record is judged late against: the one it arrived under (``None``: the
    current ``low_watermark``); a dead letter is never late (it records that something failed,
    whenever that was)."""
    if stream == DEAD_LETTER_STREAM:
        return MIN_TIMESTAMP
    return low_watermark if arrival is None else arrival


def late_watermarks(
    not_dead: np.ndarray, arrival: np.ndarray | None, known: np.ndarray | None, low_watermark: int
) -> np.ndarray:
    """:func:`late_watermark` over columns: ``not_dead`` (not of the dead-letter stream),
    ``arrival`` where ``known`` (``None``: no arrival watermark known)."""
    import numpy as np

    arrived = (
        np.full(len(not_dead), low_watermark, np.int64)
        if arrival is None or known is None
        else np.where(known, arrival, low_watermark)
    )
    return np.where(not_dead, arrived, MIN_TIMESTAMP)


def is_late(ts: Any, late_wm: Any) -> Any:
    """Whether a record is late: older than the watermark it is judged against (either may be
    an int or a numpy column: a bool or a bool per record)."""
    return ts < late_wm


class LateRule:
    """What a computation does with a late record (its :class:`~millwheel.LatePolicy`), counted
    alike on both paths: every late record in ``late``, then in ``late_dropped`` or
    ``late_to_stream`` (processed anyway under ``LatePolicy.process()``)."""

    __slots__ = ("action", "stream")

    def __init__(self, policy: LatePolicy) -> None:
        self.action = policy.action
        self.stream = policy.stream

    def route(self, metrics: StepMetrics) -> LateAction:
        """One late record counted; what happens to it."""
        metrics.late += 1
        action = self.action
        if action is LateAction.DROP:
            metrics.late_dropped += 1
        elif action is LateAction.TO_STREAM:
            metrics.late_to_stream += 1
        return action

    def split(
        self, late: np.ndarray, admitted: np.ndarray, metrics: StepMetrics
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`route` over columns: of the ``admitted`` records, those ``late`` counted; the
        records user code gets, and those sent to the late stream (``None``: none)."""
        late = late & admitted
        n = int(late.sum())
        if not n:
            return admitted, None
        metrics.late += n
        if self.action is LateAction.PROCESS:
            return admitted, None
        if self.action is LateAction.DROP:
            metrics.late_dropped += n
            return admitted & ~late, None
        metrics.late_to_stream += n
        return admitted & ~late, late


# ---- timers (§4.6) ---------------------------------------------------------------------------
def timer_due(timestamp: int, domain: int, low_watermark: int, now: int) -> bool:
    """Whether a timer fires: an event-time timer at or before the low watermark, a wall-time
    timer at or before now."""
    return timestamp <= (low_watermark if domain == _LW else now)


def due_timers(
    timers: Mapping[str, tuple[int, int]], low_watermark: int, now: int
) -> list[tuple[int, int, str]]:
    """:func:`timer_due` over one key's timers (``tag -> (timestamp, domain)``): the due ones as
    ``(timestamp, domain, tag)``, which sort (a heap pops them) in :func:`timer_order`."""
    return [
        (ts, d, tag)
        for tag, (ts, d) in timers.items()
        if ts <= (low_watermark if d == _LW else now)
    ]


def timers_due(ts: np.ndarray, domains: np.ndarray, low_watermark: int, now: int) -> np.ndarray:
    """:func:`timer_due` over columns: a bool per timer."""
    import numpy as np

    return ts <= np.where(domains == _LW, low_watermark, now)


def timer_order(timestamp: int, domain: int, tag: str) -> tuple[int, int, str]:
    """The order a key's due timers fire in: by timestamp, then domain, then tag."""
    return timestamp, domain, tag


def timers_order(
    key_codes: np.ndarray, ts: np.ndarray, domains: np.ndarray, tag_codes: np.ndarray
) -> np.ndarray:
    """:func:`timer_order` over columns, keys grouped (by ``key_codes``, ascending): the
    permutation (``tag_codes``: ranks of the tags in string order)."""
    import numpy as np

    return np.lexsort((tag_codes, domains, ts, key_codes))


def within_budget(key_codes: np.ndarray, fired: np.ndarray, budget: int) -> np.ndarray:
    """Which of a step's due timers fire under ``max_timer_fires_per_step``: each key's first
    ``budget`` less those it ``fired`` already (indexed by key code); ``key_codes``: the due
    timers' keys, grouped and in firing order (the others are deferred to the next step)."""
    import numpy as np

    n = len(key_codes)
    starts = np.flatnonzero(np.r_[True, key_codes[1:] != key_codes[:-1]])
    rank = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    return fired[key_codes] + rank < budget


# ---- outputs ---------------------------------------------------------------------------------
def check_output(computation: str, outputs: Iterable[str], stream: str) -> None:
    """A production goes only to a stream its computation declares (§4.1, a computation's
    outputs are part of the topology): :class:`ComputationError` otherwise."""
    if stream not in outputs:
        declared = ", ".join(sorted(outputs)) or "none"
        msg = (
            f"computation {computation!r} produced to stream {stream!r}, which it does not declare "
            f"(declared outputs: {declared}); add it to outputs=[...] in Topology.computation"
        )
        raise ComputationError(msg)


# ---- dead letters ----------------------------------------------------------------------------
def failure_letter(
    computation: str,
    key: Key,
    exc: BaseException,
    stage: str,
    record: Record | None,
    timer: Timer | None,
    now: int,
) -> Production | None:
    """The dead letter of a record or timer whose user code failed at ``stage``: the same id for
    the same failure on both paths; ``None`` for a dead letter that failed (no dead letters of
    dead letters: a dead-letter consumer never loops)."""
    if record is not None and record.stream == DEAD_LETTER_STREAM:
        return None
    letter = DeadLetter(
        stage,
        reason_of(exc),
        computation=computation,
        stream=record.stream if record else None,
        key=key,
        record=record,
        timer=timer,
    )
    parts: tuple[Any, ...]
    if timer is not None:
        ts, parts = timer.timestamp, (key, timer.tag, timer.timestamp, int(timer.domain))
    elif record is not None:
        ts, parts = record.timestamp, (record.id,)
    else:
        ts, parts = now, (key,)
    return Production(DEAD_LETTER_STREAM, dead_letter_record(letter, ts, *parts))


# ---- once-productions (§6.1.2) ---------------------------------------------------------------
def key_life(life: int | None, seq: int, new_life: int | None) -> int | None:
    """The life a key's next production is numbered in (``_identity.py``): its own, or, for a
    key that has made none (no life, sequence 0), the one its batch starts."""
    return new_life if life is None and seq == 0 else life


def production_id_of(prefix: str, seq: int) -> str:
    """The id of a key's production ``seq`` (``prefix``: ``_identity.id_prefix`` of its life)."""
    return _hexdigest(f"{prefix}{seq}".encode())


def production_ids(prefixes: list[str], key_codes: Iterable[int], seqs: Iterable[int]) -> list[str]:
    """:func:`production_id_of` over columns: production ``seqs[i]`` of key ``key_codes[i]``
    (an index into ``prefixes``)."""
    return [_hexdigest(f"{prefixes[k]}{q}".encode()) for k, q in zip(key_codes, seqs, strict=True)]


def unacknowledged(
    pending: list[_T], ids: Iterable[str] | None, id_of: Callable[[_T], str]
) -> list[_T]:
    """Strong productions still pending once ``ids`` are acknowledged (``None``: all are)."""
    if ids is None:
        return []
    acked = set(ids)
    return [p for p in pending if id_of(p) not in acked]
