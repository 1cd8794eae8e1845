"""Fingerprints and Bloom geometry of the columnar dedup index (``_coldedup.py``, MillWheel §6.1.1).

A ``(key, id)`` pair's fingerprint is a 64-bit hash of the id's bytes xor one of the key's
(:func:`fingerprints`): two keys never share a decision, so dedup stays per key. The hash
(:func:`hash_bytes`) runs in whole-array numpy passes over the Arrow string buffer, no
Python call per id. A fingerprint sets and tests ``k`` bits of an ``m``-bit filter
(:func:`bloom_positions`, :func:`bloom_size`).

>>> int(hash_bytes(["a"])[0]) == int(hash_bytes(["a"])[0]) != int(hash_bytes(["b"])[0])
True
>>> bloom_size(1_000, 0.01)
(9600, 7)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from millwheel._colinput import factorize

_MASK32 = np.uint64(0xFFFFFFFF)
#: the mixing constants of :func:`hash_bytes` (splitmix64 / murmur3's finaliser)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_FMIX1, _FMIX2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_S29, _S33 = np.uint64(29), np.uint64(33)
#: seeds: an id and a key with the same bytes hash differently
ID_SEED, KEY_SEED = np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344)
#: the low ``r`` bytes of a little-endian word, ``r`` = 0..8
_TAIL = np.array([(1 << (8 * r)) - 1 for r in range(8)] + [2**64 - 1], np.uint64)
#: the fingerprint function of the stored filters: 2 = :func:`hash_bytes`; 1 (stores
#: written before it) = xxh3-64 of the id xor that of the key, whose filters are rebuilt
#: when they are read (:meth:`ColumnarDedup.from_wire`)
FINGERPRINTS = 2


def hash_bytes(
    arr: pa.Array | pa.ChunkedArray | Sequence[Any], seed: np.uint64 = ID_SEED
) -> np.ndarray:
    """A 64-bit hash of each string or bytes value, in whole-array numpy passes (no Python
    call per value): the values' bytes read 8 at a time from the Arrow buffer, each word
    mixed in (xor, multiply, shift), the length first and murmur3's finaliser last. A
    stable function of the bytes (stored filters depend on it), not a cryptographic one:
    the exact ids decide every "maybe" (module docstring)."""
    if not isinstance(arr, (pa.Array, pa.ChunkedArray)):
        arr = pa.array(
            list(arr), pa.binary() if len(arr) and isinstance(arr[0], bytes) else pa.string()
        )
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if n == 0:
        return np.empty(0, np.uint64)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    width = 8 if large else 4
    bufs = arr.buffers()
    offsets = np.frombuffer(
        bufs[1], np.int64 if large else np.int32, n + 1, arr.offset * width
    ).astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.zeros(
        hi - lo + 8, np.uint8
    )  # 8 bytes of padding: a word read at a value's end stays inside
    if hi > lo:
        data[: hi - lo] = np.frombuffer(bufs[2], np.uint8, hi - lo, lo)
    words = np.ndarray(
        (hi - lo + 1,), "<u8", data, 0, (1,)
    )  # the 8 bytes at every byte offset (unaligned reads)
    starts = offsets[:-1] - lo
    lens = offsets[1:] - offsets[:-1]
    h = (lens.astype(np.uint64) * _GOLDEN) ^ seed
    rows = np.flatnonzero(lens > 0)
    j = 0
    while len(rows):
        rem = lens[rows] - j
        w = (
            words[starts[rows] + j] & _TAIL[np.minimum(rem, 8)]
        )  # bytes past the value's end count as zeros
        x = (h[rows] ^ w) * _GOLDEN
        h[rows] = x ^ (x >> _S29)
        j += 8
        rows = rows[rem > 8]
    h ^= h >> _S33
    h *= _FMIX1
    h ^= h >> _S33
    h *= _FMIX2
    h ^= h >> _S33
    return h


def as_ids(ids: Sequence[str] | pa.Array) -> pa.Array:
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if isinstance(ids, pa.Array):
        return ids.cast(pa.string()) if ids.type != pa.string() else ids
    return pa.array(list(ids), pa.string())


def fingerprints(
    ids: Sequence[str] | pa.Array,
    kbs: Sequence[bytes] | None,
    codes: np.ndarray | None = None,
    uniques: Sequence[bytes] | None = None,
) -> np.ndarray:
    """uint64 fingerprints of ``(id, encoded key)`` pairs: :func:`hash_bytes` of the id xor
    that of the key (``codes``/``uniques``: the keys already factorized, ``kbs[i] == uniques[codes[i]]``)."""
    fp = hash_bytes(as_ids(ids))
    if codes is None or uniques is None:
        codes, uniques = factorize(kbs or [])
    return fp ^ hash_bytes(pa.array(list(uniques), pa.binary()), KEY_SEED)[codes]


def bloom_size(capacity: int, fpr: float) -> tuple[int, int]:
    """Bits and hash count of a Bloom filter for ``capacity`` items at false-positive rate ``fpr``."""
    n = max(1, capacity)
    m = max(64, math.ceil(-n * math.log(fpr) / (math.log(2) ** 2)))
    m = (m + 63) // 64 * 64
    k = max(1, round(m / n * math.log(2)))
    return m, k


def bloom_positions(fps: np.ndarray, m: int, k: int) -> np.ndarray:
    """The ``(n, k)`` bit positions of fingerprints (Kirsch-Mitzenmacher double hashing)."""
    h1 = fps & _MASK32
    h2 = (fps >> np.uint64(32)) | np.uint64(1)
    steps = np.arange(k, dtype=np.uint64)
    # each 32-bit hash mapped onto [0, m) by a multiply and a shift (Lemire's "fastrange"), not a modulo
    return (((h1[:, None] + steps[None, :] * h2[:, None]) & _MASK32) * np.uint64(m)) >> np.uint64(
        32
    )
