"""The timers of a columnar store (``_colstore.py``) as columns.

A key interval holds a timer per key and tag (MillWheel §4.6: setting a timer with the
same tag replaces it), often thousands of them (the windowed count: one per key and
window with records). A dict of them cost Python work per held timer in every batch:
finding the due ones, the store's next timers, encoding the store. :class:`TimerTable`
keeps them as four columns — encoded key, tag, timestamp, domain — so those are numpy
passes, and it is read as the mapping ``(key bytes, tag) -> (timestamp, domain)`` it
replaces. A table is never changed in place: every change makes a new one, so a copied
store (the harness's rounds) shares the columns safely.

>>> t = TimerTable().set_many([b"a", b"b", b"a"], ["x", "x", "y"], [30, 10, 20], 0)
>>> t = t.set_many([b"a"], ["x"], [5], 0)                      # same key and tag: replaced
>>> sorted(t.items()), t.next_timers()
([((b'a', 'x'), (5, 0)), ((b'a', 'y'), (20, 0)), ((b'b', 'x'), (10, 0))], (5, None))
>>> [(t.kb[i], t.tag[i]) for i in t.ordered(t.due(12, 0)).tolist()]
[(b'a', 'x'), (b'b', 'x')]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from millwheel._contract import timers_due, timers_order
from millwheel._record import TimeDomain

_LW = int(TimeDomain.LOW_WATERMARK)


def _objects(items: Iterable[Any]) -> np.ndarray:
    """A 1-d object array (bytes or str items stay whole)."""
    items = list(items)
    out = np.empty(len(items), object)
    out[:] = items
    return out


class TimerTable(Mapping):  # type: ignore[type-arg]
    """Timers ``(encoded key, tag) -> (timestamp, domain)`` as columns; see the module docstring."""

    __slots__ = ("kb", "tag", "ts", "d", "_index")

    def __init__(
        self,
        kb: np.ndarray | None = None,
        tag: np.ndarray | None = None,
        ts: np.ndarray | None = None,
        d: np.ndarray | None = None,
    ) -> None:
        self.kb = _objects(()) if kb is None else kb
        self.tag = _objects(()) if tag is None else tag
        self.ts = np.empty(0, np.int64) if ts is None else np.asarray(ts, np.int64)
        self.d = np.empty(0, np.int8) if d is None else np.asarray(d, np.int8)
        self._index: dict[tuple[bytes, str], int] | None = None

    @classmethod
    def of(
        cls, kbs: Sequence[bytes], tags: Sequence[str], ts: Sequence[int], ds: Sequence[int]
    ) -> TimerTable:
        return cls(_objects(kbs), _objects(tags), np.asarray(ts, np.int64), np.asarray(ds, np.int8))

    # -- the mapping ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ts)

    def __iter__(self) -> Iterator[tuple[bytes, str]]:
        return zip(self.kb.tolist(), self.tag.tolist(), strict=True)

    def __getitem__(self, key: tuple[bytes, str]) -> tuple[int, int]:
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self)}
        i = self._index[key]
        return int(self.ts[i]), int(self.d[i])

    def items(self) -> Any:
        return list(zip(self, zip(self.ts.tolist(), self.d.tolist(), strict=True), strict=True))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TimerTable({dict(self.items())!r})"

    # -- changes (each makes a new table) -------------------------------------------
    def take(self, rows: np.ndarray) -> TimerTable:
        return TimerTable(self.kb[rows], self.tag[rows], self.ts[rows], self.d[rows])

    def without(self, rows: np.ndarray) -> TimerTable:
        keep = np.ones(len(self), np.bool_)
        keep[rows] = False
        return self.take(np.flatnonzero(keep))

    def set_many(
        self, kbs: Sequence[bytes], tags: Sequence[str], ts: Sequence[int] | np.ndarray, domain: int
    ) -> TimerTable:
        """These timers set (a key and tag set before, here or earlier, is replaced: the last wins)."""
        if not len(kbs):
            return self
        kb = np.concatenate([self.kb, _objects(kbs)])
        tag = np.concatenate([self.tag, _objects(tags)])
        t = np.concatenate([self.ts, np.asarray(ts, np.int64)])
        d = np.concatenate([self.d, np.full(len(kbs), domain, np.int8)])
        kc, ku = pd.factorize(kb)
        tc, tu = pd.factorize(tag)
        pair = kc.astype(np.int64) * len(tu) + tc
        if len(np.unique(pair)) < len(pair):
            _, last = np.unique(pair[::-1], return_index=True)
            rows = np.sort(len(pair) - 1 - last)
            return TimerTable(kb[rows], tag[rows], t[rows], d[rows])
        return TimerTable(kb, tag, t, d)

    def delete_many(self, kbs: Sequence[bytes], tags: Sequence[str]) -> TimerTable:
        """These timers cancelled (one not set is no error)."""
        if not len(self) or not len(kbs):
            return self
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self)}
        index = self._index
        rows = [i for i in map(index.get, zip(kbs, tags, strict=True)) if i is not None]
        return self.without(np.array(rows, np.int64)) if rows else self

    @staticmethod
    def concat(tables: Sequence[TimerTable]) -> TimerTable:
        """Tables of disjoint keys as one."""
        full = [t for t in tables if len(t)]
        if not full:
            return TimerTable()
        if len(full) == 1:
            return full[0]
        return TimerTable(
            *(np.concatenate([getattr(t, c) for t in full]) for c in ("kb", "tag", "ts", "d"))
        )

    # -- reading -------------------------------------------------------------------
    def due(self, lw: int, now: int) -> np.ndarray:
        """Rows of the timers due: low-watermark timers at or before ``lw``, wall timers at or before ``now``."""
        return np.flatnonzero(timers_due(self.ts, self.d, lw, now))

    def ordered(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` per key (by its bytes), each key's in firing order (``_contract.timer_order``:
        by timestamp, then domain, then tag)."""
        if len(rows) < 2:
            return rows
        kc, _ = pd.factorize(self.kb[rows], sort=True)
        tc, _ = pd.factorize(self.tag[rows], sort=True)
        return rows[timers_order(kc, self.ts[rows], self.d[rows], tc)]

    def next_timers(self) -> tuple[int | None, int | None]:
        """The earliest low-watermark timer and the earliest wall timer (``None``: none)."""
        lw = self.d == _LW
        nlw = int(self.ts[lw].min()) if lw.any() else None
        nwall = int(self.ts[~lw].min()) if not lw.all() else None
        return nlw, nwall

    def key_set(self) -> set[bytes]:
        return set(self.kb.tolist())

    def of_keys(self, kbs: Iterable[bytes]) -> np.ndarray:
        """Rows of the timers of keys ``kbs``."""
        want = set(kbs)
        if not len(self) or not want:
            return np.empty(0, np.int64)
        return np.flatnonzero(pd.Series(self.kb, dtype=object).isin(want).to_numpy())
