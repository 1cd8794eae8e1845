"""The productions of one columnar run, as columns (``_columnar.py``'s runner): ids are
assigned at the end from the per-key production sequences (§6.1.2), once-production
flags (Photon §2) kept beside them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from millwheel._colstore import ColumnarStore
from millwheel._record import Key
from millwheel._step import production_id


class Outputs:
    """Productions of one run, as columns; ids assigned at the end from the per-key sequences."""

    __slots__ = ("streams", "kbs", "keys", "values", "encoded", "ts", "fixed_ids", "once_ids", "once_tentative")

    def __init__(self) -> None:
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

    def add(self, stream: str, kb: bytes, key: Key, value: Any, enc: bytes, ts: int, rid: str) -> None:
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
        self, stream: str, kbs: list[bytes], keys: list[Key], values: list[Any], enc: list[bytes], ts: np.ndarray,
        once: list[str | None] | None = None, tentative: list[bool] | None = None,
    ) -> None:  # fmt: skip
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

    def finish(self, runner: Any, st: ColumnarStore, lw: int, c: dict[str, int]) -> Produced:
        meta = st.meta
        seqs: dict[bytes, int] = {}
        ids: list[str] = []
        name = runner.name
        fixed = self.fixed_ids
        behind = 0
        for i, (kb, key) in enumerate(zip(self.kbs, self.keys, strict=True)):
            rid = fixed.get(i)
            if rid is not None:
                ids.append(rid)
                continue
            s = seqs.get(kb)
            if s is None:
                m = meta.get(kb)
                s = 0 if m is None else m[0]
            ids.append(production_id(name, key, s))
            seqs[kb] = s + 1
        for kb, s in seqs.items():
            m = meta.get(kb)
            meta[kb] = [s, None if m is None else m[1]]  # replaced, never changed in place: copies share the lists
        n = len(self.kbs) - len(fixed)
        c["productions"] = n
        if n:
            ts = np.asarray(self.ts, np.int64)
            if fixed:
                mask = np.ones(len(ts), np.bool_)
                mask[list(fixed)] = False
                ts = ts[mask]
            behind = int((ts < lw).sum())
        c["productions_behind_watermark"] = behind
        return Produced(self.streams, ids, self.ts, self.kbs, self.keys, self.values, self.encoded, self.once_ids, self.once_tentative)


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
