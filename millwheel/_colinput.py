"""One key interval's records of a micro-batch as columns: what ``ColumnarRunner.run`` reads.

Keys and streams arrive factorized (a code per record into the distinct keys / streams, in
order of first appearance), ids as an Arrow string array, values as a list or an Arrow
binary array: the Arrow mapping (``runtime/_arrowmap.py``) builds them from its Arrow
batch without a Python object per record for what the computation does not read; the
harness and the default mapping pass lists (:meth:`InputColumns.__init__`), factorized here.
A record's key, id, stream or value becomes a Python object only when something reads it
(the columns of :attr:`~millwheel._colbatch.Batch.records`, a late record sent on, a dead letter).

>>> r = InputColumns([b"a", b"b", b"a"], ["x", "y", "z"], np.array([1, 2, 3]), ["s"] * 3, [10, 20, 30], encoded=False)
>>> r.codes.tolist(), r.uniques, r.kbs, r.id(2), r.values_at([0, 2])
([0, 1, 0], [b'a', b'b'], [b'a', b'b', b'a'], 'z', [10, 30])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from millwheel._codec import encode_value
from millwheel._fields import decode_cell
from millwheel._record import Key, Record


def factorize(items: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, list[Any]]:
    """int64 codes of ``items`` into their distinct values, in order of first appearance."""
    if not len(items):
        return np.empty(0, np.int64), []
    arr = (
        items
        if isinstance(items, np.ndarray) and items.dtype == object
        else np.array([*items, None], dtype=object)[:-1]
    )  # 1-d even if every item has one length
    codes, uniques = pd.factorize(arr)
    return codes.astype(np.int64, copy=False), uniques.tolist()


class InputColumns:
    """One key interval's records of a batch, in delivery order; see the module docstring.

    ``codes``/``uniques``: the encoded keys (``kbs[i] == uniques[codes[i]]``);
    ``stream_codes``/``stream_names`` likewise; ``arrival``: the watermark each record
    arrived under where ``arrival_known`` (elsewhere: the batch's low watermark)."""

    __slots__ = (
        "codes",
        "uniques",
        "ids",
        "ts",
        "stream_codes",
        "stream_names",
        "values",
        "arrival",
        "arrival_known",
        "encoded",
    )

    def __init__(
        self,
        kbs: Sequence[bytes] | np.ndarray,
        ids: Sequence[str] | pa.Array,
        ts: np.ndarray,
        streams: Sequence[str] | np.ndarray,
        values: Sequence[Any] | np.ndarray | pa.Array,
        arrival: Sequence[int | None] | None = None,
        encoded: bool = True,
    ) -> None:
        self.codes, self.uniques = factorize(kbs)
        self.stream_codes, self.stream_names = factorize(streams)
        self.ids = ids if isinstance(ids, pa.Array) else pa.array(list(ids), pa.string())
        self.ts = np.asarray(ts, np.int64)
        self.values = values
        self.encoded = encoded
        self.arrival = self.arrival_known = None
        if arrival is not None:
            known = np.fromiter((a is not None for a in arrival), np.bool_, len(arrival))
            if known.any():
                self.arrival_known = known
                self.arrival = np.fromiter(
                    (0 if a is None else a for a in arrival), np.int64, len(arrival)
                )

    @classmethod
    def of(
        cls,
        codes: np.ndarray,
        uniques: list[bytes],
        ids: pa.Array,
        ts: np.ndarray,
        stream_codes: np.ndarray,
        stream_names: list[str],
        values: Sequence[Any] | pa.Array,
        arrival: np.ndarray | None = None,
        arrival_known: np.ndarray | None = None,
        encoded: bool = True,
    ) -> InputColumns:
        """Columns already factorized (the Arrow mapping)."""
        self = cls.__new__(cls)
        self.codes, self.uniques, self.ids, self.ts = codes, uniques, ids, ts
        self.stream_codes, self.stream_names, self.values, self.encoded = (
            stream_codes,
            stream_names,
            values,
            encoded,
        )
        self.arrival, self.arrival_known = (
            (arrival, arrival_known)
            if arrival_known is not None and arrival_known.any()
            else (None, None)
        )
        return self

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def kbs(self) -> list[bytes]:
        """The encoded key of every record."""
        u = self.uniques
        return [u[c] for c in self.codes.tolist()]

    def kb(self, i: int) -> bytes:
        return self.uniques[int(self.codes[i])]

    def id(self, i: int) -> str:
        return str(self.ids[i].as_py())

    def stream(self, i: int) -> str:
        return self.stream_names[int(self.stream_codes[i])]

    def _values(self) -> Any:
        """:attr:`values`; values left in their files (an object with ``load()``, the
        Spark scan's ``FileValues``) are read now, once."""
        vs = self.values
        load = getattr(vs, "load", None)
        if load is not None:
            vs = self.values = load()
        return vs

    def value(self, i: int) -> Any:
        v = self._values()[i]
        return v.as_py() if isinstance(v, pa.Scalar) else v

    def decoded(self, i: int) -> tuple[Any, bytes]:
        """Record ``i``'s value as user code reads it, and as it is stored (encoded)."""
        v = self.value(i)
        dec = decode_cell(v) if self.encoded else v
        return dec, v if type(v) is bytes else encode_value(dec)

    def record(self, i: int, key: Key) -> Record:
        """Record ``i`` as a :class:`~millwheel.Record` of ``key`` (one sent on or dead-lettered)."""
        return Record(key, self.decoded(i)[0], int(self.ts[i]), self.id(i), self.stream(i))

    def ids_at(self, il: list[int]) -> list[str]:
        return self.ids.take(pa.array(il, pa.int64())).to_pylist()

    def streams_at(self, il: list[int]) -> list[str]:
        names = self.stream_names
        codes = self.stream_codes
        return (
            [names[c] for c in codes[il].tolist()]
            if len(names) > 1
            else [names[0]] * len(il)
            if names
            else []
        )

    def values_at(self, il: list[int]) -> list[Any]:
        """The values of rows ``il`` as they came (encoded unless ``encoded`` is false)."""
        vs = self._values()
        if isinstance(vs, (pa.Array, pa.ChunkedArray)):
            return vs.take(pa.array(il, pa.int64())).to_pylist()
        return [vs[i] for i in il]

    def not_stream(self, name: str) -> np.ndarray:
        """Which records are not of stream ``name``."""
        if name not in self.stream_names:
            return np.ones(len(self), np.bool_)
        return self.stream_codes != self.stream_names.index(name)

    def arrival_watermarks(self, low_watermark: int) -> np.ndarray:
        """The watermark each record arrived under (``low_watermark`` where not known)."""
        if self.arrival is None or self.arrival_known is None:
            return np.full(len(self), low_watermark, np.int64)
        return np.where(self.arrival_known, self.arrival, low_watermark)
