"""Records, timers and time domains (MillWheel §3, §4.6)."""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass
from typing import Any, overload

import msgpack

#: Keys are what consumers extract from records (§4.2). They must be hashable and have a
#: stable encoding, so the framework accepts ``str``, ``int`` (64-bit), ``bytes`` and
#: tuples of those (composite keys, e.g. ``(advertiser, query)``).
Key = str | int | bytes | tuple[Any, ...]

_packb = msgpack.packb
_unpackb = msgpack.unpackb
_INT64 = (-(2**63), 2**63 - 1)


def key_problem(key: Any) -> str | None:
    """Why ``key`` cannot be a key, or ``None`` if it can.

    >>> key_problem(("cats", 3)) is None
    True
    >>> print(key_problem(["cats"]))
    keys must be str, int, bytes or a tuple of those; got list ['cats']
    """
    t = type(key)
    if t is str:
        if utf8_text(key):
            return None
        return f"str keys must be valid Unicode text (encodable as UTF-8); got {short_repr(key)}, which holds a lone surrogate"
    if t is bytes:
        return None
    if t is int:
        if _INT64[0] <= key <= _INT64[1]:
            return None
        return f"int keys must fit in 64 bits; got {key}"
    if t is tuple:
        for part in key:
            why = key_problem(part)
            if why is not None:
                return why
        return None
    return f"keys must be str, int, bytes or a tuple of those; got {t.__name__} {short_repr(key)}"


def utf8_text(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: not if it holds a lone surrogate, which JSON's
    ``"\\ud800"`` escape and Python's ``surrogateescape`` produce; such a str can be
    pickled but not written as Arrow, msgpack or UTF-8. ASCII text answers without encoding."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: error messages never echo a huge input."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def encode_key(key: Key) -> bytes:
    """The stable byte encoding of a key (msgpack): equal keys, equal bytes, in every process.

    >>> decode_key(encode_key(("cats", 3, b"x")))
    ('cats', 3, b'x')
    """
    return _packb(key, use_bin_type=True)


@overload
def decode_key(data: bytes) -> Key: ...
@overload
def decode_key(data: None) -> None: ...
@overload
def decode_key(data: bytes | None) -> Key | None: ...
def decode_key(data: bytes | None) -> Key | None:
    """The inverse of :func:`encode_key` (tuples come back as tuples)."""
    if data is None:
        return None
    return _unpackb(data, raw=False, use_list=False)  # type: ignore[no-any-return]


#: The smallest timestamp: "nothing is known yet" as a low watermark.
MIN_TIMESTAMP = -(2**63)
#: The largest timestamp: an injector that is finished publishes this low watermark.
MAX_TIMESTAMP = 2**63 - 1


def production_time(watermark_or_timer: int) -> int:
    """The timestamp a production gets by default: the low watermark (or the firing
    event-time timer's time), kept inside the range records may carry.

    Records carry timestamps strictly between :data:`MIN_TIMESTAMP` and :data:`MAX_TIMESTAMP`
    (the two ends are watermarks: "nothing known yet" and "finished"). A wall-time timer
    that produces before the input watermark has moved produces at the earliest record
    time; one that fires after the input is finished, or an event-time timer set at
    ``MAX_TIMESTAMP`` (it fires when the input is finished), produces at the latest, which
    the timer held the watermark below (:meth:`Envelope.hold`), so it is not late.

    >>> production_time(MIN_TIMESTAMP) == MIN_TIMESTAMP + 1, production_time(5), production_time(MAX_TIMESTAMP) == MAX_TIMESTAMP - 1
    (True, 5, True)
    """
    return min(max(watermark_or_timer, MIN_TIMESTAMP + 1), MAX_TIMESTAMP - 1)


def timestamp_text(v: int) -> str:
    """A timestamp or low watermark for people, the one spelling every summary and status
    uses: a UTC date and time, ``+inf (done)`` or ``-inf``. Any int spells: a time beyond
    the year 9999 (a timestamp in micro- or nanoseconds) is its number of milliseconds.

    >>> timestamp_text(1_700_000_000_000), timestamp_text(MAX_TIMESTAMP), timestamp_text(42)
    ('2023-11-14 22:13:20', '+inf (done)', '42')
    >>> timestamp_text(1_765_458_394_380_000)
    '1765458394380000 ms (after the year 9999)'
    """
    if v >= MAX_TIMESTAMP:
        return "+inf (done)"
    if v <= MIN_TIMESTAMP:
        return "-inf"
    if v > 10**11:
        return utc_text(v)
    return str(v)


def utc_text(ms: int, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A wall-clock or event time (ms since the epoch) as UTC text in ``fmt``, for any int:
    a time before the year 1 or after the year 9999 is its number of milliseconds.

    >>> utc_text(0, "%H:%M:%S"), utc_text(-(2**63))
    ('00:00:00', '-9223372036854775808 ms (before the year 1)')
    """
    if ms >= _YEAR_10000_MS:
        return f"{ms} ms (after the year 9999)"
    if ms < _YEAR_1_MS:
        return f"{ms} ms (before the year 1)"
    return (_EPOCH + datetime.timedelta(milliseconds=ms)).strftime(fmt)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
#: 10000-01-01T00:00:00Z in ms since the epoch: the first time ``datetime`` cannot spell
_YEAR_10000_MS = 253_402_300_800_000
#: 0001-01-01T00:00:00Z in ms since the epoch: the first time ``datetime`` can spell
_YEAR_1_MS = -62_135_596_800_000


def duration_text(ms: int | float | None) -> str:
    """A lag for people.

    >>> [duration_text(x) for x in (None, 420, 12_300, 185_000, 9_000_000, 95_371_279_600)]
    ['-', '0.4s', '12.3s', '3m05s', '2.5h', '1103.8d']
    """
    if ms is None:
        return "-"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


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
    ``stream`` says which input stream a record came from, so a computation with several
    inputs (a join) can tell them apart.

    >>> r = Record(key="cats", value={"query": "cats"}, timestamp=1_000, id="q-1")
    >>> r.timestamp
    1000
    """

    key: Key | None
    value: Any
    timestamp: int
    id: str
    #: the stream the record was read from, as the consumer sees it (``None`` when built by hand)
    stream: str | None = None


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
    """A record produced by a computation to a named stream (§5.1).

    ``encoded`` is the value's bytes (the value codec), made when it was produced: what a
    backend stores and sends, so the value is encoded once.
    """

    stream: str
    record: Record
    encoded: bytes | None = None
    #: at most once across pipelines sharing an IdRegistry (``millwheel/_once.py``)
    once_id: str | None = None
    #: a once-production that yields its id to one that is not tentative
    once_tentative: bool = False
