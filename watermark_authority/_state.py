"""The authority's memory, and the one rule per journal record that changes it (MillWheel §7.2).

Live writes and the replay of a journal at start go through the same rules
(:meth:`AuthorityState._apply`), so an authority started on the journal of a dead one is
in the state the dead one reached. :class:`~watermark_authority.Authority` builds on this
class: it validates a request, journals its records, then applies them here.

Per computation: its key intervals (token, last value, pending work, owner), the retired
tokens of intervals split or merged away, the minimum over the intervals, the published
low watermark and the published percentile floors. Per injector: its expected processes,
each process's last value, and the same published values.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servicekit import describe
from watermark_authority._checks import check_name
from watermark_authority._errors import ConflictError, UnknownNameError
from watermark_authority._journal import (
    JOURNAL_FORMAT,
    ComputationAdded,
    FormatVersion,
    InjectorAdded,
    IntervalDropped,
    IntervalRetired,
    IntervalState,
    IntervalUnretired,
    PercentilePublished,
    ProcessDropped,
    ProcessReported,
    Record,
    TokenCounter,
    WatermarkPublished,
)
from watermark_authority._time import MIN_TIMESTAMP


@dataclass(slots=True)
class _Interval:
    token: int
    value: int = MIN_TIMESTAMP
    pending: int | None = None
    updated_ms: int | None = None  # wall time of the last report, None: never reported
    owner: str | None = None  # the process that acquired it, as it described itself


class _MinMap:
    """name -> value with an O(log n) minimum: a heap with lazy deletion."""

    __slots__ = ("heap", "values")

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.heap: list[tuple[int, str]] = []

    def set(self, name: str, value: int) -> None:
        if self.values.get(name) == value:
            return
        self.values[name] = value
        heapq.heappush(self.heap, (value, name))
        if len(self.heap) > 2 * len(self.values) + 64:
            self.heap = [(v, n) for n, v in self.values.items()]
            heapq.heapify(self.heap)

    def remove(self, name: str) -> None:
        self.values.pop(name, None)

    def min(self) -> tuple[int, str] | None:
        heap, values = self.heap, self.values
        while heap:
            value, name = heap[0]
            if values.get(name) == value:
                return value, name
            heapq.heappop(heap)
        return None


class _Computation:
    __slots__ = (
        "intervals",
        "mins",
        "name",
        "pct_floors",
        "published",
        "retired",
        "version",
        "_pct_cache",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.intervals: dict[str, _Interval] = {}
        self.retired: dict[
            str, int
        ] = {}  # interval -> last token, for zombies of split/merged intervals
        self.mins = _MinMap()
        self.published = MIN_TIMESTAMP
        self.pct_floors: dict[str, int] = {}
        self.version = 0
        self._pct_cache: dict[str, tuple[int, int]] = {}

    def raw(self) -> tuple[int, str | None]:
        m = self.mins.min()
        return (MIN_TIMESTAMP, None) if m is None else m


class _Injector:
    __slots__ = ("expected", "name", "pct_floors", "published", "updated", "values")

    def __init__(self, name: str) -> None:
        self.name = name
        self.expected: list[str] | None = None
        self.values: dict[str, int] = {}
        self.updated: dict[str, int | None] = {}
        self.published = MIN_TIMESTAMP
        self.pct_floors: dict[str, int] = {}

    def members(self) -> list[str]:
        return list(self.expected) if self.expected is not None else sorted(self.values)

    def raw(self) -> tuple[int, str | None]:
        best: tuple[int, str | None] = (MIN_TIMESTAMP, None)
        for i, proc in enumerate(self.members()):
            value = self.values.get(proc, MIN_TIMESTAMP)
            if i == 0 or value < best[0]:
                best = (value, proc)
        return best


class AuthorityState:
    """Computations, injectors and the token counter, changed only by :meth:`_apply`.

    Lookups that raise the service's errors (:meth:`_computation`, :meth:`_node`) live
    here too, with the messages that name what is known.
    """

    def __init__(self) -> None:
        self._next_token = 1
        self._computations: dict[str, _Computation] = {}
        self._injectors: dict[str, _Injector] = {}
        self._snapshot: dict[str, int] = {}  # the published values: replaced, never mutated
        self._format = 1  # a journal without a FormatVersion record is format 1
        # one rule per record type: how it changes memory, and which name it touches
        self._appliers: dict[type[Record], Callable[[Any], str | None]] = {
            IntervalState: self._apply_interval,
            WatermarkPublished: self._apply_published,
            TokenCounter: self._apply_token_counter,
            ProcessReported: self._apply_process,
            ComputationAdded: self._apply_computation,
            InjectorAdded: self._apply_injector,
            IntervalDropped: self._apply_interval_dropped,
            IntervalRetired: self._apply_retired,
            IntervalUnretired: self._apply_unretired,
            ProcessDropped: self._apply_process_dropped,
            PercentilePublished: self._apply_percentile,
            FormatVersion: self._apply_format,
        }

    def _apply(self, record: Record) -> str | None:
        """Apply one journaled record to memory (live and when loading); returns the name it touched."""
        apply = self._appliers.get(type(record))
        if apply is None:
            msg = f"no rule to apply journal record {record!r}"
            raise TypeError(msg)
        return apply(record)

    def _apply_interval(self, r: IntervalState) -> str:
        comp = self._computations.get(r.computation) or self._new_computation(r.computation)
        entry = comp.intervals.get(r.interval)
        if entry is None:
            comp.intervals[r.interval] = _Interval(
                r.token, r.value, r.pending, r.updated_ms, r.owner
            )
        else:
            entry.token, entry.value, entry.pending, entry.updated_ms, entry.owner = (
                r.token,
                r.value,
                r.pending,
                r.updated_ms,
                r.owner,
            )
        comp.mins.set(r.interval, r.value)
        comp.version += 1
        return r.computation

    def _apply_published(self, r: WatermarkPublished) -> str:
        node = self._computations.get(r.name) or self._injectors.get(r.name)
        if node is not None:
            node.published = max(node.published, r.value)
        return r.name

    def _apply_token_counter(self, r: TokenCounter) -> None:
        self._next_token = max(self._next_token, r.next_token)

    def _apply_process(self, r: ProcessReported) -> str:
        inj = self._injectors.get(r.injector) or self._new_injector(r.injector)
        inj.values[r.process] = r.value
        inj.updated[r.process] = r.updated_ms
        return r.injector

    def _apply_computation(self, r: ComputationAdded) -> str:
        if r.name not in self._computations:
            self._new_computation(r.name)
        return r.name

    def _apply_injector(self, r: InjectorAdded) -> str:
        inj = self._injectors.get(r.name) or self._new_injector(r.name)
        if r.expected is not None:
            inj.expected = list(r.expected)
        return r.name

    def _apply_interval_dropped(self, r: IntervalDropped) -> str:
        comp = self._computations[r.computation]
        comp.intervals.pop(r.interval, None)
        comp.mins.remove(r.interval)
        comp.version += 1
        return r.computation

    def _apply_retired(self, r: IntervalRetired) -> str:
        self._computations[r.computation].retired[r.interval] = r.token
        return r.computation

    def _apply_unretired(self, r: IntervalUnretired) -> str:
        self._computations[r.computation].retired.pop(r.interval, None)
        return r.computation

    def _apply_process_dropped(self, r: ProcessDropped) -> str:
        inj = self._injectors[r.injector]
        inj.values.pop(r.process, None)
        inj.updated.pop(r.process, None)
        return r.injector

    def _apply_percentile(self, r: PercentilePublished) -> None:
        node = self._computations.get(r.name) or self._injectors.get(r.name)
        if node is not None:
            node.pct_floors[r.pct] = max(node.pct_floors.get(r.pct, MIN_TIMESTAMP), r.value)

    def _apply_format(self, r: FormatVersion) -> None:
        if r.version > JOURNAL_FORMAT:
            msg = f"the journal is format {r.version}, newer than this millwheel reads ({JOURNAL_FORMAT}); upgrade millwheel"
            raise ValueError(msg)
        self._format = r.version

    def _new_computation(self, name: str) -> _Computation:
        comp = self._computations[name] = _Computation(name)
        return comp

    def _new_injector(self, name: str) -> _Injector:
        inj = self._injectors[name] = _Injector(name)
        return inj

    def _check_kind_free(self, name: str, kind: str) -> None:
        other = "injector" if kind == "computation" else "computation"
        if name in (self._injectors if kind == "computation" else self._computations):
            msg = f"{name!r} is already an {other}; computations and injectors share one namespace: use another name (e.g. prefix it with its kind)"
            raise ConflictError(msg)

    def _node(self, name: str) -> _Computation | _Injector:
        check_name("name", name)
        node = self._computations.get(name) or self._injectors.get(name)
        if node is None:
            raise UnknownNameError(self._unknown(name, "computation or injector"))
        return node

    def _computation(self, name: str) -> _Computation:
        check_name("computation", name)
        comp = self._computations.get(name)
        if comp is None:
            raise UnknownNameError(self._unknown(name, "computation"))
        return comp

    def _unknown(self, name: str, what: str) -> str:
        known = sorted(self._snapshot)  # every name, and safe to read on any thread
        hint = (
            f"known: {', '.join(known[:10])}{', ...' if len(known) > 10 else ''}"
            if known
            else "nothing is known yet"
        )
        extra = (
            "; acquire an interval of it (or report an injector) first"
            if what != "injector"
            else ""
        )
        return f"no {what} named {describe(name, 60)} ({hint}){extra}"

    def _unknown_interval(self, comp: _Computation, interval: str) -> str:
        if interval in comp.retired:
            return f"computation {comp.name!r}: interval {interval!r} was split or merged away; use the intervals that replaced it"
        return f"computation {comp.name!r} has no interval {describe(interval, 60)} ({len(comp.intervals)} intervals); acquire it first"

    def _stale(self, comp: _Computation, interval: str, token: int | None) -> str | None:
        entry = comp.intervals.get(interval)
        if entry is not None and entry.token == token:
            return None
        if entry is None and interval not in comp.retired:
            raise UnknownNameError(self._unknown_interval(comp, interval))
        current = (
            f"current {entry.token}"
            if entry is not None
            else "the interval was split or merged away"
        )
        return (
            f"computation {comp.name!r}: stale sequencer token for interval {interval!r} "
            f"(sent {token}, {current}); this worker no longer owns the interval: stop writing for it, or acquire it again"
        )
