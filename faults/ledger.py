"""The *ledger*: a checkable topology over generated Zeitgeist-like input whose answer is known.

Input (:func:`write_input`): JSON-lines query events, one file per second of event time
(``queries_<ms>.jsonl``, sorted by timestamp inside a file), ids ``e<n>``, queries drawn
from a skewed (Zipf-like) distribution as in Zeitgeist, and three kinds of bad input
planted at known places:

* **duplicates** — a line sent twice (the same id): exactly-once delivery drops the copy;
* **malformed lines** — broken JSON or a missing timestamp: a ``malformed_line`` dead letter
  each, with its file and byte offset;
* **late records** — ids ``l<n>``, five seconds older than their file's time, so behind the
  sender watermark however files are cut into batches (``docs/concepts.md``): dropped
  and counted (``late_dropped``).

Topology (:func:`build`), two stages so that a fault can land on either side of a stream::

    queries ──► LedgerWindow (key: query) ──windows──► LedgerTally (key: window) ──► ledger

``LedgerWindow`` keeps the ids of each one-second window and emits them once, from a
low-watermark timer at the window's end, with a per-key sequence number and the low
watermark the timer fired under; it also keeps a wall-time timer per key whose firings go
to ``wall_fires`` (so a wall-clock jump shows). ``LedgerTally`` re-emits each window
under its own per-window sequence number. The **expected answer** is a function of the
input alone (:func:`expected`): every valid, non-late id appears in exactly one
``ledger`` record, in the window of its timestamp and under its query; that is what
``millwheel check`` verifies (``faults/check.py``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from millwheel import (
    Computation,
    LogFileSource,
    Record,
    Source,
    SourceBatch,
    TimeDomain,
    Timer,
    Topology,
)

WINDOW_MS = 1_000
WALL_MS = 5_000
START_MS = 1_700_000_000_000
LATE_BY_MS = 5_000
#: the streams the checker reads
WINDOWS, LEDGER, WALL_FIRES = "windows", "ledger", "wall_fires"


class LedgerWindow(Computation):
    """Keyed by query: the ids of each window, emitted once by a low-watermark timer at its end."""

    def process_record(self, record: Record) -> None:
        start = record.timestamp // WINDOW_MS * WINDOW_MS
        st = self.state.get() or {"open": {}, "seq": 0, "wall": 0}
        st["open"].setdefault(start, []).append(record.id)
        self.state.set(st)
        self.set_timer(f"w{start}", start + WINDOW_MS)
        self.set_timer("wall", self.now + WALL_MS, TimeDomain.WALL_TIME)

    def process_timer(self, timer: Timer) -> None:
        st = self.state.get()
        if timer.domain == TimeDomain.WALL_TIME:
            st["wall"] += 1
            self.state.set(st)
            self.produce(
                WALL_FIRES,
                {"key": self.key, "due": timer.timestamp, "now": self.now, "n": st["wall"]},
                timestamp=timer.timestamp,
            )
            return
        start = timer.timestamp - WINDOW_MS
        ids = sorted(st["open"].pop(start, []))
        value = {
            "key": self.key,
            "window_start": start,
            "ids": ids,
            "seq": st["seq"],
            "fired_lw": self.low_watermark,
        }
        self.produce(WINDOWS, value, timestamp=timer.timestamp)
        st["seq"] += 1
        self.state.set(
            st
        )  # the sequence number is kept for good: a key's windows are numbered 0, 1, 2, ...


class LedgerTally(Computation):
    """Keyed by window: each query's window, re-emitted under this key's own sequence number."""

    def process_record(self, record: Record) -> None:
        v = record.value
        seq = self.state.get(0)
        self.state.set(seq + 1)
        self.produce(
            LEDGER,
            {
                "key": v["key"],
                "window_start": v["window_start"],
                "ids": v["ids"],
                "seq": seq,
                "window_seq": v["seq"],
            },
        )


class InDriver(Source):
    """A :class:`~millwheel.LogFileSource` read by the driver itself, batch by batch.

    The same reading plan, sender watermarks and dead letters as the Spark reader (both walk
    ``millwheel/_logfile.py``), but without the Python process Spark starts for a streaming
    data source: on a heavily loaded machine that process often misses Spark's 10 s to
    connect back (``docs/reliability.md``). Any source that is not a ``LogFileSource`` runs in
    the driver (``runtime/_injectors.py``, ``SourceInjector``).
    """

    def __init__(self, inner: LogFileSource) -> None:
        self.inner = inner

    def batches(self, injector: str = "injector", stream: str = "records") -> Iterator[SourceBatch]:
        return self.inner.batches(injector, stream)


def build(
    data: str,
    *,
    max_bytes: int = 64 << 20,
    name: str = "ledger",
    in_driver: bool = False,
    finite: bool = True,
) -> Topology:
    """The ledger topology over the log directory ``data`` (finite: it drains).

    ``in_driver``: the driver reads the logs (:class:`InDriver`) instead of a Spark query.
    ``finite=False``: the directory is complete once ``_DONE`` appears, so a test can write
    its input in chunks while the run goes on (remove the ``_DONE`` :func:`write_input`
    leaves until the last chunk).
    """
    t = Topology(name)
    logs = LogFileSource(data, finite=finite, max_bytes_per_batch=max_bytes)
    t.injector("queries", InDriver(logs) if in_driver else logs)
    t.computation(
        LedgerWindow, inputs={"queries": lambda r: r.value["query"]}, outputs=[WINDOWS, WALL_FIRES]
    )
    t.computation(
        LedgerTally, inputs={WINDOWS: lambda r: r.value["window_start"]}, outputs=[LEDGER]
    )
    t.sink(LEDGER)
    t.sink(WALL_FIRES)
    return t


@dataclass
class Planted:
    """What :func:`write_input` wrote, for the record (the checker re-reads the files themselves)."""

    records: int = 0
    duplicates: int = 0
    malformed: int = 0
    late: int = 0
    files: int = 0
    keys: set[str] = field(default_factory=set, repr=False)


def write_input(
    data: Path,
    n: int,
    *,
    seed: int,
    files: int | None = None,
    keys: int = 2_000,
    first: int = 0,
    dup_rate: float = 0.01,
    malformed_rate: float = 0.001,
    late_rate: float = 0.002,
    done: bool = True,
) -> Planted:
    """Write ``n`` valid query events (ids ``e<first>..``) plus planted bad input; ``_DONE`` at the end.

    ``first`` continues the ids and the files' times of an earlier call (input written in
    chunks while a run reads it). About 5,000 events per one-second file unless ``files``
    is given. ``done=False``: no ``_DONE`` (more input may follow).
    """
    rng = random.Random(seed)
    data.mkdir(parents=True, exist_ok=True)
    files = files or max(1, n // 5_000)
    per = n // files
    out = Planted(files=files)
    weights = [1 / (k + 1) ** 1.1 for k in range(keys)]  # Zipf-like, as search queries are
    names = [f"q{k}" for k in range(keys)]
    file0 = first // per if per else 0
    for f in range(files):
        t0 = START_MS + (file0 + f) * WINDOW_MS
        count = per if f < files - 1 else n - per * (files - 1)
        stamps = sorted(t0 + rng.randrange(WINDOW_MS) for _ in range(count))
        queries = rng.choices(names, weights, k=count)
        lines: list[str] = []
        for i, (ts, q) in enumerate(zip(stamps, queries, strict=True)):
            line = json.dumps({"id": f"e{first + out.records}", "ts": ts, "query": q})
            out.records += 1
            out.keys.add(q)
            lines.append(line)
            roll = rng.random()
            if roll < dup_rate:
                lines.append(line)
                out.duplicates += 1
            elif roll < dup_rate + malformed_rate:
                lines.append(
                    rng.choice(
                        [
                            '{"id": "broken", "ts": ',
                            json.dumps({"id": f"m{first + i}", "query": q}),
                            "[1, 2]",
                        ]
                    )
                )
                out.malformed += 1
            elif roll < dup_rate + malformed_rate + late_rate:
                lines.append(
                    json.dumps({"id": f"l{first + out.records}", "ts": t0 - LATE_BY_MS, "query": q})
                )
                out.late += 1
        (data / f"queries_{t0}.jsonl").write_text("\n".join(lines) + "\n")
    if done:
        (data / "_DONE").write_text("")
    return out
