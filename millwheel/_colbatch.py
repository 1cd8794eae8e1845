"""The user's view of one columnar call (:class:`Batch`): records or due timers of some
keys, their state, and the calls that change them, applied by ``_colrunner.py``'s runner
when the call returns (all or nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from millwheel._codec import encode_value
from millwheel._colout import Outputs
from millwheel._colstore import ColumnarStore
from millwheel._contract import check_output
from millwheel._errors import ComputationError, StateCodecError
from millwheel._record import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Key,
    TimeDomain,
    key_problem,
    production_time,
    short_repr,
)

_LW = int(TimeDomain.LOW_WATERMARK)
_WALL = int(TimeDomain.WALL_TIME)


def _columns(t: pa.Table) -> dict[str, Any]:
    """A table's columns for a frame, column by column (cheaper than ``Table.to_pandas`` for small tables)."""
    cols = {}
    for name, col in zip(t.column_names, t.columns, strict=True):
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            cols[name] = col.to_numpy() if col.null_count == 0 else col.to_pandas()
        else:
            cols[name] = col.to_pandas()
    return cols


def key_categories(keys: list[Key]) -> pd.Index | None:
    """The categories of a call's ``key`` columns: its keys (``None``: tuple keys, which a
    pandas index would turn into levels; their columns stay plain objects)."""
    if tuple in set(map(type, keys)):
        return None
    return pd.Index(keys, dtype=object)


def key_column_of(codes: np.ndarray, keys: list[Key], cats: pd.Index | None) -> Any:
    if cats is None:
        return [keys[c] for c in codes.tolist()]
    return pd.Categorical.from_codes(codes, categories=cats)


def to_arrow(rows: pd.DataFrame) -> pa.Table:
    """The non-key columns of ``rows`` as an Arrow table (numeric numpy columns without pandas' conversion machinery)."""
    arrays, names = [], []
    for name in rows.columns:
        if name == "key":
            continue
        col = rows[name]
        v = col.to_numpy() if col.dtype.kind in "iufb" else None
        arrays.append(pa.array(v) if v is not None else pa.Array.from_pandas(col))
        names.append(str(name))
    return pa.Table.from_arrays(arrays, names=names)


class Batch:
    """What a columnar computation sees in one call: records (or due timers) of some keys,
    their state, and the calls that change them. Changes apply when the call returns
    (all or nothing)."""

    __slots__ = (
        "_runner",
        "_store",
        "_kbs",
        "_key_of",
        "_kb_of",
        "_rows",
        "_state_cache",
        "_kb_pa",
        "_cats",
        "_kb_arr",
        "_keys",
        "low_watermark",
        "now",
        "_set_state",
        "_timer_ops",
        "_prod",
        "_holds",
    )

    def __init__(
        self,
        runner: Any,
        store: ColumnarStore,
        kbs: list[bytes],
        key_of: dict[bytes, Key],
        rows: pd.DataFrame | None,
        low_watermark: int,
        now: int,
        cats: pd.Index | None = None,
    ) -> None:
        """``cats``: the categories of the call's key columns when the runner made them (the keys ``kbs`` decoded, in order)."""
        self._runner = runner
        self._store = store
        self._kbs = kbs
        self._key_of = key_of
        self._keys = [key_of[kb] for kb in kbs]
        self._cats = cats if cats is not None else key_categories(self._keys)
        self._kb_arr = np.array(kbs + [b""], dtype=object)[
            :-1
        ]  # an object array even if every key has one length
        self._kb_of: dict[Any, bytes] | None = None
        self._rows = rows
        #: the state rows of the call's keys (their key column dropped) and each row's key index
        self._state_cache: tuple[pa.Table | None, np.ndarray] | None = None
        self._kb_pa: pa.Array | None = None
        self.low_watermark = low_watermark
        self.now = now
        self._set_state: list[tuple[set[bytes], pa.Table | None]] = []
        self._timer_ops: list[tuple[str, list[bytes], list[str], Any, Any]] = []
        self._prod: list[
            tuple[
                str,
                list[bytes],
                list[Any],
                list[bytes],
                np.ndarray,
                list[str | None] | None,
                list[bool] | None,
            ]
        ] = []
        self._holds: dict[bytes, int | None] = {}

    def apply(self, outputs: Outputs) -> None:
        """Apply what this call did, once it returned: its state, timer and hold changes to the
        store, in the order made, its productions to ``outputs`` (the runner's; all or
        nothing: a call that raised is never applied)."""
        st = self._store
        for replaced, table in self._set_state:
            st.replace_state(replaced, table)
        for op, kbs, tags, tss, d in self._timer_ops:
            st.timers = (
                st.timers.set_many(kbs, tags, tss, d)
                if op == "set"
                else st.timers.delete_many(kbs, tags)
            )
        for kb, t in self._holds.items():
            st.set_hold(kb, t)
        key_of = self._key_of
        for stream, kbs, vals, enc, ts, once, tentative in self._prod:
            outputs.extend(stream, kbs, [key_of[kb] for kb in kbs], vals, enc, ts, once, tentative)

    # -- reading ---------------------------------------------------------------------
    @property
    def records(self) -> pd.DataFrame:
        """This call's records (``record_columns``), grouped by key, each key's in delivery order."""
        if self._rows is None:
            return pd.DataFrame({c: [] for c in self._runner.record_columns})
        return self._rows

    @property
    def keys(self) -> list[Key]:
        """The keys of this call: those with records, or with due timers (the categories of the ``key`` columns)."""
        return list(self._keys)

    def key_codes(self, keys: Any) -> np.ndarray:
        """A ``key`` column (or any keys of this call) as indices into :attr:`keys`."""
        arr = keys.array if isinstance(keys, pd.Series) else keys
        if (
            isinstance(arr, pd.Categorical)
            and self._cats is not None
            and arr.categories.equals(self._cats)
        ):
            return np.asarray(arr.codes, np.int64)
        index = {k: i for i, k in enumerate(self._keys)}
        vals = keys.tolist() if hasattr(keys, "tolist") else list(keys)
        try:
            return np.fromiter((index[k] for k in vals), np.int64, len(vals))
        except (KeyError, TypeError):
            msg = f"columnar computation {self._runner.name!r}: key_codes: a key is not one of this call's keys"
            raise ComputationError(msg) from None

    def key_column(self, codes: Any) -> Any:
        """Keys from indices into :attr:`keys`: a categorical over them (a list for tuple keys),
        what every call taking ``keys=`` reads fastest."""
        return key_column_of(np.asarray(codes, np.int64), self._keys, self._cats)

    @property
    def state(self) -> pd.DataFrame:
        """The state rows of this call's keys: a ``key`` column and the columns you stored
        (a new frame at every read: yours to change)."""
        if self._state_cache is None:
            found = self._store.state_rows(self._kb_arrow())
            self._state_cache = (
                (None, np.empty(0, np.int64))
                if found is None
                else (found[0].drop_columns(["_kb"]), found[1])
            )
        t, codes = self._state_cache
        cols = {"key": key_column_of(codes, self._keys, self._cats)}
        if t is not None:
            cols.update(_columns(t))
        return pd.DataFrame(cols)

    def _kb_arrow(self) -> pa.Array:
        """This call's encoded keys as an Arrow array (index ``i``: key ``i``)."""
        if self._kb_pa is None:
            self._kb_pa = pa.array(self._kbs, pa.binary())
        return self._kb_pa

    def pending_timers(self) -> pd.DataFrame:
        """Pending timers of this call's keys (``key, tag, timestamp, domain``), earliest first per key."""
        want = set(self._kbs)
        items = sorted(
            ((kb, tag, ts, d) for (kb, tag), (ts, d) in self._store.timers.items() if kb in want),
            key=lambda x: (x[0], x[2], x[3], x[1]),
        )
        index = {kb: i for i, kb in enumerate(self._kbs)}
        return pd.DataFrame(
            {
                "key": key_column_of(
                    np.array([index[i[0]] for i in items], np.int64), self._keys, self._cats
                ),
                "tag": [i[1] for i in items],
                "timestamp": np.array([i[2] for i in items], np.int64),
                "domain": np.array([i[3] for i in items], np.int8),
            }
        )

    # -- checks ----------------------------------------------------------------------
    def _codes(self, keys: Any, what: str) -> np.ndarray | None:
        """Indices into this call's keys of a categorical over them (``None``: ``keys`` is not one)."""
        if (
            isinstance(keys, (pd.Series, pd.Categorical, pd.CategoricalIndex))
            and isinstance(keys.dtype, pd.CategoricalDtype)
            and self._cats is not None
        ):
            cat = keys.dtype.categories
            if cat is self._cats or cat.equals(self._cats):
                codes = np.asarray(keys.cat.codes if isinstance(keys, pd.Series) else keys.codes)
                if len(codes) and codes.min() < 0:
                    msg = f"columnar computation {self._runner.name!r}: {what}: a key is missing (NaN)"
                    raise ComputationError(msg)
                return codes
        return None

    def _kb(self, keys: Any, what: str) -> list[bytes]:
        """Encoded keys of ``keys``, each one of this call's keys."""
        codes = self._codes(keys, what)
        if codes is not None:
            return self._kb_arr[codes].tolist()
        if (
            isinstance(keys, (pd.Series, pd.Categorical, pd.CategoricalIndex))
            and isinstance(keys.dtype, pd.CategoricalDtype)
            and self._cats is not None
        ):
            keys = np.asarray(keys, dtype=object)  # a categorical over other keys
        if self._kb_of is None:
            key_of = self._key_of
            self._kb_of = {key_of[kb]: kb for kb in self._kbs}
        kb_of = self._kb_of
        out = []
        for k in keys.tolist() if hasattr(keys, "tolist") else list(keys):
            kb = kb_of.get(k) if type(k) is not list else None
            if kb is None:
                why = key_problem(k)
                detail = (
                    why
                    if why is not None
                    else f"key {short_repr(k)} is not one of this call's keys (a computation changes only the keys it was given)"
                )
                msg = f"columnar computation {self._runner.name!r}: {what}: {detail}"
                raise ComputationError(msg)
            out.append(kb)
        return out

    def _timestamps(
        self, timestamps: Any, n: int, what: str, *, upper: int = MAX_TIMESTAMP - 1
    ) -> np.ndarray:
        arr = np.asarray(timestamps)
        if arr.shape != (n,):
            msg = f"columnar computation {self._runner.name!r}: {what}: {n} keys but timestamps of shape {arr.shape}"
            raise ComputationError(msg)
        if n and arr.dtype.kind not in "iu":
            msg = f"columnar computation {self._runner.name!r}: {what}: timestamps must be ints (ms since epoch), got dtype {arr.dtype}"
            raise ComputationError(msg)
        arr = arr.astype(np.int64, copy=False) if arr.dtype.kind == "i" else arr.astype(np.int64)
        if n and (int(arr.min()) <= MIN_TIMESTAMP or int(arr.max()) > upper):
            msg = f"columnar computation {self._runner.name!r}: {what}: a timestamp is outside the 64-bit range of millwheel timestamps"
            raise ComputationError(msg)
        return arr

    # -- changing --------------------------------------------------------------------
    def set_state(self, rows: pd.DataFrame, keys: Any = None) -> None:
        """The state of ``keys`` (default: every key of this call) becomes their rows in
        ``rows`` (a frame with a ``key`` column); a key without rows keeps no state."""
        if not isinstance(rows, pd.DataFrame) or "key" not in rows.columns:
            msg = f"columnar computation {self._runner.name!r}: set_state takes a pandas DataFrame with a 'key' column"
            raise ComputationError(msg)
        replaced = set(self._kbs) if keys is None else set(self._kb(keys, "set_state(keys=...)"))
        codes = self._codes(rows["key"], "set_state") if keys is None else None
        kb_col: Any
        if (
            codes is not None
        ):  # a categorical over the call's keys, every one replaced: the key column taken in Arrow
            kb_col = self._kb_arrow().take(pa.array(codes.astype(np.int32, copy=False)))
        else:
            kbs = self._kb(rows["key"], "set_state")
            if not replaced.issuperset(kbs):
                msg = f"columnar computation {self._runner.name!r}: set_state has rows of keys outside keys=..."
                raise ComputationError(msg)
            kb_col = pa.array(kbs, pa.binary())
        table = None
        if len(rows):
            try:
                table = to_arrow(rows)
            except Exception as exc:
                msg = f"columnar computation {self._runner.name!r}: set_state: the rows cannot be stored as Arrow columns: {type(exc).__name__}: {str(exc)[:200]}"
                raise StateCodecError(msg) from None
            table = table.add_column(0, "_kb", kb_col)
        self._set_state.append((replaced, table))
        self._state_cache = None

    def set_timers(
        self, keys: Any, tags: Any, timestamps: Any, domain: TimeDomain = TimeDomain.LOW_WATERMARK
    ) -> None:
        """Set (or replace: same key and tag) one timer per row (§4.6)."""
        kbs = self._kb(keys, "set_timers")
        tag_l = tags.tolist() if hasattr(tags, "tolist") else list(tags)
        if len(tag_l) != len(kbs) or any(type(t) is not str for t in tag_l):
            msg = f"columnar computation {self._runner.name!r}: set_timers takes one str tag per key ({len(kbs)} keys, {len(tag_l)} tags)"
            raise ComputationError(msg)
        d = int(domain) if isinstance(domain, int) else -1
        if d not in (_LW, _WALL):
            msg = f"columnar computation {self._runner.name!r}: set_timers domain must be a TimeDomain, got {domain!r}"
            raise ComputationError(msg)
        ts = self._timestamps(
            timestamps,
            len(kbs),
            "set_timers",
            upper=MAX_TIMESTAMP if d == _LW else MAX_TIMESTAMP - 1,
        )
        self._timer_ops.append(("set", kbs, tag_l, ts.tolist(), d))

    def delete_timers(self, keys: Any, tags: Any) -> None:
        """Cancel timers ``(key, tag)``; no error for one that is not set."""
        kbs = self._kb(keys, "delete_timers")
        tag_l = tags.tolist() if hasattr(tags, "tolist") else list(tags)
        self._timer_ops.append(("delete", kbs, tag_l, None, None))

    def hold_watermark(self, keys: Any, timestamps: Sequence[int | None]) -> None:
        """Hold the low watermark per key (§7.2, ``Computation.hold_watermark``); ``None`` releases."""
        kbs = self._kb(keys, "hold_watermark")
        vals = timestamps.tolist() if hasattr(timestamps, "tolist") else list(timestamps)
        for kb, t in zip(kbs, vals, strict=True):
            if t is not None and (type(t) is not int or not MIN_TIMESTAMP < t < MAX_TIMESTAMP):
                msg = f"columnar computation {self._runner.name!r}: hold_watermark takes int timestamps (ms) or None, got {short_repr(t)}"
                raise ComputationError(msg)
            self._holds[kb] = t

    def produce(
        self,
        stream: str,
        values: Sequence[Any],
        *,
        keys: Any,
        timestamps: Any = None,
        once_ids: Any = None,
        once_tentative: Any = False,
    ) -> None:
        """Productions to ``stream``, one per value, each for its key (the key whose
        sequence numbers its id); ``timestamps`` default to the low watermark.

        ``once_ids`` (one ``str`` or ``None`` per value) makes productions conditional on
        the IdRegistry, as ``Computation.produce(..., once_id=...)`` (Photon §2);
        ``once_tentative`` (one bool, or one per value) marks decisions that yield."""
        runner = self._runner
        check_output(runner.name, runner.outputs, stream)
        kbs = self._kb(keys, f"produce({stream!r})")
        vals = values.tolist() if isinstance(values, (pd.Series, np.ndarray)) else list(values)
        if len(vals) != len(kbs):
            msg = f"columnar computation {runner.name!r}: produce({stream!r}): {len(vals)} values for {len(kbs)} keys"
            raise ComputationError(msg)
        if timestamps is None:
            ts = np.full(len(kbs), production_time(self.low_watermark), np.int64)
        else:
            ts = self._timestamps(timestamps, len(kbs), f"produce({stream!r})")
        once = tentative = None
        if once_ids is not None:
            once = once_ids.tolist() if hasattr(once_ids, "tolist") else list(once_ids)
            if len(once) != len(kbs) or any(
                o is not None and (type(o) is not str or not o) for o in once
            ):
                msg = f"columnar computation {runner.name!r}: produce({stream!r}, once_ids=...) takes one non-empty str (or None) per value"
                raise ComputationError(msg)
            flags = (
                [bool(once_tentative)] * len(kbs)
                if isinstance(once_tentative, (bool, np.bool_))
                else [bool(t) for t in once_tentative]
            )
            if len(flags) != len(kbs):
                msg = f"columnar computation {runner.name!r}: produce({stream!r}): {len(flags)} once_tentative flags for {len(kbs)} values"
                raise ComputationError(msg)
            tentative = [f and o is not None for f, o in zip(flags, once, strict=True)]
        try:
            encoded = list(map(encode_value, vals))
        except StateCodecError as exc:
            msg = f"computation {runner.name!r}: produce({stream!r}): {exc}"
            raise ComputationError(msg) from None
        self._prod.append((stream, kbs, vals, encoded, ts, once, tentative))


_to_arrow = to_arrow  # the name ``millwheel/testing/_columnar.py`` imports
