"""Declared fields on Spark: what a consumer's query reads and carries (docs/runtime.md "Values as columns").

A stream that declares its fields (``millwheel/_fields.py``) has a ``fields`` struct column
in its stream-log files: a conforming value's fields, with ``value`` null. A consumer's
query reads that column with the declared type and carries, per input stream, the
column ``mw_fields_<i>``: the struct of only the fields the consumer needs —

* a per-record computation, or a columnar one that lists ``"value"`` (or sends late
  records to a stream): all of them (it sees whole values);
* a columnar one that lists ``"value.<field>"`` columns: those fields;
* a columnar one that reads no values: none (no column at all).

``value`` itself travels as it is in the file: the pickled bytes of a value that does not
conform, null for one stored as columns. In the worker, :func:`with_values` puts each
row's value back together before anything reads it: the pickled bytes, or the dict of its
carried fields (:func:`~millwheel._fields.decode_cell` decodes either).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa

from millwheel._columnar import is_columnar
from millwheel._errors import MillwheelError
from millwheel._fields import FIELD_PREFIX, FIELDS_COLUMN, StreamFields, requested_fields
from millwheel._options import LateAction
from millwheel._topology import ComputationSpec
from millwheel.runtime._fs import Location
from millwheel.runtime._keying import Keyer
from millwheel.runtime._layout import read_pin, update_pin

#: the carried column of a consumer's ``i``-th input stream is ``mw_fields_<i>``: a plain
#: name, as ``transformWithStateInPandas`` renames a column named ``mw_fields_<i>`` to ``_1``
CARRY_PREFIX = "mw_fields_"


def record_columns(spec: ComputationSpec) -> tuple[str, ...]:
    """A columnar computation's ``record_columns``, read in the driver."""
    cols = spec.cls.record_columns  # type: ignore[attr-defined]
    if isinstance(
        cols, property
    ):  # a property of its params (ColumnarWindowAggregate): built, never set up
        cols = spec.cls(**spec.params).record_columns  # type: ignore[attr-defined]
    return tuple(cols)


def reads_values(spec: ComputationSpec) -> bool:
    """Does a columnar computation read its records' values (``value`` or ``value.<field>``)?"""
    return any(c == "value" or c.startswith(FIELD_PREFIX) for c in record_columns(spec))


def needed_fields(spec: ComputationSpec, keyer: Keyer, stream: str) -> tuple[str, ...]:
    """The declared fields of ``stream`` that ``spec``'s computation needs (see the module docstring)."""
    declared = keyer.fields.get(stream)
    if declared is None:
        return ()
    if not is_columnar(spec.cls) or spec.options.late.action is LateAction.TO_STREAM:
        return declared.names
    cols = record_columns(spec)
    if "value" in cols:
        return declared.names
    asked = set(requested_fields(cols))
    return tuple(n for n in declared.names if n in asked)


def input_schema(base: str, keyer: Keyer, stream: str) -> str:
    """The schema a consumer reads ``stream``'s files with: ``base`` and its ``fields`` column."""
    declared = keyer.fields.get(stream)
    return base if declared is None else f"{base}, {FIELDS_COLUMN} {declared.spark_ddl()}"


def carry_columns(spec: ComputationSpec, keyer: Keyer, stream: str) -> list[Any]:
    """The carried column of ``stream`` for ``spec``'s query (``[]``: nothing to carry)."""
    from pyspark.sql import functions as F

    names = needed_fields(spec, keyer, stream)
    if not names:
        return []
    src = F.col(FIELDS_COLUMN)
    struct = F.struct(*(src.getField(n).alias(n) for n in names))
    return [
        F.when(src.isNotNull(), struct).alias(f"{CARRY_PREFIX}{list(spec.inputs).index(stream)}")
    ]


def keying_fields(keyer: Keyer, stream: str, need: Any) -> Any:
    """The ``fields`` argument of the keying UDF (``_interval.make_keying``): the whole
    struct of the rows it keys (it builds their records), an all-null column otherwise."""
    from pyspark.sql import functions as F

    if stream not in keyer.fields:
        return F.lit(None).cast("binary")
    return F.when(need, F.col(FIELDS_COLUMN))


def output_schema(base: str, out_fields: tuple[str, StreamFields] | None) -> str:
    """A step's output schema: ``base`` and, for a computation with a declared output
    stream, its ``fields`` column (:meth:`~millwheel.runtime._keying.Keyer.output_fields`)."""
    return base if out_fields is None else f"{base}, {FIELDS_COLUMN} {out_fields[1].spark_ddl()}"


def production_fields(
    cols: dict[str, Any],
    out_fields: tuple[str, StreamFields] | None,
    streams: Sequence[str],
    values: Sequence[Any],
) -> None:
    """Store a step's conforming productions to its declared output stream as columns:
    ``cols["value"]`` null for them and ``cols["fields"]`` their dicts (``None`` for every
    other row: other streams, dead letters, the summary). Nothing without ``out_fields``."""
    if out_fields is None:
        return
    stream, declared = out_fields
    encoded = list(cols["value"])
    fields: list[Any] = [None] * len(encoded)
    for i, (s, v) in enumerate(zip(streams, values, strict=True)):
        if s == stream and declared.conforms(v):
            encoded[i], fields[i] = None, v
    cols["value"], cols[FIELDS_COLUMN] = encoded, pd.Series(fields, dtype="object")


def _as_dict(row: Any) -> dict[str, Any]:
    if type(row) is dict:
        return row
    if hasattr(row, "asDict"):  # a pyspark Row
        return row.asDict()
    return dict(row)


def table_frame(table: pa.Table) -> pd.DataFrame:
    """An Arrow table of union rows as pandas, its ``mw_fields_<i>`` columns as Python dicts of
    exact values (pyarrow's own conversion turns an int field with nulls into floats)."""
    carried = [c for c in table.column_names if c.startswith(CARRY_PREFIX)]
    if not carried:
        return table.to_pandas()
    pdf = table.drop_columns(carried).to_pandas()
    for c in carried:
        pdf[c] = pd.Series(table.column(c).to_pylist(), index=pdf.index, dtype="object")
    return pdf


def with_values(pdf: pd.DataFrame) -> pd.DataFrame:
    """``pdf`` with each ``value`` that is null and has carried fields replaced by the dict
    of them, and the ``mw_fields_<i>`` columns dropped (``pdf`` itself when it has none)."""
    cols = [c for c in pdf.columns if c.startswith(CARRY_PREFIX)]
    if not cols:
        return pdf
    values = pdf["value"].tolist()
    for c in cols:
        for i, f in enumerate(pdf[c].tolist()):
            if f is not None and f == f and values[i] is None:
                values[i] = _as_dict(f)
    return pdf.drop(columns=cols).assign(value=pd.Series(values, index=pdf.index, dtype="object"))


def pin_fields(root: Location, declared: Mapping[str, StreamFields]) -> None:
    """The declared fields of every stream, pinned in ``run.json`` (``"fields"``).

    A stream's files hold its conforming values in a ``fields`` column of the declared
    types, which every consumer's query reads with the type it declares now: a field
    of another type makes Spark's Parquet reader fail (or read nulls), a stream no longer
    declared would read the conforming rows' null ``value``. So a run whose declaration of
    a pinned stream differs — other fields, other types, other order, or none — is refused
    before anything is written. Declaring a stream that was not declared is allowed (its
    older files have no ``fields`` column: they read as pickled values, as before).
    """
    held = read_pin(root)
    pins: dict[str, Any] = dict(held.get("fields") or {})
    problems = []
    for stream, was in sorted(pins.items()):
        now = declared.get(stream)
        if now is None:
            problems.append(
                f"stream {stream!r} was declared with fields {_show(was)}; this run does not declare them"
            )
        elif now.describe() != was:
            problems.append(
                f"stream {stream!r} was declared with fields {_show(was)}; this run declares {_show(now.describe())}"
            )
    if problems:
        msg = (
            f"run directory {root.uri}: "
            + "; ".join(problems)
            + ". Its files hold values as columns of the pinned types: "
            "run it with the same Topology.stream(..., fields=...) declarations, or start the new ones in a new run directory"
        )
        raise MillwheelError(msg)
    added = {s: f.describe() for s, f in declared.items() if s not in pins}
    if added or "fields" not in held:
        update_pin(root, lambda h: h.__setitem__("fields", {**(h.get("fields") or {}), **added}))


def _show(items: list[list[str]]) -> str:
    return "{" + ", ".join(f"{n}: {t}" for n, t in items) + "}"
