"""Declared fields of a stream: values that are plain records travel as columns (docs/runtime.md "Values as columns").

A stream may declare its fields (``Topology.stream("queries", fields={"query": str, "ms":
float})``). Declaring is opt-in and changes only how values are *stored*, never what a
reader sees: a value that **conforms** — a ``dict`` whose keys are exactly the declared
fields in the declared order, each value ``None`` or exactly the declared type (``bool``
is not ``int``; an ``int`` fits in int64) — is written as typed columns (the ``fields``
struct column of a stream-log file) with a null ``value``; any other value is pickled into
``value`` as before. Reading rebuilds the same dict (same keys, same order, plain Python
values), so the round trip is exact either way and nothing is dropped.

Pure Python and pyarrow (no pyspark): the writers, the readers, the harness and the
columnar runner share these definitions.

>>> f = StreamFields.of({"q": str, "n": int})
>>> f.conforms({"q": "cats", "n": 3}), f.conforms({"n": 3, "q": "cats"}), f.conforms({"q": "cats", "n": True})
(True, False, False)
>>> arr, values = f.split([{"q": "cats", "n": 3}, {"q": "dogs", "n": "3"}])
>>> values[0] is None, rebuild_values(values, arr)
(True, [{'q': 'cats', 'n': 3}, {'q': 'dogs', 'n': '3'}])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millwheel._codec import decode_value, encode_value
from millwheel._errors import TopologyError
from millwheel._record import utf8_text

if (
    TYPE_CHECKING
):  # imported where used: declaring a stream's fields needs neither (``import millwheel``)
    import pandas as pd
    import pyarrow as pa

#: the struct column of a stream-log file that holds conforming values
FIELDS_COLUMN = "fields"
#: a columnar computation asks for one field of the values with ``record_columns = (..., "value.<field>")``
FIELD_PREFIX = "value."

#: the Arrow type of a declared field (a ``pyarrow`` function's name)
_ARROW = {str: "string", int: "int64", float: "float64", bool: "bool_", bytes: "binary"}
_SPARK = {str: "string", int: "bigint", float: "double", bool: "boolean", bytes: "binary"}
_NAMES = {str: "str", int: "int", float: "float", bool: "bool", bytes: "bytes"}
#: the pandas dtype of a ``value.<field>`` column of a declared field (``object``: undeclared)
_DTYPES = {str: "object", int: "Int64", float: "float64", bool: "boolean", bytes: "object"}
_INT64: tuple[int, int] = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class StreamFields:
    """The declared fields of one stream: names and Python types, in order."""

    names: tuple[str, ...]
    types: tuple[type, ...]

    @classmethod
    def of(cls, fields: Mapping[str, type], stream: str = "?") -> StreamFields:
        """Checked: a non-empty mapping of field names (identifiers) to str, int, float, bool or bytes."""
        if not isinstance(fields, Mapping) or not fields:
            msg = f"stream {stream!r}: fields must be a non-empty dict {{name: type}}, e.g. {{'query': str, 'ms': float}}; got {fields!r}"
            raise TopologyError(msg)
        for name, t in fields.items():
            if not isinstance(name, str) or not name.isidentifier():
                msg = f"stream {stream!r}: field name {name!r} is not valid: use an identifier (letters, digits, '_')"
                raise TopologyError(msg)
            if t not in _ARROW:
                msg = f"stream {stream!r}: field {name!r} has type {t!r}; a declared field is str, int, float, bool or bytes (None is allowed in any)"
                raise TopologyError(msg)
        return cls(tuple(fields), tuple(fields.values()))

    def describe(self) -> list[list[str]]:
        """``[[name, type name], ...]``: what ``run.json`` pins."""
        return [[n, _NAMES[t]] for n, t in zip(self.names, self.types, strict=True)]

    def type_of(self, name: str) -> type | None:
        try:
            return self.types[self.names.index(name)]
        except ValueError:
            return None

    # ---- conformance -------------------------------------------------------------
    def conforms(self, value: Any) -> bool:
        """Whether ``value`` is stored as columns (see the module docstring)."""
        if type(value) is not dict or len(value) != len(self.names):
            return False
        for (k, v), name, t in zip(value.items(), self.names, self.types, strict=True):
            if k != name:
                return False
            if v is not None and (
                type(v) is not t
                or (t is int and not _fits_int64(v))
                or (isinstance(v, str) and not utf8_text(v))
            ):
                return False  # (a str with a lone surrogate has no Arrow form: it is pickled)
        return True

    # ---- Arrow -------------------------------------------------------------------
    def arrow_type(self, names: Iterable[str] | None = None) -> pa.StructType:
        """The struct type of the ``fields`` column (or of the ``names`` among them)."""
        import pyarrow as pa

        keep = self.names if names is None else tuple(names)
        return pa.struct(
            [
                pa.field(n, getattr(pa, _ARROW[t])())
                for n, t in zip(self.names, self.types, strict=True)
                if n in keep
            ]
        )

    def spark_ddl(self) -> str:
        """The ``fields`` column as a Spark DDL type."""
        return (
            "struct<"
            + ", ".join(f"`{n}`: {_SPARK[t]}" for n, t in zip(self.names, self.types, strict=True))
            + ">"
        )

    def split(self, values: Sequence[Any]) -> tuple[pa.StructArray, list[bytes | None]]:
        """The ``fields`` and ``value`` columns of ``values``: a conforming value as the
        struct (``value`` null), any other pickled (the struct null)."""
        import pyarrow as pa

        rows: list[Any] = []
        encoded: list[bytes | None] = []
        for v in values:
            if self.conforms(v):
                rows.append(v)
                encoded.append(None)
            else:
                rows.append(None)
                encoded.append(encode_value(v))
        return pa.array(rows, self.arrow_type()), encoded  # type: ignore[return-value]


def split_values(
    fields: StreamFields | None, streams: Sequence[str] | str, stream: str, values: Sequence[Any]
) -> tuple[pa.Array, pa.StructArray | None]:
    """The ``value`` column of a stream-log table, and its ``fields`` column when
    ``stream`` declares ``fields``: rows of another stream (``streams``, one per row or
    one for all: dead letters next to the records) are pickled."""
    import pyarrow as pa

    if fields is None:
        return pa.array([encode_value(v) for v in values], pa.binary()), None
    if isinstance(streams, str):
        if streams != stream:
            return pa.array([encode_value(v) for v in values], pa.binary()), pa.nulls(
                len(values), fields.arrow_type()
            )  # type: ignore[return-value]
        arr, enc = fields.split(values)
        return pa.array(enc, pa.binary()), arr
    mine = [s == stream for s in streams]
    if all(mine):
        arr, enc = fields.split(values)
        return pa.array(enc, pa.binary()), arr
    arr, enc = fields.split([v if m else _NEVER for v, m in zip(values, mine, strict=True)])
    enc = [e if m else encode_value(v) for e, v, m in zip(enc, values, mine, strict=True)]
    return pa.array(enc, pa.binary()), arr


#: a value that never conforms (a placeholder for rows of another stream)
_NEVER = object()


def rebuild_values(values: Sequence[Any], fields: pa.Array | Sequence[Any] | None) -> list[Any]:
    """Each row's value: decoded from ``value`` (pickled), or the dict of its ``fields``
    (stored as columns). ``fields``: the struct column, as Arrow or as Python dicts."""
    import pyarrow as pa

    rows = fields.to_pylist() if isinstance(fields, pa.Array | pa.ChunkedArray) else fields
    if rows is None:
        if any(v is None for v in values):
            msg = f"a stream-log row has a null value: it is stored as columns, read its {FIELDS_COLUMN!r} column too (rundir.read_log)"
            raise ValueError(msg)
        return [decode_value(v) for v in values]
    return [decode_value(v) if v is not None else f for v, f in zip(values, rows, strict=True)]


def decode_cell(value: Any) -> Any:
    """A value as the runtime carries it between reading and the step: pickled bytes
    (decoded here), or already a dict rebuilt from the row's fields."""
    return decode_value(value) if type(value) is bytes else value


# ---- columnar consumers: value.<field> ----------------------------------------------
def requested_fields(record_columns: Iterable[str]) -> tuple[str, ...]:
    """The fields a columnar computation asks for (``"value.ms"`` -> ``"ms"``)."""
    return tuple(c[len(FIELD_PREFIX) :] for c in record_columns if c.startswith(FIELD_PREFIX))


def field_type(declared: Iterable[StreamFields], name: str, who: str = "?") -> type | None:
    """The type of field ``name`` over a consumer's declared input streams (``None``: no
    stream declares it; two that declare it with different types are refused)."""
    found = {t for f in declared if (t := f.type_of(name)) is not None}
    if len(found) > 1:
        msg = f"{who}: field {name!r} is declared with different types on its input streams ({sorted(_NAMES[t] for t in found)}); value.{name} needs one"
        raise TopologyError(msg)
    return next(iter(found), None)


def field_column(values: Sequence[Any], name: str, typ: type | None) -> pd.Series:
    """The ``value.<name>`` column of decoded values: a mapping's field, else null.

    With a declared type (``typ``), a typed column (int: ``Int64``, float: ``float64``,
    bool: ``boolean``, str and bytes: ``object``) where a field of another type is null
    (an int is taken into a float field); without one, the field's values as they are
    (``object``). The harness and both Spark mappings build it here.
    """
    import numpy as np
    import pandas as pd

    raw: list[Any] = [v.get(name) if isinstance(v, Mapping) else None for v in values]
    if typ is None:
        return pd.Series(raw, dtype="object")
    if typ is float:
        out = np.fromiter(
            (float(x) if type(x) in (float, int) else np.nan for x in raw), np.float64, len(raw)
        )
        return pd.Series(out, dtype="float64")
    ok = [x if type(x) is typ and (typ is not int or _fits_int64(x)) else None for x in raw]
    return (
        pd.Series(pd.array(ok, dtype=_DTYPES[typ]))
        if typ in (int, bool)
        else pd.Series(ok, dtype="object")
    )


def _fits_int64(x: Any) -> bool:
    return bool(_INT64[0] <= x <= _INT64[1])
