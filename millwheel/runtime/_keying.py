"""Keying at the producer: each record is keyed for its consumers where it is written (§4.2).

MillWheel applies the consumer's key extraction function to a record when the record is
*sent* — the producer must know the key to deliver the record to the worker that owns it
(MillWheel §4.2, §7.1). Here the producer is the writer of a stream-log file: the
interval function writing a computation's productions (``_interval.py``), the log-file
reader (``_logfiles.py``) and the driver-side injectors (``_streams.py``). Each has the
record's value decoded in hand, so keying there costs the extractor call and nothing
else; the consumer's query takes those columns in the JVM (the value does not even
reach Python there), so the consumer decodes each value once, for the step.

Per consumer ``C`` of the file's stream, a stream-log row carries ``key:C``, the key
``C``'s extractor returned, encoded (:func:`~millwheel._record.encode_key`), and
``interval:C``, its key interval (:func:`interval_of`). **A null ``interval:C`` means
"not keyed for C"**: the extractor failed (the consumer makes the dead letter, with its
reason), or the file was written before ``C`` read the stream, by a writer without a
:class:`Keyer` or by an older millwheel. Such rows are keyed by the consumer's own keying
UDF (:func:`~millwheel.runtime._interval.make_keying`) when its query has that stage, or
by its step otherwise (``IntervalBatch._key_here``; the query has the stage only when an
input file lacks its columns: ``_query.py``), so both paths give the same rows, and the
rare path (bad input) keeps its one implementation (:func:`~millwheel._delivery.key_record`). The extractor sees the record as it
was produced: its key, value, timestamp, id and ``stream`` (as in the harness), keyed
once for every consumer. A value changed by user code after ``produce()`` is keyed as it
is when the step returns (values are meant to be immutable once produced).

>>> from millwheel._record import Record, decode_key
>>> k = Keyer({"queries": [("Counter", lambda r: r.value["q"])]}, intervals=16)
>>> cols = k.rows([("queries", Record(None, {"q": "cats"}, 1, "a")), ("queries", Record(None, {}, 2, "b"))], ["Counter"])
>>> [decode_key(b) if b else b for b in cols["key:Counter"]], cols["interval:Counter"][1] is None
(['cats', None], True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import xxhash

from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._fields import StreamFields, split_values
from millwheel._record import Record, encode_key, key_problem

__all__ = ["Keyer", "cached_key", "interval_of", "key_columns"]

_hash = xxhash.xxh3_64_intdigest

#: a consumer's name -> its key extractor for one stream
Extractor = Callable[[Record], Any]


def interval_of(encoded_key: bytes, intervals: int) -> int:
    """The key interval of an encoded key: a stable hash range (same in every process)."""
    return _hash(encoded_key) % intervals


def dead_interval(rid: Any, intervals: int) -> int:
    """Where a dead letter of keying is emitted from: any stable choice (it carries no state)."""
    return _hash(str(rid).encode()) % intervals


def key_columns(consumer: str, intervals: int | None = None) -> tuple[str, str]:
    """The two columns ``key:C`` and ``interval:C`` of consumer ``C``.

    ``intervals``: the consumer's own interval count once it has one (a rescaled
    computation, ``_layout.py``): then the interval column is ``interval:C@N``, so files
    written under another count lack it and are keyed again on read (``_query.py``).
    The key column does not depend on the count.

    >>> key_columns("C"), key_columns("C", 8)
    (('key:C', 'interval:C'), ('key:C', 'interval:C@8'))
    """
    if intervals is None:
        return f"key:{consumer}", f"interval:{consumer}"
    return f"key:{consumer}", f"interval:{consumer}@{intervals}"


def cached_key(key: Any, intervals: int, cache: dict[Any, tuple[bytes, int]]) -> tuple[bytes, int]:
    """``(encoded key, interval)``; ``cache`` maps ``(type(key), key)`` to it within a batch,
    so a key is encoded and hashed once however many records carry it."""
    ck = (type(key), key)
    hit = cache.get(ck)
    if hit is None:
        kb = encode_key(key)
        hit = cache[ck] = (kb, interval_of(kb, intervals))
    return hit


class Keyer:
    """Every consumer's key extractor, by stream: what a producer needs to key what it writes.

    Picklable (extractors travel as the computations' code does: ``_usercode.py``).
    ``consumers`` maps a stream to ``[(consumer name, extractor)]``. ``intervals`` is the
    run's interval count; ``own`` the consumers that have their own (rescaled: ``_layout.py``),
    whose interval column is named by it (:func:`key_columns`).
    """

    def __init__(
        self,
        consumers: dict[str, list[tuple[str, Extractor]]],
        intervals: int,
        own: dict[str, int] | None = None,
        fields: dict[str, StreamFields] | None = None,
    ) -> None:
        self.consumers = {s: list(cs) for s, cs in consumers.items() if cs}
        self.intervals = intervals
        self.own = dict(own or {})
        #: the streams that declare their fields: how a writer stores their values (``millwheel/_fields.py``)
        self.fields = dict(fields or {})

    @classmethod
    def of(cls, topology: Any, intervals: int, own: dict[str, int] | None = None) -> Keyer:
        """The keyer of a :class:`~millwheel.Topology`: every stream's consumers."""
        return cls(
            {s: [(c.name, c.inputs[s]) for c in topology.consumers(s)] for s in topology.streams()},
            intervals,
            own,
            dict(getattr(topology, "fields", {})),
        )

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self.__dict__.setdefault("own", {})
        self.__dict__.setdefault("fields", {})

    def intervals_of(self, consumer: str) -> int:
        """How many key intervals ``consumer`` has."""
        return self.own.get(consumer, self.intervals)

    def columns(self, consumer: str) -> tuple[str, str]:
        """``consumer``'s key and interval columns (:func:`key_columns`)."""
        return key_columns(consumer, self.own.get(consumer))

    def restricted(self, streams: Iterable[str]) -> Keyer:
        """The keyer of ``streams`` only (what a writer of them ships to its workers)."""
        streams = list(streams)
        return Keyer(
            {s: self.consumers.get(s, []) for s in streams},
            self.intervals,
            self.own,
            {s: f for s, f in self.fields.items() if s in streams},
        )

    def output_fields(self, streams: Iterable[str]) -> tuple[str, StreamFields] | None:
        """The declared output stream of a computation writing ``streams``, and its fields,
        when exactly one of them declares fields: its step writes that stream's conforming
        productions as columns (``_fieldcols.production_fields``). With two or more, its
        output files would share one ``fields`` column of two types: all are pickled."""
        declared = [(s, self.fields[s]) for s in streams if s in self.fields]
        return declared[0] if len(declared) == 1 else None

    def value_columns(
        self, stream: str, streams: Sequence[str] | str, values: Sequence[Any]
    ) -> tuple[pa.Array, pa.Array | None]:
        """The ``value`` column of rows of ``streams`` (one per row, or one for all) written
        by a producer of ``stream``, and the ``fields`` column when ``stream`` declares its
        fields (``None`` otherwise): :func:`~millwheel._fields.split_values`."""
        return split_values(self.fields.get(stream), streams, stream, values)

    def consumers_of(self, streams: Iterable[str]) -> list[str]:
        """The consumers of any of ``streams``, sorted: the key columns a writer of them carries."""
        return sorted({c for s in streams for c, _ in self.consumers.get(s, ())})

    def arrow_fields(self, consumers: Sequence[str]) -> list[pa.Field]:
        out = []
        for c in consumers:
            k, i = self.columns(c)
            out += [pa.field(k, pa.binary()), pa.field(i, pa.int32())]
        return out

    def ddl(self, consumers: Sequence[str]) -> str:
        """The columns as a Spark DDL fragment (``""`` for none)."""
        parts = []
        for c in consumers:
            k, i = self.columns(c)
            parts += [f"`{k}` binary", f"`{i}` int"]
        return ", ".join(parts)

    def rows(
        self, rows: Sequence[tuple[str, Record | None]], consumers: Sequence[str]
    ) -> dict[str, list[Any]]:
        """The key columns of ``consumers`` for ``(stream, record)`` rows; a row whose stream
        the consumer does not read, or whose record is ``None`` (e.g. a summary), gets nulls."""
        n = len(rows)
        out: dict[str, list[Any]] = {}
        wanted = set(consumers)
        #: stream -> [(extractor, key column, interval column, key cache, intervals)]
        by_stream: dict[
            str, list[tuple[Extractor, list[Any], list[Any], dict[Any, tuple[bytes, int]], int]]
        ] = {}
        caches: dict[str, dict[Any, tuple[bytes, int]]] = {}
        for c in consumers:
            k, i = self.columns(c)
            out[k], out[i] = [None] * n, [None] * n
            caches[c] = {}
        for j, (stream, rec) in enumerate(rows):
            if rec is None:
                continue
            if rec.stream != stream:  # extractors see the stream a record is read from
                rec = Record(rec.key, rec.value, rec.timestamp, rec.id, stream)
            targets = by_stream.get(stream)
            if targets is None:
                targets = by_stream[stream] = [
                    (
                        e,
                        out[self.columns(c)[0]],
                        out[self.columns(c)[1]],
                        caches[c],
                        self.intervals_of(c),
                    )
                    for c, e in self.consumers.get(stream, ())
                    if c in wanted
                ]
            for extractor, kcol, icol, cache, intervals in targets:
                # the per-record path: a valid key seen before costs the extractor and a
                # dict lookup; anything else (an exception, an invalid or unhashable key)
                # leaves the row unkeyed for the consumer's own pass, which says why
                try:
                    key = extractor(rec)
                    hit = cache.get((type(key), key))
                except Exception:
                    continue
                if hit is None:
                    if key_problem(key) is not None:
                        continue
                    hit = cached_key(key, intervals, cache)
                kcol[j], icol[j] = hit
        return out

    def arrays(
        self, rows: Sequence[tuple[str, Record | None]], consumers: Sequence[str]
    ) -> list[pa.Array]:
        """:meth:`rows` as Arrow arrays, in :meth:`arrow_fields` order."""
        cols = self.rows(rows, consumers)
        return [pa.array(cols[f.name], f.type) for f in self.arrow_fields(consumers)]


def wants_dead_letters(keyer: Keyer | None) -> bool:
    """Whether anything consumes dead letters (then a dead letter's value is decoded to key it)."""
    return keyer is not None and DEAD_LETTER_STREAM in keyer.consumers
