"""An index of per-key integers (holds, next timers) for the harness: see :class:`MinIndex`."""

from __future__ import annotations

import heapq
import itertools
from typing import Any


class MinIndex:
    """Per-key integers with their smallest value and the keys at or below a bound in
    O(log n) and O(answer), not O(keys): a heap with lazy deletion beside a dict.

    The harness keeps one for the keys' holds and one per timer domain, so a round of a
    computation with many idle keys costs what is due, as on the Spark runtime.

    >>> ix = MinIndex()
    >>> ix.put("a", 5); ix.put("b", 3); ix.put("b", 9); ix.put("c", 4)
    >>> ix.min(), sorted(ix.at_most(5)), ix.get("b")
    (4, ['a', 'c'], 9)
    >>> ix.put("c", None); ix.min()
    5
    """

    __slots__ = ("_heap", "_tie", "values")

    def __init__(self) -> None:
        self.values: dict[Any, int] = {}
        self._heap: list[tuple[int, int, Any]] = []
        self._tie = itertools.count()  # keys need not be comparable with each other

    def get(self, key: Any) -> int | None:
        return self.values.get(key)

    def put(self, key: Any, value: int | None) -> None:
        if value is None:
            self.values.pop(key, None)
            return
        if self.values.get(key) == value:
            return
        self.values[key] = value
        heapq.heappush(self._heap, (value, next(self._tie), key))
        if len(self._heap) > 2 * len(self.values) + 64:  # mostly stale: rebuild
            self._heap = [(v, next(self._tie), k) for k, v in self.values.items()]
            heapq.heapify(self._heap)

    def min(self) -> int | None:
        heap, values = self._heap, self.values
        while heap:
            value, _, key = heap[0]
            if values.get(key) == value:
                return value
            heapq.heappop(heap)
        return None

    def at_most(self, bound: int) -> set[Any]:
        """The keys whose value is <= ``bound``."""
        heap, values, out = self._heap, self.values, set()
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            value, _, key = heap[i]
            if value > bound:
                continue  # the heap property: nothing below it is smaller
            if values.get(key) == value:
                out.add(key)
            stack += [j for j in (2 * i + 1, 2 * i + 2) if j < len(heap)]
        return out
