"""The live status of a run: snapshots of every injector and computation, and how they are shown.

A :class:`Sampler` turns :meth:`SparkRuntime.status` into a :class:`Snapshot` — counters,
rates since the previous snapshot, the low watermark, its lag behind wall time and behind
the inputs, the last micro-batch's duration, and a row's ``warning`` (e.g. a stalled
log-file injector). The same snapshot feeds the terminal and the metrics endpoint
(``_metrics.py``), so they never disagree.

*Lag behind the inputs* is in event time: the newest record timestamp the injectors have
read (the "head" of the input, ``newest_event_ms`` in an injector's status) minus the
computation's low watermark. A replay of old data lags days behind wall time; this column
says how far the computation trails the data it has been given, during the replay and
after the injectors have finished (the authority's dashboard measures from the lowest
injector low watermark instead, which stops at +inf when the inputs are done).

Three ways to show it (:func:`display_for`):

* :class:`LiveTable` — a terminal: one table redrawn in place, messages printed above it;
* :class:`LogLines` — a log (no TTY): one compact line per interval, warnings once;
* :class:`Silent` — ``--quiet``.

>>> rows = (Row("queries", "injector", None, 1200, 0, None, None, 1_700_000_000_000, out_rate=600.0),
...         Row("Counter", "computation", 1200, 30, 2, 3, 1, 1_699_999_999_000, in_rate=600.0, event_lag_ms=1_000))
>>> print(compact_line(Snapshot(12.5, 1_700_000_100_000, rows)))
[  12.5s] queries out=1,200 (600/s) lw=2023-11-14 22:13:20 | Counter in=1,200 (600/s) out=30 lag_in=1.0s dup=3 late=1 dead=2
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, TextIO

from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, duration_text, timestamp_text, utc_text
from millwheel._runner import late_notes


@dataclass(frozen=True, slots=True)
class Row:
    """One injector or computation at one instant."""

    name: str
    #: ``"injector"`` or ``"computation"``
    kind: str
    #: records delivered to the computation (``None`` for injectors)
    records_in: int | None
    #: records published: productions of a computation, records of an injector
    records_out: int
    dead_letters: int
    duplicates: int | None
    late: int | None
    low_watermark: int
    timers_fired: int | None = None
    batches: int | None = None
    in_rate: float | None = None
    out_rate: float | None = None
    #: wall time minus the low watermark (ms); ``None`` when unknown or done
    lag_ms: int | None = None
    #: the newest event time the injectors read minus this low watermark (ms), computations only
    event_lag_ms: int | None = None
    #: the last micro-batch's duration, from Spark's progress
    batch_ms: int | None = None
    #: what the runtime warns about (e.g. a stalled log-file injector)
    warning: str | None = None
    #: a computation whose late records passed a small share: how many, and the fix (:func:`~millwheel._runner.late_notes`)
    late_warning: str | None = None
    #: how far out of order a log injector has read records, ms, and in which file (:func:`~millwheel._logfile.disorder`)
    disorder_ms: int | None = None
    disorder_file: str | None = None
    #: every counter of a computation (:class:`~millwheel._counters.StepMetrics`), ``None`` for injectors
    counters: dict[str, int] | None = None
    #: an online rescale of the computation under way, or its last one (``_online.py``)
    rescale: str | None = None
    #: the automatic policy's last decision for it, with its figures (``_autoscale.py``)
    autoscale: str | None = None
    #: an injector's records without an id field, given ``<file>:<offset>`` as id (a log-file injector)
    positional_ids: int | None = None
    #: an injector's rows at or after its ``end_ms``, left out (a ``SparkSource``)
    beyond_end: int | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every row of a run at one instant."""

    elapsed_s: float
    #: wall time of the snapshot (ms since the epoch)
    at_ms: int
    rows: tuple[Row, ...]

    @property
    def warnings(self) -> list[str]:
        """Every row's warnings: the runtime's, then the late records'."""
        return [w for r in self.rows for w in (r.warning, r.late_warning) if w]


def counts_of(rows: tuple[Row, ...] | list[Row]) -> dict[str, dict[str, int]]:
    """Each injector's counts of what it read that a run's summary reports (:func:`~millwheel._runner.injector_lines`)."""
    return {
        r.name: {
            k: v
            for k, v in (("positional_ids", r.positional_ids), ("beyond_end", r.beyond_end))
            if v
        }
        for r in rows
        if r.kind == "injector"
    }


def disorder_of(rows: tuple[Row, ...] | list[Row]) -> dict[str, tuple[int, str] | None]:
    """Each injector's measured disorder, from its row."""
    return {
        r.name: (r.disorder_ms, r.disorder_file or "?") if r.disorder_ms else None
        for r in rows
        if r.kind == "injector"
    }


def _with_late_warnings(topology: Any, rows: list[Row]) -> list[Row]:
    """A computation whose late records passed a small share warns, with what became of them
    and the fix: the words of the run's summary (:func:`~millwheel._runner.late_notes`)."""
    metrics = {
        r.name: {**(r.counters or {}), "late": r.late or 0, "records_in": r.records_in or 0}
        for r in rows
        if r.kind == "computation"
    }
    if not any(m["late"] for m in metrics.values()):
        return rows
    warns = {
        n.computation: n.text for n in late_notes(topology, metrics, disorder_of(rows)) if n.warning
    }
    return [replace(r, late_warning=warns[r.name]) if r.name in warns else r for r in rows]


class Sampler:
    """Turns a runtime's status into snapshots, with rates since the previous one."""

    def __init__(self, rt: Any, started: float | None = None) -> None:
        self.rt = rt
        self.started = time.monotonic() if started is None else started
        self.last: Snapshot | None = None
        self._prev: tuple[float, dict[str, tuple[int | None, int]]] | None = None

    def sample(self) -> Snapshot:
        mono, now = time.monotonic(), int(time.time() * 1000)
        status = self.rt.status()
        heads = [
            s["newest_event_ms"]
            for s in status.values()
            if s.get("kind") == "injector" and s.get("newest_event_ms") is not None
        ]
        head = max(heads) if heads else None
        rows = []
        for name, s in status.items():
            lw = s["low_watermark"]
            known = MIN_TIMESTAMP < lw < MAX_TIMESTAMP
            computation = s.get("kind") == "computation"
            event_lag = None
            if computation and known and head is not None:
                event_lag = max(0, head - lw)
            rows.append(
                Row(
                    name=name,
                    kind="computation" if computation else "injector",
                    records_in=s.get("records_in") if computation else None,
                    records_out=int(s.get("productions", s.get("records_out", 0))),
                    dead_letters=int(s.get("dead_letters", 0)),
                    duplicates=s.get("duplicates"),
                    late=s.get("late"),
                    low_watermark=lw,
                    timers_fired=s.get("timers_fired"),
                    batches=s.get("batches"),
                    lag_ms=now - lw if known else None,
                    event_lag_ms=event_lag,
                    batch_ms=_batch_ms(self.rt, name),
                    warning=s.get("warning"),
                    disorder_ms=s.get("disorder_ms"),
                    disorder_file=s.get("disorder_file"),
                    counters=s.get("counters") if computation else None,
                    rescale=s.get("rescale"),
                    autoscale=_decision_text(s.get("autoscale")),
                    positional_ids=s.get("positional_ids"),
                    beyond_end=s.get("beyond_end"),
                )
            )
        topology = getattr(self.rt, "topology", None)  # a test double may have none
        if topology is not None:
            rows = _with_late_warnings(topology, rows)
        counts = {r.name: (r.records_in, r.records_out) for r in rows}
        if self._prev is not None and mono > self._prev[0]:
            dt_s, before = mono - self._prev[0], self._prev[1]
            rows = [_with_rates(r, before.get(r.name), dt_s) for r in rows]
        self._prev = (mono, counts)
        self.last = Snapshot(round(mono - self.started, 1), now, tuple(rows))
        return self.last


def _decision_text(d: dict[str, Any] | None) -> str | None:
    """An autoscale decision as the status shows it."""
    if not d:
        return None
    at = utc_text(d["at_ms"], "%H:%M:%S")
    outcome = f"; {d['outcome']}" if d.get("outcome") else ""
    return f"{d['action']} {d['from']} -> {d['to']} at {at} UTC: {d['reason']}{outcome}"


def _with_rates(row: Row, before: tuple[int | None, int] | None, dt_s: float) -> Row:
    if before is None:
        return row
    rin = (
        None
        if row.records_in is None or before[0] is None
        else max(0.0, (row.records_in - before[0]) / dt_s)
    )
    return replace(row, in_rate=rin, out_rate=max(0.0, (row.records_out - before[1]) / dt_s))


def _batch_ms(rt: Any, name: str) -> int | None:
    """The last micro-batch's duration of the query behind ``name``, from Spark's progress."""
    holder = rt.computations.get(name) or rt.injectors.get(name)
    query = getattr(holder, "query", None)
    if query is None:
        return None
    try:
        progress = query.lastProgress
    except Exception:  # noqa: BLE001 - a query stopping under us
        return None
    if not progress:
        return None
    duration = (progress.get("durationMs") or {}).get("triggerExecution")
    return int(duration) if duration is not None else None


# ---- formatting ----------------------------------------------------------------------------
def count_text(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


def rate_text(r: float | None) -> str:
    """A rate for people.

    >>> [rate_text(x) for x in (None, 0.0, 12.3, 4_560.0, 1_234_567.0)]
    ['', '0', '12', '4.6k', '1.2M']
    """
    if r is None:
        return ""
    if r >= 1e6:
        return f"{r / 1e6:.1f}M"
    if r >= 1e3:
        return f"{r / 1e3:.1f}k"
    return f"{r:.0f}"


_COLUMNS = (
    ("name", "<", 18),
    ("in", ">", 11),
    ("in/s", ">", 6),
    ("out", ">", 11),
    ("out/s", ">", 6),
    ("late", ">", 6),
    ("dup", ">", 6),
    ("dead", ">", 6),
    ("low watermark (UTC)", "<", 19),
    ("lag", ">", 8),
    ("lag (inputs)", ">", 12),
)


def table_lines(snapshot: Snapshot, *, late: bool = True) -> list[str]:
    """The status as a table: a header, one line per row, then its warnings (``late=False``:
    not the late records', which the end of a run says in its summary, ``print_finish``)."""
    lines = [" ".join(f"{title:{align}{width}}" for title, align, width in _COLUMNS).rstrip()]
    for r in snapshot.rows:
        cells = (
            r.name,
            count_text(r.records_in),
            rate_text(r.in_rate),
            count_text(r.records_out),
            rate_text(r.out_rate),
            count_text(r.late),
            count_text(r.duplicates),
            count_text(r.dead_letters),
            timestamp_text(r.low_watermark),
            duration_text(r.lag_ms),
            duration_text(r.event_lag_ms) if r.kind == "computation" else "",
        )
        lines.append(
            " ".join(
                f"{c:{align}{width}}" for c, (_, align, width) in zip(cells, _COLUMNS, strict=True)
            ).rstrip()
        )
    lines += [f"{r.name}: {r.rescale}" for r in snapshot.rows if r.rescale]
    lines += [f"{r.name}: autoscale {r.autoscale}" for r in snapshot.rows if r.autoscale]
    lines += [
        f"warning: {w}"
        for w in (snapshot.warnings if late else [r.warning for r in snapshot.rows if r.warning])
    ]
    return lines


def compact_line(snapshot: Snapshot) -> str:
    """The status as one line (for logs): counters, rates, low watermark or lag; zeros left out."""
    parts = []
    for r in snapshot.rows:
        words = [r.name]
        if r.records_in is not None:
            words.append(
                f"in={r.records_in:,}"
                + (f" ({rate_text(r.in_rate)}/s)" if r.in_rate is not None else "")
            )
            words.append(f"out={r.records_out:,}")
        else:
            words.append(
                f"out={r.records_out:,}"
                + (f" ({rate_text(r.out_rate)}/s)" if r.out_rate is not None else "")
            )
        if r.event_lag_ms is not None:
            words.append(f"lag_in={duration_text(r.event_lag_ms)}")
        else:
            words.append(f"lw={timestamp_text(r.low_watermark)}")
        for label, v in (("dup", r.duplicates), ("late", r.late), ("dead", r.dead_letters)):
            if v:
                words.append(f"{label}={v:,}")
        if r.rescale and "(done" not in r.rescale and ": done" not in r.rescale:
            words.append(f"[{r.rescale}]")
        parts.append(" ".join(words))
    return f"[{snapshot.elapsed_s:6.1f}s] " + " | ".join(parts)


# ---- displays --------------------------------------------------------------------------------
class Silent:
    """``--quiet``: nothing while running."""

    def show(self, snapshot: Snapshot) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class LogLines:
    """No terminal: one compact line per interval; a warning once, when it first appears."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.warned: set[str] = set()

    def show(self, snapshot: Snapshot) -> None:
        print(compact_line(snapshot), file=self.out, flush=True)
        for w in snapshot.warnings:
            if w not in self.warned:
                self.warned.add(w)
                print(f"warning: {w}", file=self.out, flush=True)

    def message(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def close(self) -> None:
        pass


class LiveTable:
    """A terminal: one table redrawn in place; messages go above it and the table follows."""

    def __init__(self, out: TextIO, title: str = "") -> None:
        self.out = out
        self.title = title
        self.drawn = 0
        self.last: list[str] = []

    def _width(self) -> int:
        return max(40, shutil.get_terminal_size((120, 24)).columns - 1)

    def _erase(self) -> str:
        # to the start of the first drawn line, then clear to the end of the screen
        return (f"\x1b[{self.drawn}F" if self.drawn else "\r") + "\x1b[J"

    def _draw(self, lines: list[str]) -> None:
        width = self._width()
        text = self._erase() + "".join(line[:width] + "\n" for line in lines)
        self.out.write(text)
        self.out.flush()
        self.drawn = len(lines)
        self.last = lines

    def show(self, snapshot: Snapshot) -> None:
        head = (
            f"{self.title} · {snapshot.elapsed_s:.1f}s"
            if self.title
            else f"{snapshot.elapsed_s:.1f}s"
        )
        self._draw([head, *table_lines(snapshot)])

    def message(self, text: str) -> None:
        self.out.write(self._erase() + text + "\n")
        self.drawn = 0
        if self.last:
            self._draw(self.last)

    def close(self) -> None:
        self.drawn = 0


Display = Silent | LogLines | LiveTable


def display_for(
    quiet: bool, out: TextIO | None = None, title: str = "", interactive: bool | None = None
) -> Display:
    """The display for ``out`` (default stderr): a live table on a terminal, log lines elsewhere."""
    out = sys.stderr if out is None else out
    if quiet:
        return Silent()
    if interactive is None:
        interactive = out.isatty()
    return LiveTable(out, title) if interactive else LogLines(out)
