"""Records, timers and time domains (MillWheel §3, §4.6)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

#: Keys are what consumers extract from records (§4.2). They must be hashable and
#: encodable, so the framework accepts ``str``, ``int`` and ``bytes``.
Key = str | int | bytes

#: The smallest timestamp: "nothing is known yet" as a low watermark.
MIN_TIMESTAMP = -(2**63)
#: The largest timestamp: an injector that is finished publishes this low watermark.
MAX_TIMESTAMP = 2**63 - 1


class TimeDomain(enum.IntEnum):
    """The clock a timer fires on (§4.6)."""

    #: fires once the computation's input low watermark has reached the timer's timestamp
    LOW_WATERMARK = 0
    #: fires once wall time has reached the timer's timestamp
    WALL_TIME = 1


@dataclass(frozen=True, slots=True)
class Record:
    """One datum: a key, a value, a timestamp and a unique id (MillWheel §3).

    ``key`` is the key the *consumer* extracted (§4.2); on a production it is the
    producer's key, for information only. ``timestamp`` is milliseconds since the epoch.
    ``id`` is unique per record and is what exactly-once delivery deduplicates on (§6.1.1).

    >>> r = Record(key="cats", value={"query": "cats"}, timestamp=1_000, id="q-1")
    >>> r.timestamp
    1000
    """

    key: Key | None
    value: Any
    timestamp: int
    id: str


@dataclass(frozen=True, slots=True)
class Timer:
    """A timer handed to ``Computation.process_timer`` (§4.6).

    >>> Timer(tag="w1000", timestamp=2_000, domain=TimeDomain.LOW_WATERMARK).timestamp
    2000
    """

    tag: str
    timestamp: int
    domain: TimeDomain = TimeDomain.LOW_WATERMARK


@dataclass(frozen=True, slots=True)
class Production:
    """A record produced by a computation to a named stream (§5.1)."""

    stream: str
    record: Record
