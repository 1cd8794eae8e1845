"""The productions of one columnar run, as columns (``_colrunner.py``'s runner): ids are
assigned at the end from the per-key production sequences and lives (§6.1.2,
``_identity.py``), once-production flags (Photon §2) kept beside them.

A key's entry in the store's ``meta`` is ``[sequence, hold]`` or ``[sequence, hold, life]``:
a key's first production (its sequence at 0, no life) starts a life, the run's; a key of a
store from before lives that has produced keeps its numbering, without one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from millwheel._colinput import factorize
from millwheel._colstore import ColumnarStore
from millwheel._contract import key_life, production_ids
from millwheel._counters import StepMetrics
from millwheel._identity import id_prefix
from millwheel._record import Key


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

    def finish(self, runner: Any, st: ColumnarStore, lw: int, c: StepMetrics) -> Produced:
        """Ids from each key's production sequence and life (in the order the productions were
        made), the sequences advanced in ``st``, the counters set."""
        meta = st.meta
        name = runner.name
        fixed = self.fixed_ids
        n = len(self.kbs)
        ids: list[str] = []
        behind = 0
        if n:
            codes, uniq = factorize(self.kbs)
            numbered = np.ones(n, np.bool_)
            if fixed:
                numbered[list(fixed)] = False
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
            keys = self.keys
            numbered_at = np.flatnonzero(numbered).tolist()
            # each key's life: its own, or this run's for a key whose first production this is
            lives = [
                self.life if m is None else key_life(m[2] if len(m) > 2 else None, m[0], self.life)
                for m in metas
            ]
            key_of = dict(zip(codes.tolist(), keys, strict=True))
            prefixes = [id_prefix(name, key_of[k], life) for k, life in enumerate(lives)]
            made = production_ids(prefixes, nc.tolist(), seq)
            if fixed:
                ids = [None] * n  # type: ignore[list-item]
                for i, rid in zip(numbered_at, made, strict=True):
                    ids[i] = rid
                for i, rid in fixed.items():
                    ids[i] = rid
            else:
                ids = made
            counts = np.bincount(nc, minlength=len(uniq))
            for kb, m, life, f, k in zip(
                uniq, metas, lives, first.tolist(), counts.tolist(), strict=True
            ):
                if k:  # replaced, never changed in place: copies share the lists
                    meta[kb] = [f + k, None if m is None else m[1]] + (
                        [] if life is None else [life]
                    )
            if len(nc):
                behind = int((np.asarray(self.ts, np.int64)[numbered] < lw).sum())
        c.productions = n - len(fixed)
        c.productions_behind_watermark = behind
        return Produced(
            self.streams,
            ids,
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
