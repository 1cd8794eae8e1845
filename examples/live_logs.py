"""A live run over growing, rotating log files, as a server's logger writes them (MillWheel Fig. 10).

Shared by ``tests/runtime/test_live_logs.py`` (what must hold) and
``bench/live_logs_bench.py`` (how soon windows come out on this machine): one-second
windows counted per key, a writer that appends records stamped with wall time and opens a
new file every ``rotate_s`` seconds, and the loop that drives a runtime while it writes.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from millwheel import Computation, LogFileSource, Record, Timer, Topology


class Windows(Computation):
    """Counts per key and one-second window; a window comes out when the low watermark passes its end."""

    def process_record(self, record: Record) -> None:
        start = record.timestamp // 1_000 * 1_000
        counts = self.state.get({})
        counts[start] = counts.get(start, 0) + 1
        self.state.set(counts)
        self.set_timer(str(start), start + 1_000)

    def process_timer(self, timer: Timer) -> None:
        counts = self.state.get({})
        start = timer.timestamp - 1_000
        self.produce("windows", {"key": self.key, "start": start, "count": counts.pop(start, 0)})
        self.state.set(counts or None)


def topology(logs: Path, lateness_ms: int) -> Topology:
    """``events`` from the log directory (no ``.done`` markers: rotation finishes a file), counted by ``Windows``."""
    t = Topology("live")
    t.injector("events", LogFileSource(logs, lateness_ms=lateness_ms, idle_finish_ms=None))
    t.computation(Windows, inputs={"events": lambda r: r.value["key"]}, outputs=["windows"])
    return t


def writer(directory: Path, stop: threading.Event, written: list[int], rotate_s: float) -> None:
    """Appends a record stamped with wall time every 10 ms (three keys), a new file every ``rotate_s``."""
    fh = None
    opened = 0.0
    i = 0
    while not stop.is_set():
        now = time.time()
        if fh is None or now - opened >= rotate_s:
            if fh is not None:
                fh.close()
            opened = now
            fh = open(directory / f"events-{int(now * 1000)}.jsonl", "a", buffering=1)  # noqa: SIM115
        ts = int(time.time() * 1000)
        fh.write(json.dumps({"id": f"e{i}", "ts": ts, "key": f"k{i % 3}"}) + "\n")
        written.append(ts)
        i += 1
        time.sleep(0.01)
    if fh is not None:
        fh.close()


def drive(
    rt: Any, logs: Path, live_s: float, rotate_s: float, drain_s: float = 120.0
) -> tuple[list[int], float]:
    """Start ``rt``, write for ``live_s`` seconds while polling it, declare the input complete
    (``_DONE``) and poll until drained (at most ``drain_s``). Returns the timestamps written
    and the wall time of ``_DONE``; ``rt`` is stopped either way."""
    stop, written = threading.Event(), []
    thread = threading.Thread(target=writer, args=(logs, stop, written, rotate_s))
    rt.start()
    thread.start()
    try:
        started = time.monotonic()
        while time.monotonic() - started < live_s:
            rt.poll()
            time.sleep(0.05)
        stop.set()
        thread.join()
        done_at = time.time()
        (logs / "_DONE").write_text("")
        deadline = time.monotonic() + drain_s
        while not rt.drained() and time.monotonic() < deadline:
            rt.poll()
            time.sleep(0.05)
    finally:
        stop.set()
        rt.stop()
    return written, done_at


def published_windows(rt: Any) -> dict[tuple[str, int], float]:
    """Each ``(key, window start)`` that came out, with the wall time its file was published."""
    import pyarrow.parquet as pq

    from millwheel.runtime.rundir import table_records

    visible: dict[tuple[str, int], float] = {}
    loc = rt.streams.location("windows", "Windows")
    for (stream, name), at in rt.computations["Windows"].outbox.published_at.items():
        if stream == "windows":
            for r in table_records(pq.read_table(loc.child(name).path)):
                visible[(r.value["key"], r.value["start"])] = at
    return visible
