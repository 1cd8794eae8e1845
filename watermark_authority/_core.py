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
Publishing (journal, then show), the reads, the percentile watermarks and the dashboard's
status are :class:`~watermark_authority._publish.PublishedState` (``_publish.py``), on the
memory and its one rule per journal record (``_state.py``); the checks every request passes
first are in ``_checks.py``.

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

from collections.abc import Iterable, Mapping, Sequence
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
    ComputationAdded,
    InjectorAdded,
    IntervalDropped,
    IntervalRetired,
    IntervalState,
    IntervalUnretired,
    ProcessDropped,
    ProcessReported,
    Record,
    TokenCounter,
)
from watermark_authority._percentile import weighted_percentile
from watermark_authority._publish import PublishedState, summarize
from watermark_authority._time import MAX_TIMESTAMP, MIN_TIMESTAMP, wall_ms

__all__ = [
    "MAX_TIMESTAMP",
    "MIN_TIMESTAMP",
    "Authority",
    "check_name",
    "check_percentile",
    "summarize",
    "wall_ms",
    "weighted_percentile",
]


class Authority(PublishedState):
    """The central low-watermark authority's state and rules (§7.2); see the module docstring.

    ``journal`` receives every change before it is applied (default: a journal that keeps
    nothing); the state it holds is loaded first, so a new ``Authority`` on the journal of a
    dead one carries on where it stopped. ``clock`` returns wall time in milliseconds.

    Not thread-safe, except :meth:`published` and :meth:`watermark`: one thread (the
    service's writer) calls everything else; those two read an immutable snapshot that
    each write replaces, and may be called from any thread.
    """

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

    # ---------------------------------------------------------------- internals

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
