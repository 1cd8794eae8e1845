"""A rewrite function applied to a computation's stored keys (``millwheel state rewrite``, ``_state_rewrite.py``).

The user's ``function(key, state, timers) -> (state, timers) | None`` sees each key in
user types: ``state`` decoded by the computation's own codec (a per-record computation's
envelope, ``millwheel/_envelope.py``) or, for a columnar computation, the key's state rows
as a list of dicts (``millwheel/_colstore.py``; ``None``: no rows); ``timers`` as
``{tag: (timestamp, TimeDomain)}``. It returns the key's new state and timers, or ``None``
to delete the key. What it does not see is kept as it was: the dedup ids, the key's
production sequence and life, its hold, pending strong productions. A deleted key drops
them all (its dedup ids with it: a record sent again after the rewrite is new to it, as
after its ids were collected); a key with pending strong productions cannot be deleted.
A key left keeping nothing is dropped as the step drops it: its next production starts a
new life, in a batch after the rewrite, so no production id is ever reused
(docs/concepts.md, "The identity of a production").

:class:`RewriteTask` runs it on Spark's Python workers (``mapInArrow`` over the stored
envelopes, or over the interval stores of a columnar computation);
:class:`StoreInstaller` puts a rewritten columnar store into a scratch query's state row.
:func:`settled` publishes and settles the stopped computation first, as a rescale does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import pyarrow as pa

from millwheel._colstore import ColumnarStore
from millwheel._coltimers import TimerTable
from millwheel._envelope import Envelope
from millwheel._errors import MillwheelError
from millwheel._options import ComputationOptions
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, TimeDomain, decode_key
from millwheel.runtime._fs import Location
from millwheel.runtime._lease import Lease
from millwheel.runtime._move import RescaleMismatch
from millwheel.runtime._settle import offline_outbox, settle
from millwheel.runtime._spark_internals import python_error

__all__ = [
    "REWRITE_INPUT",
    "REWRITE_OUTPUT",
    "RewriteError",
    "RewriteTask",
    "StoreInstaller",
    "apply_on_spark",
    "refuse",
    "rewrite_envelope",
    "rewrite_store",
    "settled",
]

#: the rows a rewrite task reads: a key's envelope (per-record), or an interval's store (columnar: key null)
REWRITE_INPUT = pa.schema([("group", pa.int32()), ("key", pa.binary()), ("value", pa.binary())])
#: what it answers: the new envelope or store (null: deleted, or nothing left), keys kept and deleted
REWRITE_OUTPUT = "group int, key binary, value binary, kept long, deleted long"

Function = Callable[[Any, Any, dict[str, tuple[int, TimeDomain]]], Any]


class RewriteError(MillwheelError):
    """The rewrite function failed on a key, or returned something that is not a key's state and timers."""


def _timers(name: str, key: Any, value: Any) -> dict[str, tuple[int, int]]:
    """A function's returned timers as the envelope keeps them, checked as ``set_timer`` checks them."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        msg = f"the rewrite function {name} returned timers {type(value).__name__} for key {key!r}: give a dict {{tag: (timestamp, TimeDomain)}}"
        raise RewriteError(msg)
    out: dict[str, tuple[int, int]] = {}
    for tag, pair in value.items():
        ok = type(tag) is str and isinstance(pair, (tuple, list)) and len(pair) == 2
        ts, domain = pair if ok else (None, None)
        d = int(domain) if isinstance(domain, int) else -1
        if (
            not ok
            or type(ts) is not int
            or d not in (int(TimeDomain.LOW_WATERMARK), int(TimeDomain.WALL_TIME))
            or not MIN_TIMESTAMP < ts <= MAX_TIMESTAMP
            or (ts == MAX_TIMESTAMP and d != int(TimeDomain.LOW_WATERMARK))
        ):
            msg = f"the rewrite function {name} returned timer {tag!r}: {pair!r} for key {key!r}: a timer is tag (str) -> (timestamp in ms, TimeDomain), as set_timer takes"
            raise RewriteError(msg)
        out[tag] = (ts, d)
    return out


def _result(name: str, key: Any, out: Any) -> tuple[Any, Any] | None:
    if out is None:
        return None
    if not isinstance(out, tuple) or len(out) != 2:
        msg = f"the rewrite function {name} returned {type(out).__name__} for key {key!r}: return (state, timers), or None to delete the key"
        raise RewriteError(msg)
    return out


def _call(fn: Function, name: str, key: Any, state: Any, timers: dict[str, Any]) -> Any:
    try:
        return fn(key, state, timers)
    except Exception as exc:
        msg = f"the rewrite function {name} failed on key {key!r}: {type(exc).__name__}: {exc}"
        raise RewriteError(msg) from exc


def rewrite_envelope(
    fn: Function, name: str, codec: Any, kb: bytes, raw: bytes
) -> tuple[bytes | None, bool]:
    """A per-record computation's key through ``fn``: ``(its new envelope or None, deleted)``."""
    env = Envelope.decode(raw)
    key = decode_key(kb)
    state = None if env.state is None else codec.decode(env.state)
    timers = {tag: (ts, TimeDomain(d)) for tag, (ts, d) in env.timers.items()}
    out = _result(name, key, _call(fn, name, key, state, timers))
    if out is None:
        if env.pending:
            msg = f"the rewrite function {name} deletes key {key!r}, which has {len(env.pending)} strong productions not yet delivered: resume the run until they are, then rewrite"
            raise RewriteError(msg)
        return None, True
    new_state, new_timers = out
    env.timers = _timers(name, key, new_timers)
    try:
        env.state = None if new_state is None else codec.encode(new_state)
    except Exception as exc:
        msg = f"the rewrite function {name} returned a state for key {key!r} that {type(codec).__name__} cannot encode: {type(exc).__name__}: {exc}"
        raise RewriteError(msg) from exc
    return (None if env.is_empty() else env.encode()), False


def _rows(name: str, key: Any, value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, dict):
        return [value]
    if isinstance(value, pd.DataFrame):
        return value.to_dict("records")
    if isinstance(value, list) and all(isinstance(r, dict) for r in value):
        return value
    msg = f"the rewrite function {name} returned state {type(value).__name__} for columnar key {key!r}: give its rows (a dict, a list of dicts or a DataFrame), or None"
    raise RewriteError(msg)


def rewrite_store(
    fn: Function, name: str, blob: bytes, options: ComputationOptions | None = None
) -> tuple[bytes | None, int, int]:
    """A columnar computation's interval store through ``fn``, key by key: ``(the new store
    blob or None, keys it keeps, keys deleted)``."""
    st = ColumnarStore.decode(blob, options)
    kbs = sorted(st.keys_held())
    rows: dict[bytes, list[dict[str, Any]]] = {}
    user_schema = None
    if st.state is not None and st.state.num_rows:
        user = st.state.drop_columns(["_kb"])
        user_schema = user.schema
        for kb, row in zip(st.state.column("_kb").to_pylist(), user.to_pylist(), strict=True):
            rows.setdefault(kb, []).append(row)
    timers: dict[bytes, dict[str, tuple[int, TimeDomain]]] = {}
    for (kb, tag), (ts, d) in st.timers.items():
        timers.setdefault(kb, {})[tag] = (ts, TimeDomain(d))
    pending = {p[1] for p in st.pending}
    deleted: set[bytes] = set()
    new_rows: list[dict[str, Any]] = []
    new_kbs: list[bytes] = []
    t_kb: list[bytes] = []
    t_tag: list[str] = []
    t_ts: list[int] = []
    t_d: list[int] = []
    for kb in kbs:
        key = decode_key(kb)
        out = _result(name, key, _call(fn, name, key, rows.get(kb), dict(timers.get(kb, {}))))
        if out is None:
            if kb in pending:
                msg = f"the rewrite function {name} deletes key {key!r}, which has strong productions not yet delivered: resume the run until they are, then rewrite"
                raise RewriteError(msg)
            deleted.add(kb)
            continue
        for r in _rows(name, key, out[0]):
            new_rows.append(r)
            new_kbs.append(kb)
        for tag, (ts, d) in _timers(name, key, out[1]).items():
            t_kb.append(kb)
            t_tag.append(tag)
            t_ts.append(ts)
            t_d.append(d)
    table = None
    if new_rows:
        try:
            table = pa.Table.from_pylist(new_rows, schema=user_schema)
        except (pa.ArrowException, TypeError, ValueError, KeyError):
            try:  # the function changed the columns: their types as its rows have them
                table = pa.Table.from_pylist(new_rows)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                msg = f"the rewrite function {name} returned state rows that cannot be stored as Arrow columns: {type(exc).__name__}: {exc}"
                raise RewriteError(msg) from None
        table = table.add_column(0, "_kb", pa.array(new_kbs, pa.binary()))
    dedup = st.dedup
    if deleted & set(dedup.keys):
        parts = dedup.split([1 if kb in deleted else 0 for kb in dedup.keys])
        kept = parts.get(0) or dedup.empty_like()
        # the segment files the old store names are let go as a batch lets them go: deleted
        # once the state store's history is past them (``_colsegments.py``), not at once,
        # since ``--undo`` puts back the store that names them
        kept.refs, kept.retired = set(dedup.refs), list(dedup.retired)
        dedup = kept
    new = dataclasses.replace(  # what the store holds besides (its state's version...) kept
        st,
        state=table,
        timers=TimerTable.of(t_kb, t_tag, t_ts, t_d),
        meta={kb: m for kb, m in st.meta.items() if kb not in deleted},
        pending=list(st.pending),
        dedup=dedup,
    )
    new.forget_empty([kb for kb in kbs if kb not in deleted])
    held = len(new.keys_held())
    return new.encode(), held, len(deleted)


def refuse(computation: str, msg: str) -> MillwheelError:
    """The error ``millwheel state rewrite`` refuses with."""
    return MillwheelError(f"cannot rewrite the state of {computation!r}: {msg}")


def settled(root: Location, computation: str, checkpoint: Location, lease: Lease, say: Any) -> int:
    """Publish what committed and drop a planned batch (``_settle.settle``); the last committed batch."""
    try:
        last, _ = settle(
            offline_outbox(root, computation, checkpoint, lease), root, computation, checkpoint, say
        )
    except MillwheelError as exc:
        raise refuse(computation, str(exc).removeprefix("cannot rescale: ")) from None
    return last


def apply_on_spark(spark: Any, table: pa.Table, task: RewriteTask) -> pa.Table:
    """``task`` over ``table``'s rows on Spark's Python workers (``mapInArrow``), collected."""
    if table.num_rows == 0:
        return pa.table({"group": [], "key": [], "value": [], "kept": [], "deleted": []})
    parts = max(1, min(64, table.num_rows // 20_000))
    df = spark.createDataFrame(table)
    try:
        return df.repartition(parts).mapInArrow(task, REWRITE_OUTPUT).toArrow()
    except Exception as exc:  # noqa: BLE001 - the user's error, from a worker: say it plainly
        text = python_error(exc)
        lines = [line for line in text.splitlines() if "RewriteError" in line]
        if lines:
            raise RewriteError(lines[-1].split("RewriteError: ", 1)[-1]) from None
        msg = f"the rewrite on Spark failed:\n{text}"
        raise MillwheelError(msg) from None


class RewriteTask:
    """The ``mapInArrow`` function of a rewrite (picklable: the user's function goes with it).

    Rows of :data:`REWRITE_INPUT` in, :data:`REWRITE_OUTPUT` out: per-record rows are one
    key's envelope each, columnar rows one interval's store each (key null)."""

    def __init__(
        self, fn: Function, name: str, codec: Any, options: Any, *, columnar: bool
    ) -> None:
        self.fn, self.name, self.codec, self.options = fn, name, codec, options
        self.columnar = columnar

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            groups = b.column("group").to_pylist()
            keys = b.column("key").to_pylist()
            values: list[bytes | None] = []
            kept: list[int] = []
            deleted: list[int] = []
            for kb, raw in zip(keys, b.column("value").to_pylist(), strict=True):
                if self.columnar:
                    blob, k, d = rewrite_store(self.fn, self.name, raw, self.options)
                else:
                    blob, gone = rewrite_envelope(self.fn, self.name, self.codec, kb, raw)
                    k, d = int(blob is not None), int(gone)
                values.append(blob)
                kept.append(k)
                deleted.append(d)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(groups, pa.int32()),
                    pa.array(keys, pa.binary()),
                    pa.array(values, pa.binary()),
                    pa.array(kept, pa.int64()),
                    pa.array(deleted, pa.int64()),
                ],
                names=["group", "key", "value", "kept", "deleted"],
            )


class StoreInstaller:
    """The ``applyInPandasWithState`` function of a scratch query that installs rewritten
    columnar stores (rows ``group, key null, store``): each group's store in its state row,
    without Spark's timeout (``_relayout.build_store``), as a new columnar query leaves it
    (``_columnar.py``); each group answers how many keys it installed."""

    def __init__(self, name: str, groups: list[int]) -> None:
        self.name = name
        self.groups = [int(g) for g in groups]

    def __call__(
        self, group: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        g = int(group[0])
        if g not in self.groups:
            msg = f"computation {self.name!r}: an install row names Spark group {g}, not one of its layout's {self.groups}"
            raise RescaleMismatch(msg)
        blobs = [v for pdf in frames for v in pdf["value"].tolist() if v is not None]
        if state.exists or len(blobs) > 1:
            msg = f"computation {self.name!r}: the install query got {len(blobs)} stores for group {g} (state there already: {state.exists})"
            raise RescaleMismatch(msg)
        keys = 0
        if blobs:
            keys = len(ColumnarStore.decode(blobs[0]).keys_held())
            state.update((blobs[0], b""))
        yield pd.DataFrame({"group": [g], "keys": [keys]})
