"""What a computation's query has read, and its input low watermark (§4.5, §7.2).

:class:`ConsumedFiles` reads, from a query's checkpoint, which stream-log files each of
its batches consumed; :func:`input_watermarks` turns that and the upstream watermarks into
the computation's input low watermark, in two versions (docs/runtime.md, "Low watermarks
and timers"):

* the one **reported** (the computation's own low watermark is bounded by it): the files
  of batches not yet committed *and published* still hold it, because their productions
  are not visible downstream until then (§6.1.2);
* the one a **heartbeat** carries into the query itself: it may count the files of the
  batch Spark has planned already as consumed. A heartbeat is read by a later batch (the
  planned one fixed its files when it was planned, and a replay reads the same), and
  Spark's event-time watermark moves only after the batch that read it, so every record of
  those files has been processed before any batch runs under it. Not for a computation
  that reads a stream it writes itself (dead letters, a loop): the planned batch's own
  productions, not yet published, may be older than its input.
* where Spark **lists the heartbeat source before every input** when it plans a batch
  (``listed_first``: ``plans/_inputs.py`` says when), the heartbeat counts every file
  listed, planned or not: the batch that reads a heartbeat lists the inputs after the
  heartbeat file existed, so it reads (or an earlier batch read) every file published
  before it, and a record older than the upstream watermark is in such a file. Its
  records and the timers the heartbeat makes due then run in the same batch, the records
  first (``docs/runtime.md``, "Low watermarks and timers").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from millwheel.runtime._fs import Location
from millwheel.runtime._spark_internals import (
    OFFSETS,
    SOURCES,
    file_source_offsets,
    planned_batches,
    source_log_files,
)
from millwheel.runtime._streams import StreamLog

__all__ = [
    "ConsumedFiles",
    "InputWatermarks",
    "heartbeat_batch",
    "input_watermarks",
    "read_input_watermarks",
]


class ConsumedFiles:
    """Which stream-log files a query's committed batches consumed, from its checkpoint.

    Each file source keeps its own log (``sources/<i>/<log offset>``: the files it added at
    that offset); the query's offset log (``offsets/<batch>``) says which log offset of each
    source a batch read up to.
    """

    def __init__(self, checkpoint: Location) -> None:
        self.checkpoint = checkpoint
        self.sources = checkpoint.child(SOURCES)
        self.seen: set[str] = set()
        self.files: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
        #: the query's own heartbeat files: name -> (source index, file-source batch)
        self.heartbeat_files: dict[str, tuple[int, int]] = {}
        self._offsets: dict[int, dict[int, int]] = {}

    def refresh(self) -> None:
        for i in self.sources.list():
            if not i.isdigit():
                continue
            d = self.sources.child(i)
            for name in d.list():
                if name.startswith(".") or f"{i}/{name}" in self.seen:
                    continue
                text = d.child(name).read_text()
                files = None if text is None else source_log_files(text)
                if files is None:
                    continue  # a file being written: read it next time
                for path, batch in files:
                    if len(path) >= 4 and path[-4] == "streams":
                        self.files.setdefault((path[-3], path[-2]), {})[path[-1]] = (int(i), batch)
                    elif len(path) >= 3 and path[-3] == "heartbeats":
                        self.heartbeat_files[path[-1]] = (int(i), batch)
                self.seen.add(f"{i}/{name}")

    def log_offsets(self, batch: int, *, committed: bool = True) -> dict[int, int]:
        """Source index -> log offset read up to, for a query batch. A batch not known to be
        committed is read again each time (a rescale may drop a planned batch and plan it anew)."""
        if batch < 0:
            return {}
        cached = self._offsets.get(batch)
        if cached is None:
            cached = file_source_offsets(
                self.checkpoint.child(OFFSETS, str(batch)).read_text() or ""
            )
            if committed:
                self._offsets[batch] = cached
        return cached

    def planned(self) -> int:
        """The newest batch of the query's offset log (-1: none): the batch running, or the
        next to run, whose files Spark fixed when it planned it (a replay reads the same)."""
        return max(planned_batches(self.checkpoint), default=-1)

    def names(self, stream: str, producer: str, upto: int, *, committed: bool = True) -> set[str]:
        offs = self.log_offsets(upto, committed=committed)
        return {
            n
            for n, (i, b) in self.files.get((stream, producer), {}).items()
            if b <= offs.get(i, -1)
        }

    def heartbeat_names(self, upto: int) -> set[str]:
        offs = self.log_offsets(upto)
        return {n for n, (i, b) in self.heartbeat_files.items() if b <= offs.get(i, -1)}

    def forget(self, stream: str | None, producer: str | None, names: set[str]) -> None:
        """Stop tracking pruned files (``stream=None``: heartbeat files), so lookups stay
        proportional to the files still live; offsets of old batches are dropped too."""
        files = (
            self.heartbeat_files if stream is None else self.files.get((stream, producer or ""), {})
        )
        for n in names:
            files.pop(n, None)
        if len(self._offsets) > 64:
            for b in sorted(self._offsets)[:-8]:
                del self._offsets[b]


def heartbeat_batch(
    name: str, inputs: Iterable[tuple[str, str]], consumed: ConsumedFiles, published: int
) -> int:
    """The newest batch whose files computation ``name``'s heartbeat counts as consumed: the
    one Spark planned already, or the last published one if ``name`` reads a stream it
    writes itself (its planned batch's productions are not published yet)."""
    if any(producer == name for _, producer in inputs):
        return published
    return max(published, consumed.planned())


class InputWatermarks(NamedTuple):
    """:func:`input_watermarks`' answer."""

    #: over the files that committed-and-published batches consumed: what C's reported watermark is bounded by
    reported: int
    #: over the files that batches up to the planned one consumed: what C's heartbeat carries
    heartbeat: int
    #: live input files no published batch consumed (C is drained only without any)
    pending: int
    #: live input files no planned batch reads yet: a later batch reads them
    waiting: int


def input_watermarks(
    upstream: int,
    listed: Mapping[tuple[str, str], Mapping[str, int]],
    consumed: ConsumedFiles,
    published: int,
    planned: int,
    *,
    listed_first: bool = False,
) -> InputWatermarks:
    """The input low watermark over the files that committed-and-published batches up to
    ``published`` consumed, and the one over the files that batches up to ``planned``
    (>= ``published``) consumed, with the files each counts as unconsumed.

    ``listed`` is each input (stream, producer)'s live files and their oldest timestamps;
    ``upstream`` is the minimum of the upstream's published low watermarks, read *before*
    the files were listed: a file published after the listing carries timestamps at or
    above its producer's watermark. Pending files hold both, whoever wrote them; with
    ``listed_first`` (Spark lists the query's heartbeats before its inputs, and no file
    a batch reads could wait for a later one) waiting files do not hold the heartbeat,
    which every batch that reads it reads with them.
    """
    reported = heartbeat = upstream
    pending = waiting = 0
    for (stream, producer), files in listed.items():
        done = consumed.names(stream, producer, published)
        running = (
            consumed.names(stream, producer, planned, committed=False)
            if planned > published
            else done
        )
        for name, lo in files.items():
            if name not in done:
                pending += 1
                reported = min(reported, lo)
                if name not in running:
                    waiting += 1
                    if not listed_first:
                        heartbeat = min(heartbeat, lo)
    return InputWatermarks(reported, heartbeat, pending, waiting)


def read_input_watermarks(
    name: str,
    inputs: Iterable[tuple[str, str]],
    streams: StreamLog,
    consumed: ConsumedFiles,
    published: int,
    upstream: Callable[[], int],
    *,
    listed_first: bool = False,
) -> tuple[InputWatermarks, int]:
    """:func:`input_watermarks` of computation ``name`` now, with the batch its heartbeat
    counts (:func:`heartbeat_batch`), read in the one order that is both safe and current:

    1. the upstream's published watermarks (``upstream()``), before anything is listed;
    2. its input files (a file published later is bounded by 1.);
    3. the newest planned batch, *after* the listing: a batch Spark planned while the files
       were listed counts, so input its query already took is not "waiting" (read in the
       other order, the same files made a heartbeat held at them, a whole stateful batch of
       its own after the data batch; docs/runtime.md, "Low watermarks and timers");
    4. the file sources' logs, after 3.: Spark writes a batch's file list before its offset
       log entry, so every file of that batch is known (read before, they would only count
       as waiting: late, never wrong).

    ``listed_first`` (:func:`input_watermarks`) is ignored for a computation that reads a
    stream it writes itself.
    """
    inputs = list(inputs)
    up = upstream()
    listed = {pair: streams.files(*pair, live_only=True) for pair in inputs}
    planned = heartbeat_batch(name, inputs, consumed, published)
    consumed.refresh()
    first = listed_first and not any(producer == name for _, producer in inputs)
    return input_watermarks(up, listed, consumed, published, planned, listed_first=first), planned
