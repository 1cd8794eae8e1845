"""Bloom filter over record ids: the fast path of exactly-once dedup (MillWheel §6.1.1).

A thin wrapper over `rbloom <https://github.com/KenanHanke/rbloom>`_ (Rust) with a
stable 128-bit xxHash, so filters saved in one process load in another (Python's own
``hash`` of a ``str`` is salted per process).

>>> f = BloomFilter.create(capacity=100, fpr=0.01)
>>> f.add("r1"); "r1" in f
True
>>> g = BloomFilter.load(f.to_bytes(), capacity=100)
>>> "r1" in g
True
"""

from __future__ import annotations

from collections.abc import Iterable

import rbloom
import xxhash

_OFFSET = 1 << 127
_digest = xxhash.xxh3_128_intdigest


def _hash_id(item: str) -> int:
    # rbloom wants a signed 128-bit int
    return _digest(item.encode()) - _OFFSET


class BloomFilter:
    """A fixed-size Bloom filter of record ids (``str``)."""

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

    def add(self, item: str) -> None:
        self._bloom.add(item)

    def update(self, items: Iterable[str]) -> None:
        self._bloom.update(items)

    def __contains__(self, item: str) -> bool:
        return item in self._bloom

    @property
    def size_in_bits(self) -> int:
        return self._bloom.size_in_bits
