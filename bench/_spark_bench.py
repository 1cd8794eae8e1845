"""What the Spark runtime benches share (``runtime_bench``, ``state_bench``, ``latency_bench``).

Not a benchmark: a finished injector, running a topology while collecting Spark's
progress reports, and writing a results file.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

from millwheel import MAX_TIMESTAMP, Source, SourceBatch
from millwheel.runtime import default_intervals


class Finished(Source):
    """An injector whose records are already in its stream log: its watermark is +inf."""

    def batches(self, injector: str = "injector", stream: str = "records"):
        yield SourceBatch([], MAX_TIMESTAMP)


def collect(rt: Any, progress: dict[str, dict[int, dict]]) -> None:
    """Add the queries' recent progress reports to ``progress`` (computation -> batch id -> report)."""
    for name, c in rt.computations.items():
        if c.query is not None:
            for p in c.query.recentProgress:
                progress.setdefault(name, {})[p["batchId"]] = p


#: seconds between two reads of the queries' progress reports during a run: a read is a py4j
#: walk of up to 100 reports (Spark's ``numRecentProgressUpdates``) per query, a few tens
#: of ms of the driver's CPU, which on every poll (20 a second) slowed the runs it measured
COLLECT_EVERY_S = 2.0


def read_input(p: dict) -> bool:
    """Whether a progress report's batch read input: rows Spark counted, or files a source
    moved past that Spark did not read itself (an Arrow-mapping query's tasks read their records
    from the batch's files, ``plans/arrow.py``, and its batch runs no scan at all)."""
    return p["numInputRows"] > 0 or any(
        s.get("startOffset") != s.get("endOffset") for s in p.get("sources") or []
    )


def run_collecting(rt: Any, *, timeout_s: float, poll_s: float) -> dict[str, dict[int, dict]]:
    """Start ``rt``, poll it until drained (or ``timeout_s``), stop it; the queries' progress reports."""
    progress: dict[str, dict[int, dict]] = {}
    started = collected = time.monotonic()
    rt.start()
    try:
        while not rt.drained() and time.monotonic() - started < timeout_s:
            rt.poll()
            if time.monotonic() - collected >= COLLECT_EVERY_S:
                collect(rt, progress)
                collected = time.monotonic()
            time.sleep(poll_s)
    finally:
        collect(rt, progress)
        rt.stop()
    return progress


ROOT = Path(__file__).resolve().parent.parent


def in_repo(text: str) -> str:
    """``text`` with this checkout's and the standard library's absolute paths made relative
    (``<stdlib>/...``): results name no machine's directories."""
    stdlib = os.path.dirname(os.__file__)
    return text.replace(f"{ROOT}/", "").replace(str(ROOT), ".").replace(stdlib, "<stdlib>")


def write_results(path: Path, results: dict[str, Any]) -> None:
    """``results`` with the machine and its load, as JSON at ``path``."""
    results = {
        "machine": {
            "python": platform.python_version(),
            "cores": os.cpu_count(),
            "load_avg_at_end": os.getloadavg(),
        },
        **results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(in_repo(json.dumps(results, indent=2, default=str)) + "\n")
    print(f"written to {path}")


def data_args(p: Any, *, records: int, keys: int, files: int) -> None:
    """The data and run arguments the throughput benches share (``--records`` ... ``--reps``)."""
    p.add_argument("--records", type=int, default=records)
    p.add_argument("--keys", type=int, default=keys)
    p.add_argument("--files", type=int, default=files)
    p.add_argument("--per-trigger", type=int, default=10)
    p.add_argument(
        "--intervals",
        type=int,
        default=default_intervals("local[2]"),
        help="key intervals per computation (default: the runtime's on local[2], 2 per core)",
    )
    p.add_argument("--reps", type=int, default=2)


def link_stream(files: Path, root: Path, stream: str, producer: str) -> None:
    """A fresh run directory ``root`` whose stream ``stream`` of ``producer`` holds ``files``'s
    Parquet files (hard links: the same bytes for every run)."""
    shutil.rmtree(root, ignore_errors=True)
    dest = root / "streams" / stream / producer
    dest.mkdir(parents=True)
    for f in files.iterdir():
        if f.suffix == ".parquet":
            os.link(f, dest / f.name)


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds of process ``root`` and of each of its descendants, by pid (from ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rindex(")") + 2 :].split()
            kids.setdefault(int(rest[1]), []).append(int(d))
            cpu[int(d)] = (int(rest[11]) + int(rest[12])) / tick
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in cpu:
            out[pid] = cpu[pid]
        todo += kids.get(pid, [])
    return out
