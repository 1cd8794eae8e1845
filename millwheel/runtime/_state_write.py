"""Per-key state of a computation, turned into what its plan installs (docs/runtime.md, "Bootstrapping state").

The one place that takes ``(key, state, timers)`` of computation ``C`` to the bytes its
Spark plan keeps, through ``C``'s own codec, for every plan the house keeps:

* a **per-record** computation (interval rows or key rows, ``plans/intervals.py``,
  ``plans/keys.py``): one envelope per key (:func:`~millwheel._initial_state.envelope_bytes`),
  in the key interval its key hashes to;
* a **columnar** computation (interval rows or the Arrow mapping, ``plans/columnar.py``,
  ``plans/arrow.py``): one :class:`~millwheel._colstore.ColumnarStore` per key interval
  (:func:`~millwheel._initial_state.columnar_store`, split by
  :func:`~millwheel.runtime._keying.interval_of`).

Both become :attr:`~millwheel.runtime._wire.RowKind.INSTALL` rows of a heartbeat file
(:data:`HB_MOVE_SCHEMA`, as a rescale's, ``_rescale.py``): a key's
envelope, or an interval's store (key ``None``), each to the Spark group of its interval.
The computation's next micro-batch installs them before any record, atomically with
Spark's commit (``_move.py``; on the Arrow mapping, into the store file of its manifest).

API (``_state_load.py`` bootstraps with it; an offline rewrite builds its new version with it)::

    installs = install_rows(spec, source, intervals, groups)  # InitialState -> Installs
    envelope_rows(seeds, intervals, groups, codec, name)       # Seeds -> Installs (per-record)
    store_rows(store, intervals, groups)                       # a ColumnarStore -> Installs
    envelope_bytes(codec, Seed(key, state, timers), base=old_envelope)
    columnar_store(ColumnarSeeds(rows, timers), options)

``Installs.digest`` names the contents (xxh3-128 over the rows in order of group and key):
the same source written twice has the same digest, whatever order it was read in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import xxhash

from millwheel._initial_state import (
    ColumnarSeeds,
    InitialState,
    Seed,
    columnar_store,
    envelope_bytes,
    normalize_timers,
)
from millwheel._record import encode_key
from millwheel._topology import ComputationSpec
from millwheel.runtime._keying import interval_of
from millwheel.runtime._wire import RowKind

__all__ = [
    "HB_MOVE_SCHEMA",
    "ColumnarSeeds",
    "Installs",
    "Seed",
    "columnar_store",
    "envelope_bytes",
    "envelope_rows",
    "install_rows",
    "normalize_timers",
    "store_rows",
]

_INSTALL = int(RowKind.INSTALL)
#: the columns of a state move's heartbeat file, as ``_query.HB_MOVE_SCHEMA`` (which this
#: module cannot import: the query imports the bootstrap, ``_state_load.py``, which imports
#: this; ``tests/runtime/test_state_load.py`` checks the two are one)
HB_MOVE_SCHEMA = pa.schema(
    [
        ("interval", pa.int32()),
        ("wm", pa.int64()),
        ("now", pa.int64()),
        ("kind", pa.int32()),
        ("group", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)


@dataclass(frozen=True)
class Installs:
    """The rows that install a computation's state: a heartbeat file's table, how many keys
    they hold, and the digest of their contents."""

    table: pa.Table
    keys: int
    digest: str


def _installs(rows: list[tuple[int, int, bytes | None, bytes]], keys: int) -> Installs:
    """``(interval, group, key or None, value)`` rows as :data:`HB_MOVE_SCHEMA`, sorted by
    group and key (one order whatever the source's), and their digest."""
    rows.sort(key=lambda r: (r[1], r[2] or b""))
    h = xxhash.xxh3_128()
    for interval, group, kb, value in rows:
        h.update(interval.to_bytes(4, "big", signed=True))
        h.update(group.to_bytes(4, "big", signed=True))
        k = kb or b""
        h.update(len(k).to_bytes(4, "big"))
        h.update(k)
        h.update(len(value).to_bytes(8, "big"))
        h.update(value)
    n = len(rows)
    table = pa.table(
        {
            "interval": pa.array([r[0] for r in rows], pa.int32()),
            "wm": pa.nulls(n, pa.int64()),
            "now": pa.nulls(n, pa.int64()),
            "kind": pa.array([_INSTALL] * n, pa.int32()),
            "group": pa.array([r[1] for r in rows], pa.int32()),
            "key": pa.array([r[2] for r in rows], pa.binary()),
            "value": pa.array([r[3] for r in rows], pa.binary()),
        },
        schema=HB_MOVE_SCHEMA,
    )
    return Installs(table, keys, h.hexdigest())


def envelope_rows(
    seeds: Iterable[Seed], intervals: int, groups: Sequence[int], codec: Any, name: str = "?"
) -> Installs:
    """One :attr:`RowKind.INSTALL` row per key of a per-record computation: its envelope
    (``codec``: the computation's ``state_codec``), to the group of its key interval. A key
    that keeps nothing (no state, no timers) gets no row."""
    rows: list[tuple[int, int, bytes | None, bytes]] = []
    for seed in seeds:
        env = envelope_bytes(codec, seed, computation=name)
        if env is None:
            continue
        kb = encode_key(seed.key)
        i = interval_of(kb, intervals)
        rows.append((i, int(groups[i]), kb, env))
    return _installs(rows, len(rows))


def store_rows(store: Any, intervals: int, groups: Sequence[int]) -> Installs:
    """A columnar computation's state (one :class:`~millwheel._colstore.ColumnarStore` of all
    its keys) split by key interval: one :attr:`RowKind.INSTALL` row per interval that gets
    a key (key ``None``, the piece's blob), to the interval's group."""
    keys = len(store.keys_held())
    rows: list[tuple[int, int, bytes | None, bytes]] = []
    for i, piece in sorted(store.split(lambda kb: interval_of(kb, intervals)).items()):
        blob = piece.encode()
        if blob is not None:
            rows.append((i, int(groups[i]), None, blob))
    return _installs(rows, keys)


def install_rows(
    spec: ComputationSpec, source: InitialState, intervals: int, groups: Sequence[int]
) -> Installs:
    """The rows that install ``source`` (read now) as computation ``spec``'s state in a layout
    of ``intervals`` key intervals whose Spark groups are ``groups``."""
    if len(groups) != intervals:
        msg = f"{intervals} key intervals need {intervals} groups, got {list(groups)}"
        raise ValueError(msg)
    if source.columnar:
        return store_rows(columnar_store(source.columnar_seeds(), spec.options), intervals, groups)
    return envelope_rows(source.seeds(), intervals, groups, spec.options.state_codec, spec.name)
