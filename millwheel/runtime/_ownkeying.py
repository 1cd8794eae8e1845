"""The consumer's own keying of rows its producer did not key (MillWheel §4.2).

Every writer keys what it writes for each consumer (``_keying.py``). A row without its
consumer's ``interval:C`` column (a failed extractor at the producer, a file written before
the consumer read the stream or by a writer without a keyer) is keyed by the consumer: in
the query's keying stage (:func:`make_keying`, an Arrow UDF; ``plans/_inputs.keyed``), or
in the step (``_interval.IntervalBatch._key_here``) for a query without that stage, which
fails with :class:`KeyingStageNeeded` when the row belongs to another key interval.
Both call :func:`key_row`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from millwheel._codec import encode_value
from millwheel._delivery import key_record
from millwheel._fields import decode_cell
from millwheel._options import ErrorPolicy
from millwheel._record import Record, decode_key
from millwheel.runtime._keying import cached_key, dead_interval
from millwheel.runtime._wire import RowKind

__all__ = ["KEYING_RESULT", "KEYING_STAGE_NEEDED", "KeyingStageNeeded", "key_row", "make_keying"]

#: what the consumer's keying function returns per row (:func:`make_keying`), as a Spark type
KEYING_RESULT = "interval int, kind int, key binary, id string, ts long, value binary"
_KEYING_FIELDS = [
    pa.field("interval", pa.int32()),
    pa.field("kind", pa.int32()),
    pa.field("key", pa.binary()),
    pa.field("id", pa.string()),
    pa.field("ts", pa.int64()),
    pa.field("value", pa.binary()),
]


def key_row(
    consumer: str,
    stream: str,
    extractor: Callable[[Record], Any],
    intervals: int,
    cache: dict[Any, tuple[bytes, int]],
    pk: bytes | None,
    value: Any,
    ts: int,
    rid: str,
    on_error: ErrorPolicy = ErrorPolicy.DEAD_LETTER,
) -> tuple[tuple[bytes, int] | None, Record | None]:
    """One stream-log row keyed by its consumer (§4.2): the value decoded, the record built as
    its producer made it, :func:`~millwheel._delivery.key_record`. Returns ``((encoded key,
    interval), None)``, or ``(None, dead letter)`` — ``(None, None)``: a dead letter the
    consumer could not key, dropped; under ``ErrorPolicy.RAISE`` a failed extractor raises
    (:func:`~millwheel._delivery.key_record`). Both places a consumer keys rows call it: the keying
    stage (:func:`make_keying`) and the step (:meth:`IntervalBatch._key_here`)."""
    rec = Record(None if pk is None else decode_key(pk), decode_cell(value), ts, rid, stream)
    keyed, dead = key_record(consumer, stream, extractor, rec, on_error)
    if keyed is None:
        return None, dead
    return cached_key(keyed.key, intervals, cache), None


def make_keying(
    consumer: str,
    stream: str,
    extractor: Callable[[Record], Any],
    intervals: int,
    on_error: ErrorPolicy = ErrorPolicy.DEAD_LETTER,
) -> Callable[..., pa.StructArray]:
    """The consumer's own keying of the rows its producer did not key (§4.2), as an Arrow UDF.

    Arguments, one array each: ``needed`` (the row has no ``interval:C``: a failed
    extractor at the producer, or a file written before this consumer read the stream or
    by a writer without a keyer), then the row's ``id``, ``ts``, ``key``, ``value`` and ``fields`` (its
    declared fields' struct, ``_fieldcols.keying_fields``: a value stored as columns) —
    which the query passes only where ``needed`` (``plans/_inputs.keyed``): the rows their producer
    keyed, the common case, cost a few null columns, not their values, on the way to
    Python and back. Those rows get an all-null result and keep their producer's
    ``key:C`` / ``interval:C``. The others are keyed here, one
    :func:`~millwheel._delivery.key_record` call per record: ``interval``, ``kind`` and
    ``key``; a failed extractor gives the dead letter's ``kind``, and its ``id``, ``ts``
    and ``value`` replace the row's (null for a row keyed here: it keeps its own).
    """
    kind_record, kind_dropped, kind_dead = (
        int(RowKind.RECORD),
        int(RowKind.DROPPED),
        int(RowKind.DEAD_LETTER),
    )
    cache: dict[Any, tuple[bytes, int]] = {}

    def key(
        needed: pa.Array,
        ids: pa.Array,
        tss: pa.Array,
        pkeys: pa.Array,
        vals: pa.Array,
        fields: pa.Array,
    ) -> pa.Array:  # a StructArray; PySpark reads the hints as "scalar Arrow UDF"
        n = len(needed)
        if n == 0 or not pc.any(needed).as_py():  # every row keyed by its producer
            return pa.StructArray.from_arrays(
                [pa.nulls(n, f.type) for f in _KEYING_FIELDS], fields=_KEYING_FIELDS
            )
        if len(cache) > 100_000:
            cache.clear()
        o_interval: list[int | None] = [None] * n
        o_kind: list[int | None] = [None] * n
        o_key: list[bytes | None] = [None] * n
        o_id: list[str | None] = [None] * n
        o_ts: list[int | None] = [None] * n
        o_val: list[bytes | None] = [None] * n
        id_l, ts_l, pk_l, val_l = (
            ids.to_pylist(),
            tss.to_pylist(),
            pkeys.to_pylist(),
            [
                v if v is not None else f
                for v, f in zip(vals.to_pylist(), fields.to_pylist(), strict=True)
            ],
        )
        for i, need in enumerate(needed.to_pylist()):
            if not need:
                continue
            keyed, dead = key_row(
                consumer,
                stream,
                extractor,
                intervals,
                cache,
                pk_l[i],
                val_l[i],
                ts_l[i],
                id_l[i],
                on_error,
            )
            if keyed is not None:
                o_key[i], o_interval[i] = keyed
                o_kind[i] = kind_record
                continue
            o_interval[i] = dead_interval(id_l[i], intervals)
            if dead is None:
                o_kind[i] = kind_dropped
            else:
                o_kind[i] = kind_dead
                o_id[i], o_ts[i], o_val[i] = dead.id, dead.timestamp, encode_value(dead.value)
        return pa.StructArray.from_arrays(
            [
                pa.array(o_interval, pa.int32()),
                pa.array(o_kind, pa.int32()),
                pa.array(o_key, pa.binary()),
                pa.array(o_id, pa.string()),
                pa.array(o_ts, pa.int64()),
                pa.array(o_val, pa.binary()),
            ],
            fields=_KEYING_FIELDS,
        )

    return key


#: what the message of :class:`KeyingStageNeeded` starts with: the driver looks for it in a
#: failed query's error (``_query.ComputationQuery.check``)
KEYING_STAGE_NEEDED = (
    "millwheel: a row not keyed for this computation belongs to another key interval"
)


class KeyingStageNeeded(RuntimeError):
    """A row its producer did not key (:attr:`RowKind.UNKEYED`) reached a query planned
    without the keying stage, and its key falls in another interval than the one it was
    sent to. The batch fails before anything commits; the driver restarts the query with
    the keying stage, and the batch runs again from its checkpoint."""
