"""The authority's semantics, with no HTTP and no RocksDB in sight (MillWheel §5.2, §6.2, §7.2).

:class:`Authority` is what the service runs and what :class:`InProcessWatermarkClient`
wraps, so both behave identically. It keeps, per computation, an *interval map*: for each
key interval the current sequencer token, the process that owns it, and the last report
(the oldest pending work).

Rules, and where they come from:

* **Sequencers** (§6.2, §7.1, §7.2). ``acquire`` hands out a token for a key interval that
  is greater than every token handed out before, and thereby invalidates the previous
  owner's. A report must carry the current token, or it is refused with
  :class:`StaleTokenError` and changes nothing. Splitting or merging a key interval retires
  its token too (§7.1).
* **Interval map** (§7.2). A computation's raw low watermark is the minimum over its key
  intervals of the last value each reported. A key interval that stops reporting keeps its
  last known value, so it holds the computation there; one acquired but never reported
  holds it at ``MIN_TIMESTAMP`` ("nothing known"). A new owner, a split or a merge keeps
  the last known value until the new owner reports.
* **Injectors** (§5.2). An injector's low watermark is the minimum over its processes; with
  an expected set declared, a process that has not reported holds it at ``MIN_TIMESTAMP``.
* **Monotonic and durable** (§7.2). After every write, each computation or injector whose
  raw low watermark rose above its published value is *published* at the new value: the
  value is journaled, and only then readable. So the published value is the maximum of
  every raw value computed so far, and it never goes back: not after a late or
  out-of-order report, not after a restart. Reads (:meth:`Authority.watermark`,
  :meth:`Authority.published`) only read: they can be served from an immutable snapshot
  on any thread while the writer works.
* **Consumers take the minimum over their inputs** (§7.2): the authority publishes one value
  per computation and per injector, never a combination, so it is never ahead of a worker.
* **Percentile watermarks** (§7.2): see :meth:`Authority.percentile_watermark`.

Every mutation validates the whole request first, then journals, then changes memory: an
error (malformed, stale, unknown) changes nothing.

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

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from servicekit import INT64_MAX, describe
from watermark_authority._checks import (
    Report,
    check_name,
    check_percentile,
    check_report,
    check_timestamp,
    check_token_value,
    name_list,
)
from watermark_authority._errors import (
    ConflictError,
    InvalidRequestError,
    StaleTokenError,
    UnknownNameError,
)
from watermark_authority._journal import (
    JOURNAL_FORMAT,
    ComputationAdded,
    FormatVersion,
    InjectorAdded,
    IntervalDropped,
    IntervalRetired,
    IntervalState,
    IntervalUnretired,
    Journal,
    NullJournal,
    PercentilePublished,
    ProcessDropped,
    ProcessReported,
    Record,
    TokenCounter,
    WatermarkPublished,
)
from watermark_authority._percentile import pct_key, weighted_percentile
from watermark_authority._state import AuthorityState, _Computation, _Injector
from watermark_authority._time import MAX_TIMESTAMP, MIN_TIMESTAMP, wall_ms

__all__ = [
    "MAX_TIMESTAMP",
    "MIN_TIMESTAMP",
    "Authority",
    "check_name",
    "summarize",
    "wall_ms",
    "weighted_percentile",
]

log = logging.getLogger("watermark_authority")

#: notes kept per computation (:meth:`Authority.note`), and the longest note
NOTES = 5
NOTE_CHARS = 500


class Authority(AuthorityState):
    """The central low-watermark authority's state and rules (§7.2); see the module docstring.

    ``journal`` receives every change before it is applied (default: a journal that keeps
    nothing); the state it holds is loaded first, so a new ``Authority`` on the journal of a
    dead one carries on where it stopped. ``clock`` returns wall time in milliseconds.

    Not thread-safe, except :meth:`published` and :meth:`watermark`: one thread (the
    service's writer) calls everything else; those two read an immutable snapshot that
    each write replaces, and may be called from any thread.
    """

    def __init__(
        self, journal: Journal | None = None, *, clock: Callable[[], int] | None = None
    ) -> None:
        self._journal: Journal = journal if journal is not None else NullJournal()
        self._clock = clock or wall_ms
        super().__init__()
        for record in self._journal.load():
            self._apply(record)
        if self._format != JOURNAL_FORMAT:
            self._journal.commit([FormatVersion(JOURNAL_FORMAT)])
            self._format = JOURNAL_FORMAT
        self._publish(self.names())  # values computed from the journal that were never published
        #: per computation, the last few notes about it (:meth:`note`), newest last
        self._notes: dict[str, list[dict[str, Any]]] = {}

    # ---------------------------------------------------------------- sequencers

    def acquire(
        self, computation: str, intervals: Sequence[str], *, owner: str | None = None
    ) -> dict[str, int]:
        """Become the owner of ``intervals`` of ``computation``: return a fresh token for each.

        The previous token of each interval is invalidated (§6.2: "new workers invalidate
        any extant sequencers before starting work"). An interval new to the computation
        joins its interval map at ``MIN_TIMESTAMP`` until its first report; a known one keeps
        its last reported value. Acquiring is how a computation declares its intervals:
        acquire all of them before reporting, or the watermark runs ahead of the missing ones.
        ``owner`` describes the acquiring process (e.g. ``host:pid``) for the dashboard.
        """
        check_name("computation", computation)
        names = self._check_interval_list(computation, intervals)
        if owner is not None:
            check_name("owner", owner)
        comp = self._computations.get(computation)
        if comp is None:
            self._check_kind_free(computation, "computation")
        records: list[Record] = []
        if comp is None:
            records.append(ComputationAdded(computation))
        tokens: dict[str, int] = {}
        token = self._next_token
        for iv in names:
            old = comp.intervals.get(iv) if comp else None
            if old is None:
                records.append(
                    IntervalState(computation, iv, token, MIN_TIMESTAMP, None, None, owner)
                )
            else:
                records.append(
                    IntervalState(
                        computation, iv, token, old.value, old.pending, old.updated_ms, owner
                    )
                )
            if comp is not None and iv in comp.retired:
                records.append(IntervalUnretired(computation, iv))
            tokens[iv] = token
            token += 1
        records.append(TokenCounter(token))
        self._commit(records)
        return tokens

    def check_token(self, computation: str, interval: str, token: int) -> None:
        """Raise :class:`StaleTokenError` unless ``token`` is the interval's current sequencer.

        This is the fence for any write on behalf of an interval (stream logs, state): a
        writer checks its token here, or compares it with the highest token it has seen for
        the interval (tokens only grow).
        """
        comp = self._computation(computation)
        check_name(f"computation {computation!r} interval", interval)
        check_token_value(f"computation {computation!r} interval {interval!r}", token)
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
        how much work that is (an int64 count >= 0: the weight for percentile watermarks),
        or ``None``. The last report of an interval replaces the previous one (a lower value
        holds the computation back, the safe direction); the published watermark never goes back.

        Raises :class:`StaleTokenError` listing every interval whose token is not current,
        :class:`UnknownNameError` for intervals never acquired, :class:`InvalidRequestError`
        for malformed reports; in every case nothing changes.
        """
        comp = self._computation(computation)
        if not isinstance(reports, (list, tuple)):
            if isinstance(reports, (str, bytes, Mapping)) or not isinstance(reports, Iterable):
                msg = f"computation {computation!r}: reports must be a list of (interval, token, oldest_work, pending), got {describe(reports)}"
                raise InvalidRequestError(msg)
            reports = list(reports)
        now = self._clock()
        intervals = comp.intervals
        records: list[Record] = []
        stale: list[str] = []
        unknown: list[str] = []
        for i, item in enumerate(reports):
            iv, token, oldest, pending = check_report(computation, i, item)
            entry = intervals.get(iv)
            if entry is None:
                if iv in comp.retired:
                    stale.append(iv)
                else:
                    unknown.append(iv)
            elif entry.token != token:
                stale.append(iv)
            else:
                records.append(
                    IntervalState(computation, iv, token, oldest, pending, now, entry.owner)
                )
        if unknown:
            shown = ", ".join(describe(u, 60) for u in unknown[:5])
            msg = (
                f"computation {computation!r}: no sequencer for interval(s) {shown}"
                f"{' and more' if len(unknown) > 5 else ''}; acquire an interval before reporting it"
            )
            raise UnknownNameError(msg)
        if stale:
            if len(stale) == 1:
                msg = (
                    self._stale(comp, stale[0], self._token_sent(reports, stale[0]))
                    or "stale token"
                )
            else:
                shown = ", ".join(repr(s) for s in stale[:5])
                msg = (
                    f"computation {computation!r}: stale sequencer tokens for {len(stale)} intervals "
                    f"({shown}{', ...' if len(stale) > 5 else ''}); this worker no longer owns them: "
                    "stop writing for them, or acquire them again. Nothing in this batch was applied"
                )
            raise StaleTokenError(msg, [(computation, s) for s in stale])
        if records:
            self._commit(records)

    # ---------------------------------------------------------------- ownership moves

    def split(
        self, computation: str, interval: str, into: Sequence[str], *, owner: str | None = None
    ) -> dict[str, int]:
        """Split ``interval`` into the intervals ``into`` (§7.1); return their fresh tokens.

        The old interval's token is retired, so its owner's later reports are stale. Each new
        interval starts at the old one's last known value (the work was there), so the
        watermark is held exactly as before until the new owners report. ``pending`` is
        shared out among them. ``into`` may reuse the old name. ``owner`` (the caller) owns
        the new intervals; without it they keep the old interval's owner.
        """
        comp = self._computation(computation)
        check_name(f"computation {computation!r} interval", interval)
        names = self._check_interval_list(computation, into, what="split into")
        if owner is not None:
            check_name("owner", owner)
        old = comp.intervals.get(interval)
        if old is None:
            raise UnknownNameError(self._unknown_interval(comp, interval))
        taken = [n for n in names if n in comp.intervals and n != interval]
        if taken:
            msg = f"computation {computation!r}: cannot split {interval!r} into {taken!r}: already intervals of it; merge them instead, or pick new names"
            raise ConflictError(msg)
        records: list[Record] = [
            IntervalDropped(computation, interval),
            IntervalRetired(computation, interval, old.token),
        ]
        tokens: dict[str, int] = {}
        token = self._next_token
        for i, iv in enumerate(names):
            pending = (
                None
                if old.pending is None
                else old.pending // len(names) + (1 if i < old.pending % len(names) else 0)
            )
            records.append(
                IntervalState(
                    computation, iv, token, old.value, pending, old.updated_ms, owner or old.owner
                )
            )
            if iv in comp.retired or iv == interval:
                records.append(IntervalUnretired(computation, iv))
            tokens[iv] = token
            token += 1
        records.append(TokenCounter(token))
        self._commit(records)
        return tokens

    def merge(
        self, computation: str, intervals: Sequence[str], into: str, *, owner: str | None = None
    ) -> int:
        """Merge ``intervals`` into one interval ``into`` (§7.1); return its fresh token.

        The old tokens are retired. The merged interval starts at the minimum of their last
        known values, with their pending work summed (an uncounted interval counts as 1; the
        sum stops at the int64 maximum). ``owner`` (the caller) owns it.
        """
        comp = self._computation(computation)
        names = self._check_interval_list(computation, intervals, what="merge")
        check_name("merge into", into)
        if owner is not None:
            check_name("owner", owner)
        missing = [n for n in names if n not in comp.intervals]
        if missing:
            raise UnknownNameError(self._unknown_interval(comp, missing[0]))
        if into in comp.intervals and into not in names:
            msg = f"computation {computation!r}: cannot merge into {into!r}: it is another interval of it; include it in the merge or pick a new name"
            raise ConflictError(msg)
        olds = [comp.intervals[n] for n in names]
        value = min(o.value for o in olds)
        pending = (
            None
            if all(o.pending is None for o in olds)
            else min(INT64_MAX, sum(1 if o.pending is None else o.pending for o in olds))
        )
        updated = [o.updated_ms for o in olds if o.updated_ms is not None]
        records: list[Record] = []
        for n, o in zip(names, olds, strict=True):
            records += [IntervalDropped(computation, n), IntervalRetired(computation, n, o.token)]
        token = self._next_token
        records.append(
            IntervalState(
                computation,
                into,
                token,
                value,
                pending,
                min(updated) if updated else None,
                owner or olds[0].owner,
            )
        )
        if into in comp.retired or into in names:
            records.append(IntervalUnretired(computation, into))
        records.append(TokenCounter(token + 1))
        self._commit(records)
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
        procs = name_list(f"injector {injector!r}", "processes", "process", processes)
        inj = self._injectors.get(injector)
        records: list[Record] = [InjectorAdded(injector, tuple(procs))]
        if inj is None:
            self._check_kind_free(injector, "injector")
        else:
            records += [ProcessDropped(injector, p) for p in inj.values if p not in procs]
        self._commit(records)

    def report_injector(self, injector: str, process: str, low_watermark: int) -> None:
        """Record one injector process's low watermark (§5.2), e.g. the minimum creation time
        of its unfinished input files; ``MAX_TIMESTAMP`` when it has finished."""
        check_name("injector", injector)
        check_name(f"injector {injector!r} process", process)
        check_timestamp(f"injector {injector!r} process {process!r} low_watermark", low_watermark)
        inj = self._injectors.get(injector)
        records: list[Record] = []
        if inj is None:
            self._check_kind_free(injector, "injector")
            records.append(InjectorAdded(injector, None))
        elif inj.expected is not None and process not in inj.expected:
            msg = (
                f"injector {injector!r}: process {process!r} is not in its expected set "
                f"{inj.expected!r}; add it with expect_injector_processes first"
            )
            raise UnknownNameError(msg)
        records.append(ProcessReported(injector, process, low_watermark, self._clock()))
        self._commit(records)

    # ---------------------------------------------------------------- broadcast

    def published(self) -> Mapping[str, int]:
        """Every published low watermark by name: an immutable snapshot, safe on any thread.

        Each write that changes what is published replaces the snapshot (after journaling),
        so a reader never waits for a writer and never sees a value that is not durable.
        """
        return MappingProxyType(self._snapshot)

    def watermark(self, name: str) -> int:
        """The published low watermark of computation or injector ``name`` (safe on any thread)."""
        value = self._snapshot.get(name)
        if value is None:
            check_name("name", name)
            raise UnknownNameError(self._unknown(name, "computation or injector"))
        return value

    def watermarks(self) -> dict[str, int]:
        """Every published low watermark, computations and injectors, by name."""
        return dict(self._snapshot)

    def percentile_watermark(self, name: str, pct: float) -> int:
        """Publish and return the ``pct`` percent watermark of ``name`` (§7.2).

        "The progress of ``pct`` percent of the pending work": the oldest ``100 - pct``
        percent of the work is stripped away as stragglers, and the minimum of the rest is
        taken (see :func:`weighted_percentile`). For a computation the work is weighted by
        each interval's reported ``pending``, or 1 per interval where it was not reported;
        for an injector, 1 per process. The value is never below the low watermark
        (``pct = 100`` gives the low watermark) and, per ``pct``, never goes back: it is
        journaled before it is returned.
        """
        pct = check_percentile(pct)
        node = self._node(name)
        low = node.published
        key = pct_key(pct)
        if isinstance(node, _Computation):
            cached = node._pct_cache.get(key)
            if cached is not None and cached[0] == node.version:
                raw = cached[1]
            else:
                entries = list(node.intervals.values())
                raw = weighted_percentile(
                    [e.value for e in entries],
                    [1 if e.pending is None else e.pending for e in entries],
                    pct,
                )
                node._pct_cache[key] = (node.version, raw)
        else:
            members = node.members()
            raw = weighted_percentile(
                [node.values.get(p, MIN_TIMESTAMP) for p in members], [1] * len(members), pct
            )
        value = max(raw, low, node.pct_floors.get(key, MIN_TIMESTAMP))
        if value > node.pct_floors.get(key, MIN_TIMESTAMP):
            self._commit([PercentilePublished(name, key, value)])
        return value

    def names(self) -> dict[str, str]:
        """Every known name and its kind, ``"computation"`` or ``"injector"``."""
        out = {n: "computation" for n in self._computations}
        out.update({n: "injector" for n in self._injectors})
        return out

    def note(self, computation: str, text: str) -> None:
        """Keep a note about ``computation`` for the dashboard: a rescale of its key
        intervals and why (the runtime's automatic policy says which figures drove it,
        §7.1). Not journaled (it is for people, and a restart loses only the notes); the
        last :data:`NOTES` per computation, each at most :data:`NOTE_CHARS` characters."""
        check_name("computation", computation)
        if not isinstance(text, str) or not text.strip():
            msg = f"a note must be a non-empty string, got {describe(text)}"
            raise InvalidRequestError(msg)
        notes = self._notes.setdefault(computation, [])
        notes.append({"at_ms": self._clock(), "text": text[:NOTE_CHARS]})
        del notes[:-NOTES]

    def status(self, percentiles: Sequence[float] = (99.0,)) -> dict[str, Any]:
        """Everything the dashboard shows; never a sequencer token (it is served without the secret).

        Per name: the published low watermark, what holds it back (the key interval or
        process with the oldest value, whether it has ever reported, and for a key interval
        the process that owns it), the percentile watermarks (published, so journaled), and
        for injectors every process's last value.
        """
        now = self._clock()
        low = self._snapshot
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
                else {
                    "interval": holder,
                    "value": entry.value,
                    "pending": entry.pending,
                    "updated_ms": entry.updated_ms,
                    "owner": entry.owner,
                },
                "percentiles": {
                    pct_key(p): self.percentile_watermark(name, p) for p in percentiles
                },
                "notes": list(self._notes.get(name, ())),
            }
        for name, inj in self._injectors.items():
            raw, holder = inj.raw()
            out["injectors"][name] = {
                "low_watermark": low[name],
                "raw": raw,
                "expected": inj.expected,
                "processes": {
                    p: {
                        "value": inj.values.get(p, MIN_TIMESTAMP),
                        "updated_ms": inj.updated.get(p),
                        "reported": p in inj.values,
                    }
                    for p in inj.members()
                },
                "holding": None
                if holder is None
                else {
                    "process": holder,
                    "value": inj.values.get(holder, MIN_TIMESTAMP),
                    "reported": holder in inj.values,
                },
                "percentiles": {
                    pct_key(p): self.percentile_watermark(name, p) for p in percentiles
                },
            }
        return out

    def intervals(self, computation: str) -> dict[str, dict[str, Any]]:
        """The interval map of ``computation``: token, owner, last value, pending, last report time.

        It reveals the sequencer tokens: the service serves it only with the secret.
        """
        comp = self._computation(computation)
        return {
            iv: {
                "token": e.token,
                "owner": e.owner,
                "value": e.value,
                "pending": e.pending,
                "updated_ms": e.updated_ms,
            }
            for iv, e in comp.intervals.items()
        }

    def close(self) -> None:
        self._journal.close()

    # ---------------------------------------------------------------- internals

    def _commit(self, records: list[Record]) -> None:
        self._journal.commit(records)  # durable first; if this raises, memory is unchanged
        apply = self._apply
        touched = {apply(r) for r in records}
        touched.discard(None)
        self._publish(touched)  # type: ignore[arg-type]

    def _publish(self, names: Iterable[str]) -> None:
        """Publish the raw low watermark of each of ``names`` that rose (journal, then show)."""
        records: list[Record] = []
        nodes: list[_Computation | _Injector] = []
        for name in names:
            node = self._computations.get(name) or self._injectors.get(name)
            if node is None:
                continue
            nodes.append(node)
            raw, _ = node.raw()
            if raw > node.published:
                records.append(WatermarkPublished(name, raw))
        if records:
            try:
                self._journal.commit(records)
            except (
                Exception
            ):  # the write itself is durable; these values stay unpublished until the next write
                log.exception(
                    "journaling published watermarks failed; keeping the previous published values"
                )
            else:
                for r in records:
                    self._apply(r)
        snapshot = self._snapshot
        if any(snapshot.get(node.name) != node.published for node in nodes):
            fresh = dict(snapshot)
            fresh.update({node.name: node.published for node in nodes})
            self._snapshot = (
                fresh  # replaced, never mutated: readers on other threads see one or the other
            )

    @staticmethod
    def _token_sent(reports: Iterable[Report], interval: str) -> int | None:
        token = None
        for item in reports:
            if item[0] == interval:
                token = item[1]
        return token

    @staticmethod
    def _check_interval_list(
        computation: str, intervals: Any, what: str = "intervals"
    ) -> list[str]:
        return name_list(f"computation {computation!r}", what, "interval", intervals)


def summarize(watermarks: Mapping[str, int]) -> str:
    """A one-line human summary of published watermarks (for logs and the CLI).

    >>> summarize({"a": 1_000, "b": MIN_TIMESTAMP, "c": MAX_TIMESTAMP})
    'a=1000 b=MIN c=MAX'
    """

    def show(v: int) -> str:
        return "MIN" if v == MIN_TIMESTAMP else "MAX" if v == MAX_TIMESTAMP else str(v)

    return " ".join(f"{k}={show(v)}" for k, v in sorted(watermarks.items()))
