"""Bloom filter over record fingerprints: the fast path of exactly-once dedup (MillWheel §6.1.1).

A thin wrapper over `rbloom <https://github.com/KenanHanke/rbloom>`_ (Rust). Items are
*fingerprints*: a stable 64-bit xxHash (xxh3) of the record id (:func:`fingerprint`),
computed once per record and used for both the check and the insert, so filters saved in
one process load in another (Python's own ``hash`` of a ``str`` is salted per process).
A batch of ids is fingerprinted by :func:`fingerprints` in C-level passes. Envelopes
before version 3 built their filters over :func:`legacy_fingerprint` (xxh3-128); they
are checked with it until their filter is rebuilt.

>>> f = BloomFilter.create(capacity=100, fpr=0.01)
>>> f.add(fingerprint("r1")); fingerprint("r1") in f
True
>>> g = BloomFilter.load(f.to_bytes(), capacity=100)
>>> fingerprint("r1") in g
True
"""

from __future__ import annotations

from collections.abc import Iterable

import rbloom
import xxhash

_OFFSET = 1 << 127
_digest = xxhash.xxh3_64_intdigest
_digest128 = xxhash.xxh3_128_intdigest
_encode = str.encode


def fingerprint(record_id: str) -> int:
    """The record id's fingerprint: xxh3-64 (an unsigned 64-bit int fits rbloom's i128 items)."""
    return _digest(record_id.encode())


def fingerprints(record_ids: list[str]) -> list[int]:
    """:func:`fingerprint` of each id, without Python code per id."""
    return list(map(_digest, map(_encode, record_ids)))


def legacy_fingerprint(record_id: str) -> int:
    """The fingerprint of envelopes before version 3: xxh3-128 as a signed 128-bit int."""
    return _digest128(record_id.encode()) - _OFFSET


def legacy_fingerprints(record_ids: list[str]) -> list[int]:
    return list(map(_OFFSET.__rsub__, map(_digest128, map(_encode, record_ids))))


# rbloom calls hash_func on every item; items are already fingerprints, and the builtin
# ``int`` returns them unchanged at C speed (rbloom refuses to save a filter over the
# builtin ``hash``, its only faster option)
_hash_id = int


class BloomFilter:
    """A fixed-size Bloom filter of record fingerprints (see :func:`fingerprint`)."""

    __slots__ = ("_bloom", "capacity")

    def __init__(self, bloom: rbloom.Bloom, capacity: int) -> None:
        self._bloom = bloom
        self.capacity = capacity

    @classmethod
    def create(cls, capacity: int, fpr: float) -> BloomFilter:
        bloom = rbloom.Bloom(max(1, capacity), fpr, _hash_id)
        if bloom.size_in_bits == 0:  # rbloom sizes a 1-item, high-fpr filter at zero bits
            bloom = rbloom.Bloom(1, 0.5, _hash_id)
        return cls(bloom, capacity)

    @classmethod
    def load(cls, data: bytes, capacity: int) -> BloomFilter:
        return cls(rbloom.Bloom.load_bytes(data, _hash_id), capacity)

    def to_bytes(self) -> bytes:
        return self._bloom.save_bytes()

    def add(self, item: int) -> None:
        self._bloom.add(item)

    def update(self, items: Iterable[int]) -> None:
        self._bloom.update(items)

    def __contains__(self, item: int) -> bool:
        return item in self._bloom

    @property
    def size_in_bits(self) -> int:
        return self._bloom.size_in_bits
