"""What travels between processes: stream-log rows, value and key encodings, Spark time.

Pure Python (no pyspark): the driver, the Python workers and the stream-log readers
share these definitions.

* A **stream-log row** is ``(id string, ts long, key binary, value binary, wm long)``: the
  record id (what exactly-once dedups on, MillWheel §6.1.1), its timestamp in ms, the
  producer's key (:func:`millwheel._record.encode_key`), the value (the one value codec,
  :func:`millwheel._codec.encode_value`) and the *sender watermark*: the injector low watermark in force when the record
  was sent (null for computations' productions). A record with ``ts < wm`` is late (§4.5)
  whatever batch it travels in, exactly as in the harness, where lateness is judged
  against the watermark at arrival. Then, per consumer ``C`` of the stream, ``key:C`` and
  ``interval:C``: the record keyed for ``C`` by its producer (``_keying.py``).
* **Spark time.** Spark's event-time watermark is a non-negative timestamp and starts at
  0; millwheel timestamps are signed ms with ``MIN_TIMESTAMP``/``MAX_TIMESTAMP`` as
  "nothing known" / "finished". :func:`to_spark` shifts by :data:`SPARK_OFFSET` so that
  Spark's initial 0 means ``MIN_TIMESTAMP`` and :data:`SPARK_CAP` (year 2255, inside pandas' range) means
  ``MAX_TIMESTAMP``.

>>> from_spark(to_spark(1_000))
1000
>>> from_spark(0) == MIN_TIMESTAMP, from_spark(to_spark(MAX_TIMESTAMP)) == MAX_TIMESTAMP
(True, True)
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

import msgpack

from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP

#: columns of every stream-log file (extra columns are ignored by readers)
LOG_SCHEMA = "id string, ts long, key binary, value binary, wm long"
#: heartbeat files: the computation's input low watermark (Spark time) and wall-clock ticks;
#: and the rows of a rescale (``_rescale.py``): ``kind`` (:attr:`RowKind.INSTALL` or
#: :attr:`RowKind.RETIRE`), the Spark ``group`` they go to as it is, and for an install the
#: key and envelope (``key``, ``value``); older heartbeat files read those as nulls
#: ``upto``: on a row that carries ``wm`` to a key interval, the newest micro-batch whose files
#: that watermark counts as consumed (``_query.ComputationQuery._write_heartbeat``)
HEARTBEAT_SCHEMA = (
    "interval int, wm long, now long, kind int, group int, key binary, value binary, upto long"
)
#: rows entering the per-interval step: records, dead letters of keying (``kind``, see
#: :class:`RowKind`) and heartbeats; ``stream`` is the input stream a record came from,
#: ``src`` and ``row`` the stream-log file and row it was read from (its send order).
#: The step gets them grouped by the Spark group of ``interval`` (the column itself stays
#: in the JVM: ``_query.py``)
KEYED_SCHEMA = "interval int, kind int, key binary, id string, ts long, value binary, wm long, stream string, src string, row long, now long"
#: rows leaving the per-interval step and written to the outbox, partitioned by stream
OUT_SCHEMA = "stream string, id string, ts long, key binary, value binary, wm long"
#: the GroupState row of one key interval: key -> envelope, key -> [hold, next lw timer, next wall timer]
STATE_SCHEMA = "envs binary, meta binary"

#: pseudo-stream of the per-interval summary rows in the outbox
SUMMARY_STREAM = "_summary"


class RowKind(enum.IntEnum):
    """What a keyed row carries (the ``kind`` column)."""

    #: a record, keyed by the consumer's extractor
    RECORD = 0
    #: a dead letter of keying: ``value`` is the encoded :class:`~millwheel.DeadLetter`
    DEAD_LETTER = 1
    #: a dead letter whose consumer could not key it: counted, not dead-lettered again
    DROPPED = 2
    #: a row its producer did not key for this consumer, in a query planned without the
    #: keying stage: sent to a key interval by a hash of its id, and keyed by the step there
    #: (``_interval.IntervalBatch``; docs/runtime.md "A keying stage only when needed")
    UNKEYED = 3
    #: a rescale moves a key's envelope here (``key``, ``value``): a heartbeat-file row for
    #: a group of the computation's new layout, installed before any record (``_rescale.py``)
    INSTALL = 4
    #: a rescale empties this group of the old layout; ``value`` is what it must hold
    #: (:func:`~millwheel.runtime._interval.state_digest` of its envelopes)
    RETIRE = 5


@dataclass(slots=True)
class IntervalSummary:
    """What one key interval reports after a batch (a row of :data:`SUMMARY_STREAM`).

    The driver derives the computation's low watermark from ``hold`` (§7.2: the oldest
    pending work the interval keeps) and sends a tick when ``next_wall_timer`` is due.
    """

    interval: int
    #: oldest pending work held in the interval's envelopes (low-watermark timers, pending productions)
    hold: int | None
    next_low_watermark_timer: int | None
    next_wall_timer: int | None
    #: keys that keep anything
    keys: int
    #: the step's counters summed over the batch
    metrics: dict[str, int] = field(default_factory=dict)
    #: the low watermark and wall time the batch ran under
    low_watermark: int = MIN_TIMESTAMP
    now: int = 0
    #: how long the interval's share of the batch took in its worker, ms (what the
    #: automatic rescale policy compares across intervals: ``_autoscale.py``)
    step_ms: int = 0
    #: the oldest watermark a record of the batch was judged against, when older than
    #: ``low_watermark`` (``None``: none was): its key's ids were collected against it
    #: (``_contract.dedup_horizon``), so a wake-up between the two is still to be carried
    #: out (:func:`passed_since_run`)
    judged: int | None = None

    def encode(self) -> bytes:
        return msgpack.packb(asdict(self), use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> IntervalSummary:
        return cls(**msgpack.unpackb(data, raw=False))


def due_ticks(
    summaries: Mapping[int, IntervalSummary],
    ticked: dict[int, int],
    now: int,
    watermark: int | None = None,
    batches: int = 0,
    reached: Mapping[int, int] | None = None,
) -> list[int]:
    """The key intervals to tick (a heartbeat row that runs the interval's group, §4.6).

    * A wall-time timer is due: ``next_wall_timer <= now``; ticked once.
    * With ``watermark`` (the last one sent in a heartbeat), for a query that runs no
      no-data micro-batches: a low-watermark timer the watermark has passed since the
      interval last ran (its class handles no timers but set one: the tick lets it fire and
      fail as it would with them, instead of holding the low watermark for ever; or a key
      that keeps only ids, woken to collect them). Ticked
      again after each published batch (``batches``) that left it unfired: a tick read with
      the heartbeat itself runs under the watermark before it. Not an interval that a
      heartbeat row addressed to it, which no batch can have read yet, carries past the
      timer (``reached``: interval -> the newest such watermark,
      ``_query.ComputationQuery._unread``): the batch that reads it fires the timer
      (docs/runtime.md, "Heartbeats in the batch that reads them"); unless the interval's
      summary shows it ran under that watermark already (the batch read the row, and left
      the wake-ups of records it judged against an older one: ``IntervalSummary.judged``).

    ``ticked`` remembers the ticks (wall: interval -> timer; low watermark: ``-1 - interval``
    -> ``batches``).

    >>> s = IntervalSummary(0, None, 500, 900, 1, low_watermark=100)
    >>> ticked = {}
    >>> due_ticks({0: s}, ticked, now=800), due_ticks({0: s}, ticked, now=1_000), due_ticks({0: s}, ticked, now=1_000)
    ([], [0], [])
    >>> [due_ticks({0: s}, ticked, 0, watermark=w, batches=b) for w, b in [(400, 1), (600, 1), (600, 1), (600, 2)]]
    [[], [0], [], [0]]
    >>> due_ticks({0: s}, {}, 0, watermark=600, batches=1, reached={0: 500}), due_ticks({0: s}, {}, 0, watermark=600, batches=1, reached={0: 499})
    ([], [0])
    >>> ran = IntervalSummary(0, None, 500, None, 1, low_watermark=600, judged=400)
    >>> due_ticks({0: ran}, {}, 0, watermark=600, batches=1, reached={0: 600})
    [0]
    """
    out = []
    for i, s in summaries.items():
        nwall, nlw = s.next_wall_timer, s.next_low_watermark_timer
        if nwall is not None and nwall <= now and ticked.get(i) != nwall:
            ticked[i] = nwall
            out.append(i)
        elif (
            watermark is not None
            and nlw is not None
            and passed_since_run(s, watermark)
            and (
                reached is None
                or nlw > (r := reached.get(i, MIN_TIMESTAMP))
                or s.low_watermark >= r
            )
            and ticked.get(-1 - i, -1) < batches
        ):
            ticked[-1 - i] = batches
            out.append(i)
    return out


def passed_since_run(s: IntervalSummary, watermark: int) -> bool:
    """Has ``watermark`` passed the interval's earliest low-watermark timer (or wake-up)
    since the interval last ran (its summary ``s``)? What :func:`due_ticks` ticks.

    A run carried out what its low watermark made due, but for the keys whose records it
    judged against an older one (``s.judged``): their ids' wake-ups from there on are still
    due. So a batch whose watermark jumps past the ids of the records it brings is followed
    by a tick that forgets the keys it left keeping only ids (at +inf the batch forgets them
    itself: ``_contract.dedup_horizon``).

    >>> ran = IntervalSummary(0, None, 700, None, 1, low_watermark=1_000)
    >>> judged = IntervalSummary(0, None, 700, None, 1, low_watermark=1_000, judged=600)
    >>> passed_since_run(ran, 2_000), passed_since_run(judged, 2_000)
    (False, True)
    """
    nlw = s.next_low_watermark_timer
    ran = s.low_watermark if s.judged is None else min(s.low_watermark, s.judged)
    return nlw is not None and ran < nlw <= watermark


def interval_name(i: int) -> str:
    """The name of key interval ``i`` at the watermark authority (one sequencer each, §7.1)."""
    return f"interval-{i}"


def spark_hash_int(value: int) -> int:
    """Spark's ``hash()`` of an int column: Murmur3 x86_32 with seed 42, signed, which is
    what its hash partitioning takes modulo the partition count.

    >>> spark_hash_int(0), spark_hash_int(1), spark_hash_int(-1)
    (933211791, -559580957, -1604776387)
    """
    m = 0xFFFFFFFF
    k = (value & m) * 0xCC9E2D51 & m
    k = ((k << 15) | (k >> 17)) & m
    k = k * 0x1B873593 & m
    h = 42 ^ k
    h = ((h << 13) | (h >> 19)) & m
    h = (h * 5 + 0xE6546B64) & m
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & m
    h ^= h >> 13
    h = h * 0xC2B2AE35 & m
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


def interval_groups(intervals: int, partitions: int, avoid: Iterable[int] = ()) -> list[int]:
    """The Spark grouping value of each key interval, dealt round-robin over ``partitions``.

    Spark places a group in partition ``pmod(hash(value), partitions)`` (a stateful
    operator's state is partitioned so). Grouping by the interval number itself puts 16
    intervals 7 / 9 on 2 partitions and 8 intervals 3 / 5, so one core does up to 25% more
    of the stateful stage than the other. Interval ``i`` gets the smallest unused
    non-negative value that lands in partition ``i % partitions``, and is not in ``avoid``
    (the groups a rescale's old layout keeps its state under: ``_rescale.py``).

    >>> interval_groups(4, 2)
    [2, 0, 4, 1]
    >>> interval_groups(4, 2, avoid=[2, 0, 4, 1])
    [5, 3, 10, 6]
    >>> [spark_hash_int(g) % 2 for g in interval_groups(8, 2)]
    [0, 1, 0, 1, 0, 1, 0, 1]
    """
    groups: list[int] = []
    used: set[int] = set(avoid)
    for i in range(intervals):
        v = 0
        while v in used or spark_hash_int(v) % partitions != i % partitions:
            v += 1
        used.add(v)
        groups.append(v)
    return groups


SPARK_OFFSET = 2**40
SPARK_CAP = 9_000_000_000_000  # 2255-03-14: inside pandas' ns timestamps


#: the Spark value of every millwheel time from there to ``MAX_TIMESTAMP - 1``: "the end of
#: time, not finished" (an event-time timer at ``MAX_TIMESTAMP`` holds its computation's
#: watermark there until it fires, so what it produces is not late downstream)
SPARK_END = SPARK_CAP - 1


def to_spark(ts: int) -> int:
    """A millwheel low watermark as a Spark event-time watermark (ms, >= 0).

    Spark's timestamps cover a shorter range: times before it become ``0`` ("nothing
    known"), times after it up to ``MAX_TIMESTAMP - 1`` become :data:`SPARK_END`, and only
    ``MAX_TIMESTAMP`` itself ("finished") becomes ``SPARK_CAP``.

    >>> [to_spark(t) for t in (MIN_TIMESTAMP, 0, MAX_TIMESTAMP - 1, MAX_TIMESTAMP)] == [0, SPARK_OFFSET, SPARK_END, SPARK_CAP]
    True
    """
    if ts >= MAX_TIMESTAMP:
        return SPARK_CAP
    v = ts + SPARK_OFFSET
    return 0 if v <= 0 else min(v, SPARK_END)


def from_spark(v: int) -> int:
    """Inverse of :func:`to_spark` (:data:`SPARK_END` is ``MAX_TIMESTAMP - 1``)."""
    if v <= 0:
        return MIN_TIMESTAMP
    if v >= SPARK_CAP:
        return MAX_TIMESTAMP
    if v >= SPARK_END:
        return MAX_TIMESTAMP - 1
    return v - SPARK_OFFSET


def timer_timeout(ts: int) -> int:
    """The Spark timeout timestamp at which a low-watermark timer at ``ts`` is due.

    Spark times a group out when ``timeout < watermark``; a millwheel timer is due when
    ``ts <= low watermark`` (§4.6), hence the ``- 1``.
    """
    if ts >= MAX_TIMESTAMP:
        return SPARK_CAP - 1  # due only once the input is finished
    return max(1, min(ts + SPARK_OFFSET - 1, SPARK_END - 1))
