"""Dead letters: bad input and failed work, kept with their reason, never silently dropped.

Whatever cannot be processed — a record whose key extractor fails, a record or timer
whose user code raises, a value that cannot be encoded, a malformed log line — becomes
one record on the :data:`DEAD_LETTER_STREAM` whose value is a :class:`DeadLetter`: which
computation or injector, which key, which record or timer, at which stage, and why. The
rest of the step and every other key go on (MillWheel's per-key independence, §4.1).

A dead letter's id is derived from what failed (the stage, the computation or injector,
the stream, and the failing record's id or timer, or the log line's file and offset),
so the same failure delivered again is deduplicated and two different failures never
share an id.

A computation may consume ``dead_letters`` (to count, alert or repair); if *its* key
extractor or code fails on a dead letter, that failure is not dead-lettered again — it
is counted (``dead_letters_dropped``) and logged, so dead-letter consumers never loop.

>>> dl = DeadLetter(stage=Stage.KEY_EXTRACTOR, reason="KeyError: 'query'", computation="Counter", stream="queries")
>>> dl.stage, dl.as_dict()["reason"]
('key_extractor', "KeyError: 'query'")
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass
from typing import Any

import xxhash

from millwheel._record import Key, Record, Timer

#: the stream every computation's and injector's dead letters go to
DEAD_LETTER_STREAM = "dead_letters"

#: longest reason kept (a traceback line can quote a huge value)
MAX_REASON = 2_000


class Stage:
    """Where a dead letter was made (the ``stage`` field)."""

    #: a log line that is not a record (broken JSON, missing or bad id/timestamp)
    MALFORMED = "malformed_line"
    #: a log line whose timestamp cannot belong with its neighbours (a unit mistake: seconds,
    #: microseconds or nanoseconds where milliseconds are expected); the record is kept
    IMPLAUSIBLE_TIMESTAMP = "implausible_timestamp"
    #: a record's id or timestamp is invalid (injector or ``Harness.inject`` boundary)
    INVALID_RECORD = "invalid_record"
    #: the consumer's key extractor raised or returned something that is not a key
    KEY_EXTRACTOR = "key_extractor"
    #: ``process_record`` raised
    PROCESS_RECORD = "process_record"
    #: ``process_timer`` raised
    PROCESS_TIMER = "process_timer"
    #: the key's state, a production or the envelope could not be encoded at the checkpoint
    CHECKPOINT = "checkpoint"
    #: a production with ``once_id`` older than the IdRegistry's garbage-collection boundary
    ONCE_TOO_OLD = "once_too_old"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """The value of a record on :data:`DEAD_LETTER_STREAM`."""

    #: one of :class:`Stage`
    stage: str
    #: what went wrong, e.g. ``"KeyError: 'query'"``
    reason: str
    #: the computation that failed (``None`` for injector dead letters)
    computation: str | None = None
    #: the injector that read the bad input (``None`` for computation dead letters)
    injector: str | None = None
    #: the input stream the record came from
    stream: str | None = None
    #: the key being processed, when one was extracted
    key: Key | None = None
    #: the record that failed (its value as received), or ``None``
    record: Record | None = None
    #: the timer that failed, or ``None``
    timer: Timer | None = None
    #: log file and byte offset of a malformed line, and the line itself
    file: str | None = None
    offset: int | None = None
    line: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The dead letter as plain data (records and timers as dicts too)."""
        return asdict(self)


def reason_of(exc: BaseException) -> str:
    """``"Type: message"`` of an exception, bounded to :data:`MAX_REASON` characters."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def dead_letter_id(*parts: Any) -> str:
    """A deterministic id for a dead letter, derived from what failed."""
    return xxhash.xxh3_128_hexdigest("\x00".join(["dl", *(repr(p) for p in parts)]).encode())


def dead_letter_record(letter: DeadLetter, timestamp: int, *parts: Any) -> Record:
    """The :data:`DEAD_LETTER_STREAM` record carrying ``letter``; ``parts`` identify the failure."""
    rid = dead_letter_id(letter.stage, letter.computation, letter.injector, letter.stream, *parts)
    return Record(letter.key, letter, timestamp, rid, DEAD_LETTER_STREAM)


def malformed_line(
    injector: str, stream: str, file: str, offset: int, reason: str, line: bytes, timestamp: int
) -> Record:
    """The dead letter of a log line that is not a record.

    Its timestamp is the file's time (see :func:`millwheel.file_time`), the same on both
    backends: the time at which the line was written is unknown, and the file's time is
    what the injector low watermark is held at while the file is read.
    """
    text = _line_text(line)
    letter = DeadLetter(
        Stage.MALFORMED,
        reason,
        injector=injector,
        stream=stream,
        file=file,
        offset=offset,
        line=text,
    )
    return dead_letter_record(letter, timestamp, file, offset)


def _line_text(line: bytes) -> str:
    text = line.decode(errors="replace")
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def implausible_line(
    injector: str,
    stream: str,
    file: str,
    offset: int,
    reason: str,
    line: bytes,
    record: Record,
    timestamp: int,
) -> Record:
    """The dead letter of a log line whose timestamp is implausible (``_logplan.plausible_bounds``).

    The record as read (its id, value and timestamp) is kept in the letter, so a consumer
    can repair its unit and send it again; the letter itself is timestamped like a
    malformed line's, with the file's time, never with the implausible timestamp.
    """
    text = _line_text(line)
    letter = DeadLetter(
        Stage.IMPLAUSIBLE_TIMESTAMP,
        reason,
        injector=injector,
        stream=stream,
        record=record,
        file=file,
        offset=offset,
        line=text,
    )
    return dead_letter_record(letter, timestamp, file, offset)
