"""Injector sources (MillWheel §5.2): where external data enters, with an injector low watermark.

A source yields :class:`SourceBatch` es: records, the dead letters of input it could
not turn into records (with their reasons), and the injector low watermark after them:
the bound on the timestamps of records it may still deliver (Fig. 10: the oldest
unfinished file's time). Both backends run the same sources: the harness calls
:meth:`Source.batches` directly, the Spark runtime from its driver (or, for
:class:`~millwheel.LogFileSource`, through a Spark streaming reader built on the same
parser). :class:`SampleSource` serves an in-memory list, for demos and tests.

>>> src = SampleSource([{"q": "cats", "ts": 1_000}, {"q": "dogs", "ts": 2_500}], timestamp="ts", batch_size=1)
>>> [(len(b.records), b.low_watermark) for b in src.batches()]
[(1, 2500), (1, 9223372036854775807)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from millwheel._delivery import invalid_record, record_problem
from millwheel._errors import TopologyError
from millwheel._record import MAX_TIMESTAMP, Record


@dataclass(frozen=True, slots=True)
class SourceBatch:
    records: list[Record]
    #: the injector low watermark once these records are delivered
    low_watermark: int
    #: records for the ``dead_letters`` stream: input that is not a record, with the reason
    dead_letters: list[Record] = field(default_factory=list)


class Source:
    """Base class of injector sources.

    ``batches`` is called with the injector's name and stream (for the dead letters it
    makes) and yields :class:`SourceBatch` es in order; calling it again starts over, so
    the Spark driver resumes a source by skipping the batches it already published.
    """

    def batches(self, injector: str = "injector", stream: str = "records") -> Iterator[SourceBatch]:
        raise NotImplementedError


class SampleSource(Source):
    """An in-memory source: a finite list of values or :class:`Record` s, in order.

    ``timestamp`` names the field of a dict value holding its timestamp, or is a function
    of the value; ``Record`` items keep their own. The watermark after each batch is the
    oldest timestamp still to come (so out-of-order data is not late), and the end of the
    data publishes ``MAX_TIMESTAMP`` (the injector is finished).
    """

    def __init__(
        self,
        items: Iterable[Any],
        *,
        timestamp: str | Callable[[Any], int] | None = None,
        id_prefix: str = "sample",
        batch_size: int = 1_000,
    ) -> None:
        if batch_size < 1:
            msg = f"SampleSource: batch_size must be >= 1, got {batch_size}"
            raise TopologyError(msg)
        self._items = list(items)
        self._timestamp = timestamp
        self._prefix = id_prefix
        self._batch_size = batch_size

    def _to_record(self, i: int, item: Any) -> Record:
        if isinstance(item, Record):
            return item
        ts_of = self._timestamp
        if ts_of is None:
            msg = "SampleSource: plain values need timestamp='field' or timestamp=function"
            raise TopologyError(msg)
        if isinstance(ts_of, str):
            ts = item.get(ts_of) if isinstance(item, dict) else item[ts_of]
        else:
            ts = ts_of(item)
        return Record(None, item, ts, f"{self._prefix}-{i}")  # type: ignore[arg-type]  # checked in batches()

    def records(self) -> list[Record]:
        return [self._to_record(i, item) for i, item in enumerate(self._items)]

    def batches(self, injector: str = "injector", stream: str = "records") -> Iterator[SourceBatch]:
        """Batches of ``batch_size`` items; an item whose id or timestamp is invalid is a dead letter."""
        recs = self.records()
        good = [record_problem(r) is None for r in recs]
        n = len(recs)
        # suffix minima: the oldest timestamp not yet delivered after each batch
        suffix = [MAX_TIMESTAMP] * (n + 1)
        for i in range(n - 1, -1, -1):
            suffix[i] = min(recs[i].timestamp, suffix[i + 1]) if good[i] else suffix[i + 1]
        for start in range(0, n, self._batch_size):
            end = min(n, start + self._batch_size)
            dead = [
                invalid_record(injector, stream, recs[i], record_problem(recs[i]) or "", i)
                for i in range(start, end)
                if not good[i]
            ]
            yield SourceBatch([recs[i] for i in range(start, end) if good[i]], suffix[end], dead)
        if n == 0:
            yield SourceBatch([], MAX_TIMESTAMP)
