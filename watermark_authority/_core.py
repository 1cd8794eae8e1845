"""The authority's semantics, with no HTTP and no RocksDB in sight (MillWheel §5.2, §6.2, §7.2).

:class:`Authority` is what the service runs and what :class:`InProcessWatermarkClient`
wraps, so both behave identically. It keeps, per computation, an *interval map*: for each
key interval the current sequencer token and the last report (the oldest pending work).

Rules, and where they come from:

* **Sequencers** (§6.2, §7.1, §7.2). ``acquire`` hands out a token for an interval that is
  greater than every token handed out before, and thereby invalidates the previous owner's.
  A report must carry the current token, or it is refused with :class:`StaleTokenError`
  and changes nothing. Splitting or merging an interval retires its token too (§7.1).
* **Interval map** (§7.2). A computation's raw low watermark is the minimum over its
  intervals of the last value each reported. An interval that stops reporting keeps its
  last known value, so it holds the computation there; an interval acquired but never
  reported holds it at ``MIN_TIMESTAMP`` ("nothing known"). A new owner, a split or a merge
  keeps the last known value until the new owner reports.
* **Injectors** (§5.2). An injector's low watermark is the minimum over its processes; with
  an expected set declared, a process that has not reported holds it at ``MIN_TIMESTAMP``.
* **Monotonic and durable** (§7.2). A watermark is *published* when the authority first
  reveals it (a read, a broadcast, the dashboard); the published value is the maximum of
  every value computed so far and is journaled before it is revealed, so it never goes back:
  not after a late or out-of-order report, not after a restart.
* **Consumers take the minimum over their inputs** (§7.2): the authority publishes one value
  per computation and per injector, never a combination, so it is never ahead of a worker.
* **Percentile watermarks** (§7.2): see :meth:`Authority.percentile_watermark`.

Every mutation validates the whole request first, then journals, then changes memory: an
error (malformed, stale, unknown) changes nothing.

>>> from millwheel import MIN_TIMESTAMP
>>> a = Authority(clock=lambda: 0)
>>> t = a.acquire("counter", ["a-m", "n-z"])
>>> a.report("counter", [("a-m", t["a-m"], 1_000, None)])
>>> a.watermark("counter") == MIN_TIMESTAMP    # n-z has not reported: nothing is known
True
>>> a.report("counter", [("n-z", t["n-z"], 1_500, None)])
>>> a.watermark("counter")
1000
>>> zombie = t["a-m"]
>>> fresh = a.acquire("counter", ["a-m"])["a-m"]     # a new owner fences the old one
>>> a.report("counter", [("a-m", zombie, 5_000, None)])
Traceback (most recent call last):
...
watermark_authority._errors.StaleTokenError: computation 'counter': stale sequencer token for interval 'a-m' (sent 1, current 3); this worker no longer owns the interval: stop writing for it, or acquire it again
>>> a.report("counter", [("a-m", fresh, 900, None)])  # late: the published value stays
>>> a.watermark("counter")
1000
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from millwheel import MAX_TIMESTAMP, MIN_TIMESTAMP
from watermark_authority._errors import (
    ConflictError,
    InvalidRequestError,
    StaleTokenError,
    UnknownNameError,
)
from watermark_authority._journal import Journal, NullJournal, Op

#: one interval's report: ``(interval, token, oldest_work, pending)``; ``pending`` is the
#: amount of pending work (records, timers, productions) or ``None`` if not counted
Report = tuple[str, int, int, "int | None"]

MAX_NAME_LENGTH = 256


def wall_ms() -> int:
    """Wall time in integer milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def check_name(what: str, name: Any) -> str:
    """Return ``name`` if it is a usable computation, interval, injector or process name."""
    if not isinstance(name, str) or not name:
        msg = f"{what} must be a non-empty string, got {name!r}"
        raise InvalidRequestError(msg)
    if len(name) > MAX_NAME_LENGTH or not name.isprintable():
        msg = f"{what} {name[:40]!r}... must be at most {MAX_NAME_LENGTH} printable characters"
        raise InvalidRequestError(msg)
    return name


def check_timestamp(what: str, value: Any) -> int:
    """Return ``value`` if it is an int millisecond timestamp in [MIN_TIMESTAMP, MAX_TIMESTAMP]."""
    if type(value) is not int or not MIN_TIMESTAMP <= value <= MAX_TIMESTAMP:
        msg = (
            f"{what} must be an integer timestamp in milliseconds since the epoch, between "
            f"MIN_TIMESTAMP and MAX_TIMESTAMP (use MAX_TIMESTAMP for 'finished'), got {value!r}"
        )
        raise InvalidRequestError(msg)
    return value


def check_percentile(pct: Any) -> float:
    """Return ``pct`` as a float if it is a percentage in (0, 100]."""
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 < pct <= 100:
        msg = f"percentile must be a number in (0, 100], e.g. 99 for the 99% watermark, got {pct!r}"
        raise InvalidRequestError(msg)
    return float(pct)


def _pct_key(pct: float) -> str:
    return f"{pct:.3f}"


def weighted_percentile(values: Sequence[int], weights: Sequence[int], pct: float) -> int:
    """The ``pct`` percentile watermark of intervals with oldest work ``values`` (§7.2).

    Strip the oldest ``100 - pct`` percent of the pending work, then take the minimum of
    what is left. Precisely: sort the intervals by value; let ``C(k)`` be the total weight of
    the intervals before the ``k``-th; the result is the value of the last interval ``k``
    with ``C(k) <= (100 - pct)% of the total weight``. With ``pct = 100`` this is the
    minimum. An interval of weight 0 (no pending work) never holds the result back.

    >>> weighted_percentile(list(range(1, 101)), [1] * 100, 99)     # drop the oldest 1%
    2
    >>> weighted_percentile(list(range(1, 101)), [1] * 100, 50)
    51
    >>> weighted_percentile([10, 20], [1, 99], 99)                  # 1% of the work is at 10
    20
    >>> weighted_percentile([10, 20], [2, 98], 99)
    10
    """
    if len(values) == 0:
        return MIN_TIMESTAMP
    v = np.asarray(values, dtype=np.int64)
    w = np.asarray(weights, dtype=np.int64)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    before = np.concatenate(([0], np.cumsum(w)[:-1]))  # C(k)
    p_milli = round(pct * 1000)
    # C(k) <= total * (100 - pct) / 100, in exact integers (pct to 0.001)
    ok = before * 100_000 <= int(w.sum()) * (100_000 - p_milli)
    k = int(np.flatnonzero(ok)[-1])
    return int(v[k])


@dataclass(slots=True)
class _Interval:
    token: int
    value: int = MIN_TIMESTAMP
    pending: int | None = None
    updated_ms: int | None = None  # wall time of the last report, None: never reported


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
    __slots__ = ("intervals", "mins", "name", "pct_floors", "published", "retired", "version", "_pct_cache")

    def __init__(self, name: str) -> None:
        self.name = name
        self.intervals: dict[str, _Interval] = {}
        self.retired: dict[str, int] = {}  # interval -> last token, for zombies of split/merged intervals
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
        self.updated: dict[str, int] = {}
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


class Authority:
    """The central low-watermark authority's state and rules (§7.2); see the module docstring.

    ``journal`` receives every change before it is applied (default: a journal that keeps
    nothing); the state it holds is loaded first, so a new ``Authority`` on the journal of a
    dead one carries on where it stopped. ``clock`` returns wall time in milliseconds.

    Not thread-safe: the service calls it from one thread.
    """

    def __init__(self, journal: Journal | None = None, *, clock: Callable[[], int] | None = None) -> None:
        self._journal: Journal = journal if journal is not None else NullJournal()
        self._clock = clock or wall_ms
        self._next_token = 1
        self._computations: dict[str, _Computation] = {}
        self._injectors: dict[str, _Injector] = {}
        for op in self._journal.load():
            self._replay(op)

    # ---------------------------------------------------------------- sequencers

    def acquire(self, computation: str, intervals: Sequence[str]) -> dict[str, int]:
        """Become the owner of ``intervals`` of ``computation``: return a fresh token for each.

        The previous token of each interval is invalidated (§6.2: "new workers invalidate
        any extant sequencers before starting work"). An interval new to the computation
        joins its interval map at ``MIN_TIMESTAMP`` until its first report; a known one keeps
        its last reported value. Acquiring is how a computation declares its intervals:
        acquire all of them before reporting, or the watermark runs ahead of the missing ones.
        """
        check_name("computation", computation)
        names = self._check_interval_list(computation, intervals)
        comp = self._computations.get(computation)
        if comp is None:
            self._check_kind_free(computation, "computation")
        ops: list[Op] = []
        if comp is None:
            ops.append(("computation", computation))
        tokens: dict[str, int] = {}
        token = self._next_token
        for iv in names:
            old = comp.intervals.get(iv) if comp else None
            entry = _Interval(token) if old is None else _Interval(token, old.value, old.pending, old.updated_ms)
            ops.append(("interval", computation, iv, token, entry.value, entry.pending, entry.updated_ms))
            if comp is not None and iv in comp.retired:
                ops.append(("unretire", computation, iv))
            tokens[iv] = token
            token += 1
        ops.append(("next_token", token))
        self._commit(ops)
        return tokens

    def check_token(self, computation: str, interval: str, token: int) -> None:
        """Raise :class:`StaleTokenError` unless ``token`` is the interval's current sequencer.

        This is the fence for any write on behalf of an interval (stream logs, state): a
        writer checks its token here, or compares it with the highest token it has seen for
        the interval (tokens only grow).
        """
        comp = self._computation(computation)
        self._check_token_value(token)
        stale = self._stale(comp, interval, token)
        if stale is not None:
            raise StaleTokenError(stale, [(computation, interval)])

    def current_token(self, computation: str, interval: str) -> int:
        """The interval's current token (for operators and tests; workers keep their own)."""
        comp = self._computation(computation)
        entry = comp.intervals.get(interval)
        if entry is None:
            raise UnknownNameError(self._unknown_interval(comp, interval))
        return entry.token

    # ---------------------------------------------------------------- reports

    def report(self, computation: str, reports: Iterable[Report]) -> None:
        """Record the oldest pending work of some intervals; all or nothing.

        Each report is ``(interval, token, oldest_work, pending)``: ``oldest_work`` is the
        timestamp of the interval's oldest pending work (records, timers, checkpointed
        productions, §7.2), ``MAX_TIMESTAMP`` if it has none and never will; ``pending`` is
        how much work that is (the weight for percentile watermarks), or ``None``.
        The last report of an interval replaces the previous one (a lower value holds the
        computation back, the safe direction); the published watermark never goes back.

        Raises :class:`StaleTokenError` listing every interval whose token is not current,
        :class:`UnknownNameError` for intervals never acquired, :class:`InvalidRequestError`
        for malformed reports; in every case nothing changes.
        """
        comp = self._computation(computation)
        if not isinstance(reports, (list, tuple)):
            if isinstance(reports, (str, bytes, Mapping)) or not isinstance(reports, Iterable):
                msg = f"computation {computation!r}: reports must be a list of (interval, token, oldest_work, pending), got {reports!r}"
                raise InvalidRequestError(msg)
            reports = list(reports)
        now = self._clock()
        intervals = comp.intervals
        ops: list[Op] = []
        stale: list[str] = []
        unknown: list[str] = []
        for i, item in enumerate(reports):
            iv, token, oldest, pending = self._check_report(computation, i, item)
            entry = intervals.get(iv)
            if entry is None:
                if iv in comp.retired:
                    stale.append(iv)
                else:
                    unknown.append(iv)
            elif entry.token != token:
                stale.append(iv)
            else:
                ops.append(("interval", computation, iv, token, oldest, pending, now))
        if unknown:
            shown = ", ".join(repr(u) for u in unknown[:5])
            msg = (
                f"computation {computation!r}: no sequencer for interval(s) {shown}"
                f"{' and more' if len(unknown) > 5 else ''}; acquire an interval before reporting it"
            )
            raise UnknownNameError(msg)
        if stale:
            if len(stale) == 1:
                msg = self._stale(comp, stale[0], self._token_sent(reports, stale[0]))
            else:
                shown = ", ".join(repr(s) for s in stale[:5])
                msg = (
                    f"computation {computation!r}: stale sequencer tokens for {len(stale)} intervals "
                    f"({shown}{', ...' if len(stale) > 5 else ''}); this worker no longer owns them: "
                    "stop writing for them, or acquire them again. Nothing in this batch was applied"
                )
            raise StaleTokenError(msg or "stale token", [(computation, s) for s in stale])
        if ops:
            self._commit(ops)

    # ---------------------------------------------------------------- ownership moves

    def split(self, computation: str, interval: str, into: Sequence[str]) -> dict[str, int]:
        """Split ``interval`` into the intervals ``into`` (§7.1); return their fresh tokens.

        The old interval's token is retired, so its owner's later reports are stale. Each new
        interval starts at the old one's last known value (the work was there), so the
        watermark is held exactly as before until the new owners report. ``pending`` is
        shared out among them. ``into`` may reuse the old name.
        """
        comp = self._computation(computation)
        names = self._check_interval_list(computation, into, what="split into")
        old = comp.intervals.get(interval)
        if old is None:
            raise UnknownNameError(self._unknown_interval(comp, interval))
        taken = [n for n in names if n in comp.intervals and n != interval]
        if taken:
            msg = f"computation {computation!r}: cannot split {interval!r} into {taken!r}: already intervals of it; merge them instead, or pick new names"
            raise ConflictError(msg)
        ops: list[Op] = [("drop_interval", computation, interval), ("retired", computation, interval, old.token)]
        tokens: dict[str, int] = {}
        token = self._next_token
        for i, iv in enumerate(names):
            pending = None if old.pending is None else old.pending // len(names) + (1 if i < old.pending % len(names) else 0)
            ops.append(("interval", computation, iv, token, old.value, pending, old.updated_ms))
            if iv in comp.retired or iv == interval:
                ops.append(("unretire", computation, iv))
            tokens[iv] = token
            token += 1
        ops.append(("next_token", token))
        self._commit(ops)
        return tokens

    def merge(self, computation: str, intervals: Sequence[str], into: str) -> int:
        """Merge ``intervals`` into one interval ``into`` (§7.1); return its fresh token.

        The old tokens are retired. The merged interval starts at the minimum of their last
        known values, with their pending work summed (an uncounted interval counts as 1).
        """
        comp = self._computation(computation)
        names = self._check_interval_list(computation, intervals, what="merge")
        check_name("merge into", into)
        missing = [n for n in names if n not in comp.intervals]
        if missing:
            raise UnknownNameError(self._unknown_interval(comp, missing[0]))
        if into in comp.intervals and into not in names:
            msg = f"computation {computation!r}: cannot merge into {into!r}: it is another interval of it; include it in the merge or pick a new name"
            raise ConflictError(msg)
        olds = [comp.intervals[n] for n in names]
        value = min(o.value for o in olds)
        pending = None if all(o.pending is None for o in olds) else sum(1 if o.pending is None else o.pending for o in olds)
        updated = [o.updated_ms for o in olds if o.updated_ms is not None]
        ops: list[Op] = []
        for n, o in zip(names, olds, strict=True):
            ops += [("drop_interval", computation, n), ("retired", computation, n, o.token)]
        token = self._next_token
        ops.append(("interval", computation, into, token, value, pending, min(updated) if updated else None))
        if into in comp.retired or into in names:
            ops.append(("unretire", computation, into))
        ops.append(("next_token", token + 1))
        self._commit(ops)
        return token

    # ---------------------------------------------------------------- injectors

    def expect_injector_processes(self, injector: str, processes: Sequence[str]) -> None:
        """Declare the processes of ``injector`` (§5.2); their minimum is its low watermark.

        A declared process that has not reported holds the injector at ``MIN_TIMESTAMP``; one
        that stops reporting holds it at its last value: this is what makes the injector low
        watermark robust to process failures. Processes left out are forgotten.
        Without a declaration the set is whoever has reported.
        """
        check_name("injector", injector)
        procs = _name_list(f"injector {injector!r}", "processes", "process", processes)
        inj = self._injectors.get(injector)
        ops: list[Op] = []
        if inj is None:
            self._check_kind_free(injector, "injector")
        else:
            ops += [("drop_process", injector, p) for p in inj.values if p not in procs]
        ops.insert(0, ("injector", injector, procs))
        self._commit(ops)

    def report_injector(self, injector: str, process: str, low_watermark: int) -> None:
        """Record one injector process's low watermark (§5.2), e.g. the minimum creation time
        of its unfinished input files; ``MAX_TIMESTAMP`` when it has finished."""
        check_name("injector", injector)
        check_name(f"injector {injector!r} process", process)
        check_timestamp(f"injector {injector!r} process {process!r} low_watermark", low_watermark)
        inj = self._injectors.get(injector)
        ops: list[Op] = []
        if inj is None:
            self._check_kind_free(injector, "injector")
            ops.append(("injector", injector, None))
        elif inj.expected is not None and process not in inj.expected:
            msg = (
                f"injector {injector!r}: process {process!r} is not in its expected set "
                f"{inj.expected!r}; add it with expect_injector_processes first"
            )
            raise UnknownNameError(msg)
        ops.append(("process", injector, process, low_watermark, self._clock()))
        self._commit(ops)

    # ---------------------------------------------------------------- broadcast

    def watermark(self, name: str) -> int:
        """Publish and return the low watermark of computation or injector ``name``."""
        node = self._node(name)
        raw, _ = node.raw()
        if raw > node.published:
            self._commit([("published", name, raw)])
        return node.published

    def watermarks(self) -> dict[str, int]:
        """Publish and return every low watermark, computations and injectors, by name."""
        ops: list[Op] = []
        out: dict[str, int] = {}
        for name, node in (*self._computations.items(), *self._injectors.items()):
            raw, _ = node.raw()
            if raw > node.published:
                ops.append(("published", name, raw))
                out[name] = raw
            else:
                out[name] = node.published
        if ops:
            self._commit(ops)
        return out

    def percentile_watermark(self, name: str, pct: float) -> int:
        """Publish and return the ``pct`` percent watermark of ``name`` (§7.2).

        "The progress of ``pct`` percent of the pending work": the oldest ``100 - pct``
        percent of the work is stripped away as stragglers, and the minimum of the rest is
        taken (see :func:`weighted_percentile`). For a computation the work is weighted by
        each interval's reported ``pending``, or 1 per interval where it was not reported;
        for an injector, 1 per process. The value is never below the low watermark
        (``pct = 100`` gives the low watermark) and, per ``pct``, never goes back.
        """
        pct = check_percentile(pct)
        node = self._node(name)
        low = self.watermark(name)
        key = _pct_key(pct)
        if isinstance(node, _Computation):
            cached = node._pct_cache.get(key)
            if cached is not None and cached[0] == node.version:
                raw = cached[1]
            else:
                entries = list(node.intervals.values())
                raw = weighted_percentile(
                    [e.value for e in entries], [1 if e.pending is None else e.pending for e in entries], pct
                )
                node._pct_cache[key] = (node.version, raw)
        else:
            members = node.members()
            raw = weighted_percentile([node.values.get(p, MIN_TIMESTAMP) for p in members], [1] * len(members), pct)
        value = max(raw, low, node.pct_floors.get(key, MIN_TIMESTAMP))
        if value > node.pct_floors.get(key, MIN_TIMESTAMP):
            self._commit([("pct", name, key, value)])
        return value

    def names(self) -> dict[str, str]:
        """Every known name and its kind, ``"computation"`` or ``"injector"``."""
        out = {n: "computation" for n in self._computations}
        out.update({n: "injector" for n in self._injectors})
        return out

    def status(self, percentiles: Sequence[float] = (99.0,)) -> dict[str, Any]:
        """Everything the dashboard shows; publishes every watermark it reports.

        Per name: the published low watermark, what holds it back (the interval or process
        with the oldest value, and whether it has ever reported), the percentile watermarks,
        and for injectors every process's last value.
        """
        now = self._clock()
        low = self.watermarks()
        out: dict[str, Any] = {"now": now, "computations": {}, "injectors": {}}
        for name, comp in self._computations.items():
            raw, holder = comp.raw()
            entry = comp.intervals.get(holder) if holder is not None else None
            out["computations"][name] = {
                "low_watermark": low[name],
                "raw": raw,
                "intervals": len(comp.intervals),
                "holding": None
                if entry is None
                else {"interval": holder, "value": entry.value, "pending": entry.pending, "updated_ms": entry.updated_ms, "token": entry.token},
                "percentiles": {_pct_key(p): self.percentile_watermark(name, p) for p in percentiles},
            }
        for name, inj in self._injectors.items():
            raw, holder = inj.raw()
            out["injectors"][name] = {
                "low_watermark": low[name],
                "raw": raw,
                "expected": inj.expected,
                "processes": {
                    p: {"value": inj.values.get(p, MIN_TIMESTAMP), "updated_ms": inj.updated.get(p), "reported": p in inj.values}
                    for p in inj.members()
                },
                "holding": None
                if holder is None
                else {"process": holder, "value": inj.values.get(holder, MIN_TIMESTAMP), "reported": holder in inj.values},
                "percentiles": {_pct_key(p): self.percentile_watermark(name, p) for p in percentiles},
            }
        return out

    def intervals(self, computation: str) -> dict[str, dict[str, Any]]:
        """The interval map of ``computation``: token, last value, pending, last report time."""
        comp = self._computation(computation)
        return {
            iv: {"token": e.token, "value": e.value, "pending": e.pending, "updated_ms": e.updated_ms}
            for iv, e in comp.intervals.items()
        }

    def close(self) -> None:
        self._journal.close()

    # ---------------------------------------------------------------- internals

    def _commit(self, ops: list[Op]) -> None:
        self._journal.commit(ops)  # durable first; if this raises, memory is unchanged
        for op in ops:
            self._replay(op)

    def _replay(self, op: Op) -> None:
        """Apply one journaled op to memory (used both live and when loading)."""
        kind = op[0]
        if kind == "interval":
            _, comp_name, iv, token, value, pending, updated = op
            comp = self._computations.get(comp_name) or self._new_computation(comp_name)
            entry = comp.intervals.get(iv)
            if entry is None:
                comp.intervals[iv] = _Interval(token, value, pending, updated)
            else:
                entry.token, entry.value, entry.pending, entry.updated_ms = token, value, pending, updated
            comp.mins.set(iv, value)
            comp.version += 1
        elif kind == "published":
            node = self._computations.get(op[1]) or self._injectors.get(op[1])
            if node is not None:
                node.published = max(node.published, op[2])
        elif kind == "next_token":
            self._next_token = max(self._next_token, op[1])
        elif kind == "process":
            _, inj_name, proc, value, updated = op
            inj = self._injectors.get(inj_name) or self._new_injector(inj_name)
            inj.values[proc] = value
            inj.updated[proc] = updated
        elif kind == "computation":
            if op[1] not in self._computations:
                self._new_computation(op[1])
        elif kind == "injector":
            inj = self._injectors.get(op[1]) or self._new_injector(op[1])
            if op[2] is not None:
                inj.expected = list(op[2])
        elif kind == "drop_interval":
            comp = self._computations[op[1]]
            comp.intervals.pop(op[2], None)
            comp.mins.remove(op[2])
            comp.version += 1
        elif kind == "retired":
            self._computations[op[1]].retired[op[2]] = op[3]
        elif kind == "unretire":
            self._computations[op[1]].retired.pop(op[2], None)
        elif kind == "drop_process":
            inj = self._injectors[op[1]]
            inj.values.pop(op[2], None)
            inj.updated.pop(op[2], None)
        elif kind == "pct":
            node = self._computations.get(op[1]) or self._injectors.get(op[1])
            if node is not None:
                node.pct_floors[op[2]] = max(node.pct_floors.get(op[2], MIN_TIMESTAMP), op[3])
        else:  # pragma: no cover - a journal written by a newer version
            msg = f"unknown journal op {kind!r}; was the journal written by a newer millwheel?"
            raise ValueError(msg)

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
        known = sorted(self.names())
        hint = f"known: {', '.join(known[:10])}{', ...' if len(known) > 10 else ''}" if known else "nothing is known yet"
        extra = "; acquire an interval of it (or report an injector) first" if what != "injector" else ""
        return f"no {what} named {name!r} ({hint}){extra}"

    def _unknown_interval(self, comp: _Computation, interval: str) -> str:
        if interval in comp.retired:
            return f"computation {comp.name!r}: interval {interval!r} was split or merged away; use the intervals that replaced it"
        return f"computation {comp.name!r} has no interval {interval!r} ({len(comp.intervals)} intervals); acquire it first"

    def _stale(self, comp: _Computation, interval: str, token: int | None) -> str | None:
        entry = comp.intervals.get(interval)
        if entry is not None and entry.token == token:
            return None
        if entry is None and interval not in comp.retired:
            raise UnknownNameError(self._unknown_interval(comp, interval))
        current = f"current {entry.token}" if entry is not None else "the interval was split or merged away"
        return (
            f"computation {comp.name!r}: stale sequencer token for interval {interval!r} "
            f"(sent {token}, {current}); this worker no longer owns the interval: stop writing for it, or acquire it again"
        )

    @staticmethod
    def _token_sent(reports: Iterable[Report], interval: str) -> int | None:
        token = None
        for item in reports:
            if item[0] == interval:
                token = item[1]
        return token

    @staticmethod
    def _check_token_value(token: Any) -> int:
        if type(token) is not int or token < 1:
            msg = f"token must be the positive integer that acquire returned, got {token!r}"
            raise InvalidRequestError(msg)
        return token

    def _check_report(self, computation: str, i: int, item: Any) -> Report:
        try:
            iv, token, oldest, pending = item
        except (TypeError, ValueError):
            msg = f"computation {computation!r}: report #{i} must be (interval, token, oldest_work, pending), got {item!r}"
            raise InvalidRequestError(msg) from None
        if type(iv) is not str:
            check_name(f"report #{i} interval", iv)
        if type(token) is not int or token < 1:
            msg = f"computation {computation!r}: report #{i} ({iv!r}): token must be the positive integer that acquire returned, got {token!r}"
            raise InvalidRequestError(msg)
        if type(oldest) is not int or not MIN_TIMESTAMP <= oldest <= MAX_TIMESTAMP:
            check_timestamp(f"computation {computation!r}: report #{i} ({iv!r}) oldest_work", oldest)
        if pending is not None and (type(pending) is not int or pending < 0):
            msg = f"computation {computation!r}: report #{i} ({iv!r}): pending must be a count >= 0 or null, got {pending!r}"
            raise InvalidRequestError(msg)
        return iv, token, oldest, pending

    @staticmethod
    def _check_interval_list(computation: str, intervals: Any, what: str = "intervals") -> list[str]:
        return _name_list(f"computation {computation!r}", what, "interval", intervals)


def _name_list(owner: str, what: str, noun: str, items: Any) -> list[str]:
    """A non-empty list of distinct, valid names, or an :class:`InvalidRequestError` saying why."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        msg = f"{owner}: {what} must be a non-empty list of {noun} names, got {items!r}"
        raise InvalidRequestError(msg)
    names = [check_name(f"{owner} {noun}", item) for item in items]
    if len(set(names)) != len(names):
        msg = f"{owner}: {what} lists a {noun} twice: {names!r}"
        raise InvalidRequestError(msg)
    return names


def summarize(watermarks: Mapping[str, int]) -> str:
    """A one-line human summary of published watermarks (for logs and the CLI).

    >>> summarize({"a": 1_000, "b": MIN_TIMESTAMP, "c": MAX_TIMESTAMP})
    'a=1000 b=MIN c=MAX'
    """
    def show(v: int) -> str:
        return "MIN" if v == MIN_TIMESTAMP else "MAX" if v == MAX_TIMESTAMP else str(v)

    return " ".join(f"{k}={show(v)}" for k, v in sorted(watermarks.items()))
