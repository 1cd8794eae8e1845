"""The productions of one columnar run, as columns (``_colrunner.py``'s runner): ids are
assigned at the end from the per-key production sequences and lives (§6.1.2,
``_identity.py``), once-production flags (Photon §2) kept beside them.

A key's entry in the store's ``meta`` is ``[sequence, hold]`` or ``[sequence, hold, life]``:
a key's first production (its sequence at 0, no life) starts a life, the run's; a key of a
store from before lives that has produced keeps its numbering, without one.

:class:`ColumnarResult` is what a run returns: the productions as columns, the new store,
the dead letters and counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from millwheel._colinput import factorize
from millwheel._colstore import ColumnarStore
from millwheel._contract import key_life, production_ids
from millwheel._counters import StepMetrics
from millwheel._identity import call_life, id_prefix
from millwheel._record import Key, Production, Record


class Outputs:
    """Productions of one run, as columns; ids assigned at the end from the per-key sequences."""

    __slots__ = (
        "streams",
        "kbs",
        "keys",
        "values",
        "encoded",
        "ts",
        "fixed_ids",
        "once_ids",
        "once_tentative",
        "life",
        "forgotten",
        "behind",
        "ids",
    )

    def __init__(self, life: int | None = None) -> None:
        #: the life a key without a ``meta`` entry starts in this run (``None``: none known)
        self.life = life
        self.streams: list[str] = []
        self.kbs: list[bytes] = []
        self.keys: list[Key] = []
        self.values: list[Any] = []
        self.encoded: list[bytes] = []
        self.ts: list[int] = []
        #: position -> id, for outputs that keep their own id (late records to a stream)
        self.fixed_ids: dict[int, str] = {}
        #: once-productions (Photon §2): per production, once any is made
        self.once_ids: list[str | None] | None = None
        self.once_tentative: list[bool] | None = None
        #: keys forgotten in this run so far (a key that kept nothing between two of its runs
        #: of one arrival watermark, ``_colruns.py``), and how often: a life each (``call_life``)
        self.forgotten: dict[bytes, int] = {}
        #: productions behind the watermark of the call that made them, when the runner counts
        #: them per call (``None``: :meth:`finish` counts them against the run's low watermark)
        self.behind: int | None = None
        #: the ids of the productions numbered so far (:meth:`number`)
        self.ids: list[str] = []

    def add(
        self, stream: str, kb: bytes, key: Key, value: Any, enc: bytes, ts: int, rid: str
    ) -> None:
        self.fixed_ids[len(self.streams)] = rid
        if self.once_ids is not None:
            self.once_ids.append(None)
            self.once_tentative.append(False)  # type: ignore[union-attr]
        self.streams.append(stream)
        self.kbs.append(kb)
        self.keys.append(key)
        self.values.append(value)
        self.encoded.append(enc)
        self.ts.append(ts)

    def extend(
        self,
        stream: str,
        kbs: list[bytes],
        keys: list[Key],
        values: list[Any],
        enc: list[bytes],
        ts: np.ndarray,
        once: list[str | None] | None = None,
        tentative: list[bool] | None = None,
    ) -> None:
        if once is not None and self.once_ids is None:
            self.once_ids = [None] * len(self.streams)
            self.once_tentative = [False] * len(self.streams)
        if self.once_ids is not None:
            self.once_ids += once if once is not None else [None] * len(kbs)
            self.once_tentative += tentative if tentative is not None else [False] * len(kbs)  # type: ignore[operator]
        self.streams += [stream] * len(kbs)
        self.kbs += kbs
        self.keys += keys
        self.values += values
        self.encoded += enc
        self.ts += ts.tolist()

    def count_behind(self, mark: int, lw: int | np.ndarray) -> None:
        """Count the productions made since ``mark`` that are behind ``lw`` (one watermark, or
        one per production) in :attr:`behind`."""
        if len(self.ts) > mark:
            behind = int((np.asarray(self.ts[mark:], np.int64) < lw).sum())
            self.behind = behind + (self.behind or 0)

    def number(self, name: str, st: ColumnarStore) -> None:
        """Ids for the productions made since the last call, from each key's production
        sequence and life (in the order they were made); the sequences advanced in ``st``."""
        meta = st.meta
        fixed = self.fixed_ids
        start = len(self.ids)
        n = len(self.kbs) - start
        if not n:
            return
        codes, uniq = factorize(self.kbs[start:] if start else self.kbs)
        numbered = np.ones(n, np.bool_)
        mine = [i - start for i in fixed if i >= start]
        if mine:
            numbered[mine] = False
        nc = codes[numbered]
        # each production's place among its key's numbered ones: a stable sort by key
        o = np.argsort(nc, kind="stable")
        sc = nc[o]
        starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
        rank = np.empty(len(nc), np.int64)
        rank[o] = np.arange(len(nc)) - np.repeat(starts, np.diff(np.r_[starts, len(nc)]))
        metas = [meta.get(kb) for kb in uniq]
        first = np.fromiter((0 if m is None else m[0] for m in metas), np.int64, len(uniq))
        seq = (first[nc] + rank).tolist()
        # each key's life: its own, or this run's for a key whose first production this is
        gone = self.forgotten
        new = (
            [call_life(self.life, gone.get(kb, 0)) for kb in uniq]
            if gone
            else [self.life] * len(uniq)
        )
        lives = [
            nl if m is None else key_life(m[2] if len(m) > 2 else None, m[0], nl)
            for m, nl in zip(metas, new, strict=True)
        ]
        keys = self.keys
        key_of = dict(zip(codes.tolist(), keys[start:] if start else keys, strict=True))
        prefixes = [id_prefix(name, key_of[k], life) for k, life in enumerate(lives)]
        made = production_ids(prefixes, nc.tolist(), seq)
        if mine:
            ids: list[str] = [None] * n  # type: ignore[list-item]
            for i, rid in zip(np.flatnonzero(numbered).tolist(), made, strict=True):
                ids[i] = rid
            for i in mine:
                ids[i] = fixed[i + start]
        else:
            ids = made
        self.ids += ids
        counts = np.bincount(nc, minlength=len(uniq))
        for kb, m, life, f, k in zip(
            uniq, metas, lives, first.tolist(), counts.tolist(), strict=True
        ):
            if k:  # replaced, never changed in place: copies share the lists
                meta[kb] = [f + k, None if m is None else m[1]] + ([] if life is None else [life])

    def finish(self, runner: Any, st: ColumnarStore, lw: int, c: StepMetrics) -> Produced:
        """Ids for the productions not numbered yet (:meth:`number`), the counters set."""
        self.number(runner.name, st)
        fixed = self.fixed_ids
        n = len(self.kbs)
        behind = self.behind
        if behind is None:
            behind = 0
            if n > len(fixed):
                numbered = np.ones(n, np.bool_)
                if fixed:
                    numbered[list(fixed)] = False
                behind = int((np.asarray(self.ts, np.int64)[numbered] < lw).sum())
        c.productions = n - len(fixed)
        c.productions_behind_watermark = behind
        return Produced(
            self.streams,
            self.ids,
            self.ts,
            self.kbs,
            self.keys,
            self.values,
            self.encoded,
            self.once_ids,
            self.once_tentative,
        )


@dataclass(slots=True)
class Produced:
    streams: list[str]
    ids: list[str]
    ts: list[int]
    kbs: list[bytes]
    keys: list[Key]
    values: list[Any]
    encoded: list[bytes]
    once_ids: list[str | None] | None = None
    once_tentative: list[bool] | None = None


@dataclass(slots=True)
class ColumnarResult:
    """What one run over a key interval's batch returns."""

    store: bytes | None
    #: productions as columns, in the order user code made them
    streams: list[str]
    ids: list[str]
    ts: list[int]
    kbs: list[bytes]
    keys: list[Key]
    values: list[Any]
    encoded: list[bytes]
    dead_letters: list[Production]
    metrics: dict[str, int]
    hold: int | None
    next_low_watermark_timer: int | None
    next_wall_timer: int | None
    keys_kept: int
    #: per touched key (harness): (hold, next lw timer, next wall timer)
    key_summaries: dict[bytes, tuple[int | None, int | None, int | None]] | None = None
    #: per production: its ``once_id`` (Photon §2) or ``None``, and whether it is tentative (``None``: no once-productions)
    once_ids: list[str | None] | None = None
    once_tentative: list[bool] | None = None
    #: the store after the run, decoded (a caller that keeps it skips the next decode; with
    #: ``run(encode=False)`` the only form of it: ``store`` is then ``None``)
    decoded: ColumnarStore | None = None
    #: the oldest watermark a record was judged against, if older than the run's low
    #: watermark (``None``: none was): the keys' ids were collected against it
    judged: int | None = None

    def productions(self) -> list[Production]:
        n = len(self.ids)
        once = self.once_ids or [None] * n
        tent = self.once_tentative or [False] * n
        return [
            Production(s, Record(k, v, t, i, s), e, o, f)
            for s, k, v, t, i, e, o, f in zip(
                self.streams,
                self.keys,
                self.values,
                self.ts,
                self.ids,
                self.encoded,
                once,
                tent,
                strict=True,
            )
        ]

    def drop(self, ids: set[str]) -> None:
        """Drop the productions ``ids`` (once-productions another pipeline holds)."""
        keep = [i not in ids for i in self.ids]
        for name in (
            "streams",
            "ids",
            "ts",
            "kbs",
            "keys",
            "values",
            "encoded",
            "once_ids",
            "once_tentative",
        ):
            col = getattr(self, name)
            if col is not None:
                setattr(self, name, [x for x, k in zip(col, keep, strict=True) if k])
