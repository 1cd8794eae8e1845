"""The reading plan of a log directory: the same on both backends (MillWheel §4.5, Fig. 10).

An *offset* is ``{"files": {name: FileProgress.to_json()}, "lw": injector low watermark}``:
each file's read state (:class:`FileProgress`) and the watermark. The Spark reader keeps
offsets in Spark's offset log (so a replayed batch reads exactly the same bytes); the
in-memory source walks the same plans, so both backends cut the input into the same
batches and send every record under the same watermark.

* :func:`plan_offset` — the next offset: how far to read each file in one batch, and the
  injector low watermark, the smallest :func:`promise` of the files not finished;
* :func:`plan_ranges` — the byte ranges a batch reads and the watermark each is sent under;
* :func:`holding_file`, :func:`unread`, :func:`disorder` — what a run's status and summary
  report about an offset.

The source itself (:class:`~millwheel.LogFileSource`) and the line parser live in
:mod:`millwheel._logfile` and :mod:`millwheel._logparse`.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Any

from millwheel._logdisorder import Others, PlanIds, measure
from millwheel._logparse import file_time, first_timestamp, is_log_file
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP

_TAIL = 1 << 16

#: the default ``max_skew_ms``: ten years. A unit mistake of x1000 always trips it —
#: seconds where milliseconds are expected for any record after 1980, micro- or
#: nanoseconds for any after 1970-01-05 — and a backfill whose files lie a few
#: years apart does not.
DEFAULT_MAX_SKEW_MS = 10 * 365 * 86_400_000


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How a log directory is read; see :class:`LogFileSource`."""

    path: str
    id_field: str = "id"
    ts_field: str = "ts"
    idle_finish_ms: int | None = 60_000
    finite: bool = False
    lateness_ms: int = 0
    max_bytes_per_batch: int = 64 << 20
    finish_on_rotation: bool = True
    #: how far a record's timestamp may lie from its neighbours (:func:`plausible_bounds`); ``None``: any
    max_skew_ms: int | None = DEFAULT_MAX_SKEW_MS


@dataclass(slots=True)
class FileProgress:
    """One log file's read state, kept by name in every offset (a restart neither rescans nor guesses).

    >>> p = FileProgress.of("part-0003.jsonl", None)
    >>> (p.pos, p.time, p.finished), FileProgress.of("q.jsonl", p.to_json()) == FileProgress.of("q.jsonl", None)
    ((0, None, False), True)
    """

    #: bytes read so far (complete lines only, and a last line without a newline once complete)
    pos: int = 0
    #: the time in the file's name (:func:`file_time`), or ``None``
    time: int | None = None
    #: the smallest timestamp read from the file so far
    oldest: int | None = None
    #: the newest timestamp read from the file so far
    newest: int | None = None
    #: the smallest timestamp in the bytes the latest batch that read from the file read
    low: int | None = None
    #: the newest timestamp read when the reader was last at the file's end (a live file's progress)
    reached: int | None = None
    #: the disorder actually read: the most a record ran behind the newest one before it, ms
    #: (first deliveries only: ``_logdisorder.py``)
    behind: int = 0
    #: the most a record (a first delivery) ran before the time in the file's name, ms
    #: (``None``: an offset from before it was kept, or a file without a time)
    early: int | None = None
    #: the reader was at the file's end after the newest batch
    at_end: bool = False
    #: the file will not grow: a ``.done``/``_DONE`` marker, ``finite``, a newer file, or idle
    complete: bool = False
    #: complete and read to its end
    finished: bool = False
    #: the plausible timestamps of the bytes the latest batch that read from the file read,
    #: ``[lo, hi]`` (:func:`plausible_bounds`; ``None`` in offsets from before the check)
    bounds: list[int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _PROGRESS_FIELDS}

    @classmethod
    def of(cls, name: str, raw: dict[str, Any] | list[Any] | None) -> FileProgress:
        """The progress of file ``name`` in an offset (``None``: a file not seen before)."""
        if raw is None:
            return cls(time=file_time(name))
        if isinstance(
            raw, list
        ):  # offsets from before progress had names: [pos, time, finished, reached]
            pos, t, finished, reached = (list(raw) + [None, None, None])[:4]
            named = file_time(name)
            return cls(
                pos=pos,
                time=named,
                oldest=t if named is None else None,
                reached=reached,
                complete=bool(finished),
                finished=bool(finished),
            )
        return cls(**{k: raw[k] for k in _PROGRESS_FIELDS if k in raw})

    @property
    def started(self) -> int | None:
        """When the file began, for rotation: the time in its name, or its oldest record's."""
        return self.time if self.time is not None else self.oldest


_PROGRESS_FIELDS = tuple(FileProgress.__dataclass_fields__)


def promise(p: FileProgress, lateness_ms: int) -> int | None:
    """What file ``p`` promises (MillWheel §4.5, Fig. 10): no record of it still to be sent is older.

    ``None`` means the promise is not known, and the file holds the watermark where it is.
    This is the one rule both backends' watermarks and the stall warning follow:

    * a *finished* file: ``MAX_TIMESTAMP``, nothing more comes from it;
    * a file with a time in its name: ``max(time, reached) - lateness_ms`` — the writer's
      promise (Fig. 10), advanced by the newest record read at the file's end (a live file
      being tailed) minus the declared disorder;
    * a file without a time in its name that is complete but not read to its end, not
      read at all, or behind its end: ``None`` — what is left in it is unknown, so a
      directory listing never lets the watermark pass a file nobody has read;
    * a *growing* file without a time, read to its end: ``oldest - lateness_ms`` (its oldest
      record so far, at most its first one's); with a declared disorder (``lateness_ms > 0``)
      also advanced by the newest record read at its end, ``max(oldest, reached) - lateness_ms``.

    A finished file's own records are never late for want of a promise: a range of a file
    without a time is sent under the smallest timestamp in it (:func:`plan_ranges`).

    >>> promise(FileProgress(time=1_000, reached=1_500), 100), promise(FileProgress(oldest=900, at_end=True), 0)
    (1400, 900)
    >>> promise(FileProgress(oldest=900, complete=True), 0) is None  # complete, not read to its end
    True
    """
    if p.finished:
        return MAX_TIMESTAMP
    if p.time is not None:
        return max(p.time, p.time if p.reached is None else p.reached) - lateness_ms
    if p.complete or p.oldest is None or not p.at_end:
        return None
    if lateness_ms > 0 and p.reached is not None:
        return max(p.oldest, p.reached) - lateness_ms
    return p.oldest - lateness_ms


def initial_offset() -> dict[str, Any]:
    return {"files": {}, "lw": MIN_TIMESTAMP}


def progress_of(offset: dict[str, Any]) -> dict[str, FileProgress]:
    """Every file's :class:`FileProgress` in ``offset``, by name."""
    return {name: FileProgress.of(name, raw) for name, raw in offset["files"].items()}


def _last_newline(path: str, start: int, size: int) -> int:
    """Offset just past the last ``\\n`` in ``[start, size)``, or ``start`` if none."""
    with open(path, "rb") as fh:
        hi = size
        while hi > start:
            lo = max(start, hi - _TAIL)
            fh.seek(lo)
            chunk = fh.read(hi - lo)
            i = chunk.rfind(b"\n")
            if i >= 0:
                return lo + i + 1
            hi = lo
    return start


def _next_newline(path: str, start: int, size: int) -> int:
    """Offset just past the first ``\\n`` at or after ``start``, or ``start`` if none."""
    with open(path, "rb") as fh:
        fh.seek(start)
        pos = start
        while pos < size:
            chunk = fh.read(min(_TAIL, size - pos))
            if not chunk:
                break
            i = chunk.find(b"\n")
            if i >= 0:
                return pos + i + 1
            pos += len(chunk)
    return start


@functools.lru_cache(maxsize=8)
def _ts_pattern(ts_field: str) -> re.Pattern[bytes]:
    return re.compile(rb'"' + re.escape(ts_field.encode()) + rb'"\s*:\s*(-?[0-9]+)\s*[,}]')


def timestamps(data: bytes, ts_field: str) -> list[int]:
    """The timestamps in the complete lines ``data``, in file order: the plan's scan.

    A fast scan for ``"<ts_field>": <integer>``; when some line has no such text (a blank or
    malformed line, an escaped key) each line is scanned alone and the ones without it are
    parsed. A malformed line may still add a value, which only ever lowers the minimum the
    watermark uses; the reader decides what is a record.

    >>> timestamps(b'{"id": "a", "ts": 5}\\n{"ts" : 3, "x": {"ts": 9}}\\nnot json\\n{"\\\\u0074s": 4}\\n', "ts")
    [5, 3, 9, 4]
    """
    rx = _ts_pattern(ts_field)
    found = rx.findall(data)
    if len(found) < data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1):
        found = []
        for line in data.split(b"\n"):
            hits = rx.findall(line)
            if hits:
                found += hits
            elif line.strip():
                ts = first_timestamp(line, ts_field)
                if ts is not None:
                    found.append(ts)
    return [v for v in map(int, found) if MIN_TIMESTAMP < v < MAX_TIMESTAMP]


def plausible_bounds(
    p: FileProgress, values: list[int], latest: int | None, skew: int | None
) -> tuple[int, int]:
    """The timestamps a batch's bytes of file ``p`` may carry, ``(lo, hi)``: a record outside is
    implausible — a dead letter (``implausible_timestamp``) that moves no promise and no
    watermark (MillWheel §4.5: a low watermark is only as true as the times it is built from).

    * *ahead*: at most ``skew`` after the latest time known before the batch: ``latest``
      (the newest plausible record of any file, the injector low watermark, and for a live
      source the wall clock) and the time in the file's name;
    * *behind*: at most ``skew`` before the earliest its own file is known by: the time in
      its name and its oldest plausible record;
    * a side with nothing known (the first bytes of a finite directory) is judged against
      the median of the batch's own timestamps ``values``, so one wrong record among many
      is out.

    The plan decides the window and keeps it in the offset (:attr:`FileProgress.bounds`):
    the readers of both backends, and a replay, judge the same bytes by the same window.

    >>> day = 86_400_000
    >>> plausible_bounds(FileProgress(time=1_700_000_000_000), [], None, day)
    (1699913600000, 1700086400000)
    >>> lo, hi = plausible_bounds(FileProgress(), [1_700_000_000_000, 1_700_000_000_000_000, 1_700_000_000_001], None, day)
    >>> lo <= 1_700_000_000_001 <= hi < 1_700_000_000_000_000
    True
    """
    if skew is None:
        return MIN_TIMESTAMP + 1, MAX_TIMESTAMP - 1
    ahead = [t for t in (latest, p.time) if t is not None]
    behind = [t for t in (p.time, p.oldest) if t is not None]
    middle = sorted(values)[len(values) // 2] if values and not (ahead and behind) else None
    top = max(ahead) if ahead else middle
    bottom = min(behind) if behind else middle
    hi = MAX_TIMESTAMP - 1 if top is None else min(top + skew, MAX_TIMESTAMP - 1)
    lo = MIN_TIMESTAMP + 1 if bottom is None else max(bottom - skew, MIN_TIMESTAMP + 1)
    return lo, hi


def latest_known(files: dict[str, Any], lw: int, now_ms: int | None) -> int | None:
    """The latest time an offset knows: the newest plausible record of any of its ``files``,
    the injector low watermark ``lw`` (when a time), and the wall clock ``now_ms`` (a live source)."""
    known = [
        t
        for t in (raw.get("newest") if isinstance(raw, dict) else None for raw in files.values())
        if t is not None
    ]
    if MIN_TIMESTAMP < lw < MAX_TIMESTAMP:
        known.append(lw)
    if now_ms is not None:
        known.append(now_ms)
    return max(known) if known else None


def _read_into(
    p: FileProgress,
    full: str,
    end: int,
    opts: ReadOptions,
    at_end: bool,
    latest: int | None,
    others: Others | None = None,
    plan_ids: PlanIds | None = None,
) -> None:
    """Scan bytes ``[p.pos, end)`` of a file into its progress: the plausible window of the
    bytes (:func:`plausible_bounds`), and of the plausible timestamps the batch's smallest,
    the oldest and newest so far, the disorder read, and (at the file's end) how far it reached."""
    with open(full, "rb") as fh:
        fh.seek(p.pos)
        data = fh.read(end - p.pos)
    values = timestamps(data, opts.ts_field)
    lo, hi = plausible_bounds(p, values, latest, opts.max_skew_ms)
    p.bounds = [lo, hi]
    if values and (min(values) < lo or max(values) > hi):
        values = [v for v in values if lo <= v <= hi]
    if values:
        low = min(values)
        p.low = low
        p.oldest = low if p.oldest is None else min(p.oldest, low)
        # the disorder read, over first deliveries only (a copy read again is no late record)
        newest, p.behind, p.early = measure(
            p, data, values, opts.ts_field, opts.id_field, full, others, plan_ids
        )
        p.newest = max(values) if newest is None else max(newest, max(values))
    if at_end:
        # progress counts once the reader is at the file's end (a live file being tailed); a
        # batch that stops inside a file because of the byte budget promises only the file's
        # time, so where batches are cut never makes records late. The last plausible
        # *record* (a parsed line, not the scan's guess) is how far it reached.
        tail = data[-_TAIL:].split(b"\n")
        for line in reversed(tail[1:] if len(data) > _TAIL else tail):
            last = first_timestamp(line, opts.ts_field)
            if last is not None and lo <= last <= hi:
                if p.reached is None or last > p.reached:
                    p.reached = last
                break
    p.pos = end


def _idle(opts: ReadOptions, now_ms: int, mtime: float) -> bool:
    return opts.idle_finish_ms is not None and now_ms - mtime * 1000 >= opts.idle_finish_ms


def _will_not_grow(name: str, opts: ReadOptions, present: set[str], idle: bool) -> bool:
    """A ``.done``/``_DONE`` marker, ``finite``, or no growth for ``idle_finish_ms`` (``idle``)."""
    return "_DONE" in present or f"{name}.done" in present or opts.finite or idle


def _complete(
    name: str,
    p: FileProgress,
    opts: ReadOptions,
    present: set[str],
    newest_start: int | None,
    idle: bool,
) -> bool:
    """Whether file ``name`` will not grow: complete before, :func:`_will_not_grow`, or a newer file (rotation)."""
    newer = (
        opts.finish_on_rotation
        and p.started is not None
        and newest_start is not None
        and newest_start > p.started
    )
    return p.complete or newer or _will_not_grow(name, opts, present, idle)


def plan_offset(start: dict[str, Any], opts: ReadOptions, now_ms: int) -> dict[str, Any]:
    """The next offset: how far to read each file in one batch, and the injector low watermark.

    * Files are read in name order up to ``max_bytes_per_batch`` bytes, complete lines
      only — but a file that will not grow (a marker, ``finite``, idle) to its size, its
      last line with or without a newline; a batch that has read nothing yet takes one
      line longer than the budget whole.
      The plan scans the bytes it assigns (:func:`timestamps`) into each file's
      :class:`FileProgress`.
    * A file is *complete* when a ``<name>.done`` or ``_DONE`` marker exists, or the source
      is ``finite``, or a newer file exists (rotation, when ``finish_on_rotation``), or it has
      not grown for ``idle_finish_ms``; *finished* once complete and read to its end.
    * The injector low watermark (Fig. 10) is the smallest :func:`promise` of the files
      not finished; a file whose promise is unknown holds it where it is;
      ``MAX_TIMESTAMP`` once every file is finished and the input is complete (``_DONE``
      or ``finite``). It never goes back.
    """
    prev = start["files"]
    path = opts.path
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    present = set(names)
    logs = [n for n in names if is_log_file(n)]
    files: dict[str, FileProgress] = {}
    stats: dict[str, tuple[int, float]] = {}
    budget = opts.max_bytes_per_batch
    latest = latest_known(prev, start["lw"], None if opts.finite else now_ms)
    read_before: dict[str, int] = {}
    plan_ids: PlanIds = {}
    for name in logs:
        full = os.path.join(path, name)
        st = os.stat(full)
        p = FileProgress.of(name, prev.get(name))
        # a file that will not grow — a marker, finite, idle — is read to its size: its last
        # line counts whether or not it ends in a newline; a growing file's half line waits,
        # and so does a rotated file's (its writer may still be finishing the line) until one
        # of those says the file is complete
        whole = _will_not_grow(name, opts, present, _idle(opts, now_ms, st.st_mtime))
        new_pos = p.pos
        caught_up = st.st_size <= p.pos  # read every complete line the file has now
        if st.st_size > p.pos and budget > 0:
            end = min(st.st_size, p.pos + budget)
            caught_up = end >= st.st_size
            new_pos = st.st_size if caught_up and whole else _last_newline(full, p.pos, end)
            if new_pos == p.pos and end < st.st_size:
                # the next line does not fit what is left of the budget: a batch that has
                # read nothing yet takes it whole, any other batch stops here
                if budget == opts.max_bytes_per_batch:
                    new_pos = _next_newline(full, p.pos, st.st_size)
                    if new_pos == p.pos and whole:
                        new_pos = st.st_size  # a complete file's last line, longer than the budget
                budget = 0 if new_pos == p.pos else budget - (new_pos - p.pos)
            else:
                budget -= new_pos - p.pos
        if new_pos > p.pos:

            def others(me: str = name) -> list[tuple[str, int]]:
                if not read_before:  # each file's position before this plan, once per plan
                    read_before.update(
                        (n, FileProgress.of(n, prev.get(n)).pos) for n in logs if n in prev
                    )
                return [
                    (
                        os.path.join(path, n),
                        files[n].pos if n in files else read_before.get(n, 0),
                    )
                    for n in logs
                    if n != me and (n in files or read_before.get(n, 0) > 0)
                ]

            _read_into(p, full, new_pos, opts, caught_up, latest, others, plan_ids)
        p.at_end = caught_up
        files[name] = p
        stats[name] = (st.st_size, st.st_mtime)
    newest_start = max((p.started for p in files.values() if p.started is not None), default=None)
    for name, p in files.items():
        size, mtime = stats[name]
        p.complete = _complete(name, p, opts, present, newest_start, _idle(opts, now_ms, mtime))
        p.finished = p.finished or (p.complete and p.pos >= size)
    for name in prev:  # a file that disappeared keeps its entry (finished)
        if name not in files:
            gone = FileProgress.of(name, prev[name])
            gone.complete = gone.finished = True
            files[name] = gone
    lateness = opts.lateness_ms
    promises = [promise(p, lateness) for p in files.values() if not p.finished]
    if any(x is None for x in promises):
        lw = start["lw"]  # a file whose promise is unknown holds the watermark
    elif promises:
        lw = min(x for x in promises if x is not None)
    elif "_DONE" in present or opts.finite:
        lw = MAX_TIMESTAMP
    else:  # every file finished, more may come: the newest file's time
        starts = [
            max(p.started, p.started if p.reached is None else p.reached)
            for p in files.values()
            if p.started is not None
        ]
        lw = max(starts, default=MIN_TIMESTAMP) - lateness
    return {"files": {name: p.to_json() for name, p in files.items()}, "lw": max(lw, start["lw"])}


def holding_file(offset: dict[str, Any], lateness_ms: int) -> str | None:
    """The unfinished file that holds the injector low watermark of ``offset``, if any.

    >>> a = FileProgress(pos=10, time=1_000, reached=1_500).to_json()
    >>> holding_file({"files": {"a.jsonl": a, "b.jsonl": FileProgress(pos=5, time=2_000).to_json()}, "lw": 1_500}, 0)
    'a.jsonl'
    """
    best: tuple[int, str] | None = None
    for name, p in progress_of(offset).items():
        if p.finished:
            continue
        held = promise(p, lateness_ms)
        if held is None:
            return name
        if best is None or held < best[0]:
            best = (held, name)
    return None if best is None else best[1]


def log_names(path: str) -> list[str]:
    """The log files of directory ``path``, in name order (none if it does not exist)."""
    return [n for n in sorted(os.listdir(path)) if is_log_file(n)] if os.path.isdir(path) else []


def unread(offset: dict[str, Any], opts: ReadOptions) -> list[str]:
    """Log files of the directory with bytes beyond what ``offset`` read.

    A finished directory's watermark is already ``MAX_TIMESTAMP``, so a file that lands
    in it later (a re-injection) holds nothing: "drained" must also mean nothing is left
    to read. In a complete directory every file is complete, so a last line without a
    newline is input still to read (a record or a dead letter), not a line being written.
    """
    progress = offset["files"]
    path = opts.path
    out = []
    for name in log_names(path):
        pos = FileProgress.of(name, progress.get(name)).pos
        size = os.stat(os.path.join(path, name)).st_size
        if size > pos:
            out.append(name)
    return out


def disorder(offset: dict[str, Any]) -> tuple[int, str] | None:
    """How far out of order the records read so far ran, and in which file, or ``None``.

    The most a record was behind the newest one read before it in its file, or before the
    time in its file's name: the ``lateness_ms`` that would have kept every record read
    on time (the injector's measured disorder; a run's summary and status report it).
    First deliveries only: a copy of a record read before is no late record to keep
    (``_logdisorder.py``).

    >>> a = FileProgress(time=1_000, oldest=400, behind=300).to_json()
    >>> disorder({"files": {"a.jsonl": a, "b.jsonl": FileProgress(behind=700).to_json()}, "lw": 0})
    (700, 'b.jsonl')
    """
    worst: tuple[int, str] | None = None
    for name, p in progress_of(offset).items():
        d = p.behind
        if p.early is not None:
            d = max(d, p.early)
        elif p.time is not None and p.oldest is not None:  # an offset from before ``early``
            d = max(d, p.time - p.oldest)
        if d > 0 and (worst is None or d > worst[0]):
            worst = (d, name)
    return worst


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes ``[begin, end)`` of one file to read in a batch, and the watermark they are sent under."""

    name: str
    begin: int
    end: int
    sender_watermark: int
    file_time: int
    #: the plausible timestamps of the range (:func:`plausible_bounds`): a record outside is a dead letter
    lo: int = MIN_TIMESTAMP + 1
    hi: int = MAX_TIMESTAMP - 1


def plan_ranges(start: dict[str, Any], end: dict[str, Any], lateness_ms: int) -> list[ByteRange]:
    """What a batch from ``start`` to ``end`` reads, in the order records are sent.

    A range is sent under the injector watermark already published (``start``), raised to
    its file's time minus ``lateness_ms`` (Fig. 10: a record older than the time in its
    file's name is late however the files are cut into batches) or, for a file without a
    time in its name, to the smallest timestamp in the range itself (a batch never makes
    its own records late) — but never above the :func:`promise` of any file still
    unfinished after the batch, or above the published watermark while a file's promise
    is unknown: as if files were sent one at a time, in time order.
    """
    after = progress_of(end)
    before = start["files"]
    cap = MAX_TIMESTAMP
    for p in after.values():
        if not p.finished:
            held = promise(p, lateness_ms)
            cap = min(cap, MIN_TIMESTAMP if held is None else held)
    out: list[ByteRange] = []
    for name in sorted(after):
        p = after[name]
        old = FileProgress.of(name, before.get(name)).pos
        if p.pos <= old:
            continue
        own = p.time - lateness_ms if p.time is not None else p.low
        swm = max(start["lw"], cap if own is None else min(own, cap))
        lo, hi = p.bounds or (MIN_TIMESTAMP + 1, MAX_TIMESTAMP - 1)
        out.append(ByteRange(name, old, p.pos, swm, p.time if p.time is not None else swm, lo, hi))
    out.sort(key=lambda r: (r.sender_watermark, r.file_time, r.name))
    return out
