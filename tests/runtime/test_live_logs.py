"""A live run over growing, rotating log files, with no ``.done`` markers (MillWheel Fig. 10).

A writer appends records stamped with wall time to a file and opens a new one every few
seconds, as a server's logger does. The injector low watermark follows read progress
(the newest timestamp read minus the declared disorder), and rotation finishes the old
file, so one-second windows come out while the files are still being written, not when they
are finished. How many seconds after they close is a figure of the machine, measured by
``bench/live_logs_bench.py``, not asserted here.
"""

from __future__ import annotations

import json
import threading
import time

import pyarrow.parquet as pq
import pytest

from millwheel import Computation, LogFileSource, Record, Timer, Topology
from millwheel._codec import decode_value
from millwheel.runtime import RuntimeSettings, SparkRuntime

pytestmark = pytest.mark.spark

LATENESS_MS = 300
ROTATE_S = 4.0
LIVE_S = 30.0


class Windows(Computation):
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


def _writer(directory, stop: threading.Event, written: list) -> None:
    fh = None
    opened = 0.0
    i = 0
    while not stop.is_set():
        now = time.time()
        if fh is None or now - opened >= ROTATE_S:
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


def test_windows_come_out_seconds_after_they_close_while_files_are_still_written(tmp_path, spark):
    logs = tmp_path / "logs"
    logs.mkdir()
    t = Topology("live")
    t.injector("events", LogFileSource(logs, lateness_ms=LATENESS_MS, idle_finish_ms=None))
    t.computation(Windows, inputs={"events": lambda r: r.value["key"]}, outputs=["windows"])
    rt = SparkRuntime(t, str(tmp_path / "run"), RuntimeSettings(intervals=2, poll_ms=50, heartbeat_ms=100), spark=spark)
    stop, written = threading.Event(), []
    writer = threading.Thread(target=_writer, args=(logs, stop, written))
    rt.start()
    writer.start()
    try:
        started = time.monotonic()
        while time.monotonic() - started < LIVE_S:
            rt.poll()
            time.sleep(0.05)
        stop.set()
        writer.join()
        done_at = time.time()
        (logs / "_DONE").write_text("")
        deadline = time.monotonic() + 120
        while not rt.drained() and time.monotonic() < deadline:
            rt.poll()
            time.sleep(0.05)
    finally:
        stop.set()
        rt.stop()
    assert rt.drained()

    outbox = rt.computations["Windows"].outbox
    visible: dict[tuple[str, int], float] = {}
    loc = rt.streams.location("windows", "Windows")
    for (stream, name), at in outbox.published_at.items():
        if stream != "windows":
            continue
        table = pq.read_table(loc.child(name).path, columns=["value"])
        for raw in table.column("value").to_pylist():
            v = decode_value(raw)
            visible[(v["key"], v["start"])] = at
    # every record is counted once
    assert sum(v for v in _counts(rt).values()) == len(written)
    # windows that closed well before the input was declared complete: without a watermark
    # that follows read progress, none of them could come out before ``_DONE``
    closed_live = [k for k in visible if (k[1] + 1_000) / 1000 < done_at - 10]
    assert len(closed_live) >= 3 * 10  # three keys, most of the live period
    emitted_live = [k for k in closed_live if visible[k] < done_at]
    assert len(emitted_live) >= 0.8 * len(closed_live)
    # how soon they come out depends on the machine: bench/live_logs_bench.py measures it


def _counts(rt: SparkRuntime) -> dict:
    return {(v["key"], v["start"]): v["count"] for v in rt.values("windows")}
