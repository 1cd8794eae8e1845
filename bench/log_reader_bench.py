"""The two log-file readers side by side on a backlog (a command, not a test).

    .venv/bin/python bench/log_reader_bench.py --lines 1000000 --reps 2

``RuntimeSettings.log_reader``: ``"driver"`` (a thread of the driver, ``_logreader.py``)
against ``"spark"`` (a streaming query over a Python data source, ``_logfiles.py``), each
reading the same directory of JSON-lines logs as a finished backlog into a fresh run
directory and publishing it, alternating, in one Spark session (``local[2]``, the bundled
sample's JVM options). Only the injector runs (``RuntimeSettings.only``); its rows are
keyed for the topology's one consumer, as in a real run. A figure is the wall time from
the runtime's start to every record published (the injector drained), and the process
tree's CPU seconds (driver, JVM, Python workers) over it; the first repetition of each
reader is a warm-up and not counted. Every run's published rows are counted against the
lines written. Figures go to stdout and ``bench/results/log_reader.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _spark_bench import tree_cpu, write_results  # noqa: E402

from millwheel import Computation, LogFileSource, Topology  # noqa: E402

READERS = ("driver", "spark")


class Count(Computation):
    def process_record(self, record: Any) -> None:
        self.state.set((self.state.get(0) or 0) + 1)


def write_logs(directory: Path, lines: int, files: int, seed: int = 1) -> None:
    """``lines`` JSON lines over ``files`` files named by time, 1,000 keys, a little disorder."""
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    start = 1_767_261_600_000
    per = -(-lines // files)
    for f in range(files):
        first = start + f * per
        with (directory / f"events_{first}.jsonl").open("w") as fh:
            for i in range(f * per, min(lines, (f + 1) * per)):
                ts = start + i - rng.randint(0, 500)
                fh.write(
                    json.dumps({"id": f"e{i}", "ts": ts, "key": f"k{rng.randrange(1000)}", "n": i})
                    + "\n"
                )


def _cpu_since(before: dict[int, float]) -> float:
    """CPU seconds the process tree spent since ``before`` (a process that ended meanwhile
    is not counted: Spark keeps its workers for the session)."""
    now = tree_cpu(os.getpid())
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())


def run_once(spark: Any, logs: Path, work: Path, reader: str, lines: int) -> dict[str, Any]:
    from millwheel.runtime import RuntimeSettings, SparkRuntime
    from millwheel.runtime._streams import FileStreamLog

    t = Topology("backlog")
    t.injector("logs", LogFileSource(logs, id_field="id", ts_field="ts", finite=True))
    t.computation(Count, inputs={"logs": lambda r: r.value["key"]})
    run = work / f"run-{reader}-{time.monotonic_ns()}"
    settings = RuntimeSettings(intervals=4, only=("logs",), log_reader=reader, poll_ms=20)
    cpu0, t0 = tree_cpu(os.getpid()), time.monotonic()
    rt = SparkRuntime(t, str(run), settings, spark=spark)
    rt.start()
    try:
        injector = rt.injectors["logs"]
        while not injector.drained():
            rt.poll()
            time.sleep(0.02)
        took = time.monotonic() - t0
        cpu = _cpu_since(cpu0)
    finally:
        rt.stop()
    published = injector.records_out
    log = FileStreamLog.at(str(run))
    files = len(log.files("logs", "logs"))
    assert published == lines, f"{reader}: {published} records published, {lines} written"
    return {"wall_s": round(took, 2), "cpu_s": round(cpu, 2), "files": files}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--files", type=int, default=100)
    p.add_argument("--reps", type=int, default=2, help="counted runs per reader (after a warm-up)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "log_reader.json"))
    args = p.parse_args()

    from millwheel.runtime._session import spark_session
    from topologies.zeitgeist import SAMPLE_SPARK_CONF

    with tempfile.TemporaryDirectory(prefix="log-reader-bench-") as tmp:
        work = Path(tmp)
        logs = work / "logs"
        write_logs(logs, args.lines, args.files)
        size = sum(f.stat().st_size for f in logs.iterdir())
        spark = spark_session("local[2]", conf=dict(SAMPLE_SPARK_CONF))
        runs: dict[str, list[dict[str, Any]]] = {r: [] for r in READERS}
        for rep in range(args.reps + 1):
            for reader in READERS:
                r = run_once(spark, logs, work, reader, args.lines)
                r["warm_up"] = rep == 0
                runs[reader].append(r)
                print(f"rep {rep} {reader:>6}: {r}", flush=True)
        spark.stop()
    summary = {}
    for reader, rs in runs.items():
        counted = [r for r in rs if not r["warm_up"]]
        wall = statistics.median(r["wall_s"] for r in counted)
        cpu = statistics.median(r["cpu_s"] for r in counted)
        summary[reader] = {
            "wall_s": wall,
            "cpu_s": cpu,
            "lines_per_s": round(args.lines / wall),
            "files_published": counted[-1]["files"],
        }
        print(f"{reader:>6}: {wall:.2f} s wall, {cpu:.2f} CPU s, {args.lines / wall:,.0f} lines/s")
    results = {
        "what": "a finished backlog read and published by each log reader (RuntimeSettings.log_reader), "
        "injector only, local[2], alternating; seconds from the runtime's start to drained",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "lines": args.lines,
        "files": args.files,
        "bytes": size,
        "summary": summary,
        "runs": runs,
    }
    write_results(Path(args.out), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
