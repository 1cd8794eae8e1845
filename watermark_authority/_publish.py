"""Publishing low watermarks, and everything read back (MillWheel §7.2).

:class:`PublishedState` is the authority's memory (:class:`~watermark_authority._state.AuthorityState`)
behind its journal. Every write goes through :meth:`PublishedState._commit`: the records are
journaled, then applied; then each computation or injector whose raw low watermark rose
above its published value is published at the new value (journaled, then shown). The
published value is thus the maximum of every raw value computed so far and never goes
back: not after a late report, not after a restart on the same journal.

Reads (:meth:`~PublishedState.published`, :meth:`~PublishedState.watermark`) read an
immutable snapshot that each write replaces, so they are safe on any thread while the
writer works. Percentile watermarks (:meth:`~PublishedState.percentile_watermark`, §7.2)
are published the same way, each percentile with its own floor. The dashboard's view
(:meth:`~PublishedState.status`, its notes, an interval map) is read here too. The rules
of the requests that write (sequencers, reports, splits and merges, injectors) are
:class:`~watermark_authority.Authority`'s (``_core.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from servicekit import describe
from watermark_authority._checks import check_name, check_percentile
from watermark_authority._errors import InvalidRequestError, UnknownNameError
from watermark_authority._journal import (
    JOURNAL_FORMAT,
    FormatVersion,
    Journal,
    NullJournal,
    PercentilePublished,
    Record,
    WatermarkPublished,
)
from watermark_authority._percentile import pct_key, weighted_percentile
from watermark_authority._state import AuthorityState, _Computation, _Injector
from watermark_authority._time import MAX_TIMESTAMP, MIN_TIMESTAMP, wall_ms

log = logging.getLogger("watermark_authority")

#: notes kept per computation (:meth:`PublishedState.note`), and the longest note
NOTES = 5
NOTE_CHARS = 500


class PublishedState(AuthorityState):
    """The authority's memory behind its journal, the published low watermarks and the
    dashboard's view (§7.2).

    ``journal`` receives every change before it is applied (default: a journal that keeps
    nothing); the state it holds is loaded first. ``clock`` returns wall time in
    milliseconds. :meth:`published` and :meth:`watermark` are safe on any thread; the rest
    is called by one writer.
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


def summarize(watermarks: Mapping[str, int]) -> str:
    """A one-line human summary of published watermarks (for logs and the CLI).

    >>> summarize({"a": 1_000, "b": MIN_TIMESTAMP, "c": MAX_TIMESTAMP})
    'a=1000 b=MIN c=MAX'
    """

    def show(v: int) -> str:
        return "MIN" if v == MIN_TIMESTAMP else "MAX" if v == MAX_TIMESTAMP else str(v)

    return " ".join(f"{k}={show(v)}" for k, v in sorted(watermarks.items()))
