"""Where a run's micro-batches spend their time, stage by stage (a command, not a test).

    PYTHONPATH=$PWD:$PWD/bench .venv/bin/python bench/stage_timeline.py [--variant mw_col_strong] [--out FILE]

Runs ``bench/runtime_bench.py``'s windowed count once to warm up and once measured, on a
session with Spark's UI, and reads each Spark stage of the measured run from Spark's REST
API: when it started and ended (seconds from the run's start), its tasks' run time and the
JVM's CPU time in them. A micro-batch of the default mapping is two stages (the map
side's read and shuffle, then the stateful operator with the Python step), so the stateful
stage's time and JVM CPU per batch show whether a batch's cost grows with the state held
(docs/performance.md, "Held ids beside the state row"). Variants: ``mw_col_strong``,
``mw_col_weak`` (the columnar counter with and without exactly-once), ``native``.
Figures go to stdout and ``--out`` (default ``bench/results/stage_timeline.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import runtime_bench as rb  # noqa: E402
from _spark_bench import write_results  # noqa: E402


def _at(text: str) -> float:
    return (
        datetime.strptime(text.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")
        .replace(tzinfo=timezone.utc)
        .timestamp()
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--variant", default="mw_col_strong", choices=["mw_col_strong", "mw_col_weak", "native"]
    )
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--files", type=int, default=100)
    p.add_argument("--intervals", type=int, default=16)
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench"))
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "stage_timeline.json"))
    args = p.parse_args()

    from millwheel.runtime import spark_session

    spark = spark_session("local[2]", ui=True)
    data = Path(args.work) / f"{args.records}-{args.keys}-{args.files}"
    files, _ = rb.make_data(data, args.records, args.keys, args.files, args.intervals)
    work = Path(tempfile.mkdtemp(prefix="stages-"))

    def run() -> float:
        if args.variant == "native":
            return rb.run_native(spark, files, work, 10)[0]
        return rb.run_millwheel(
            spark, files, work, 10, args.intervals, args.variant == "mw_col_strong", columnar=True
        )[0]

    run()  # warm-up
    url, app = spark.sparkContext.uiWebUrl, spark.sparkContext.applicationId

    def stages() -> list[dict]:
        with urllib.request.urlopen(f"{url}/api/v1/applications/{app}/stages?status=complete") as r:
            return json.load(r)

    before = {s["stageId"] for s in stages()}
    t0 = time.time()
    elapsed = run()
    rows = []
    for s in sorted(
        (s for s in stages() if s["stageId"] not in before), key=lambda s: _at(s["submissionTime"])
    ):
        start, end = _at(s["submissionTime"]) - t0, _at(s["completionTime"]) - t0
        rows.append(
            {
                "start_s": round(start, 3),
                "end_s": round(end, 3),
                "tasks": s["numTasks"],
                "name": s["name"].split(" at ")[0],
                "task_run_s": s["executorRunTime"] / 1000,
                "jvm_cpu_s": round(s["executorCpuTime"] / 1e9, 3),
            }
        )
        print(
            f"{start:6.2f} {end:6.2f} {end - start:5.2f}s tasks={s['numTasks']} {rows[-1]['name'][:12]:12s} run={rows[-1]['task_run_s']:.2f}s jvm_cpu={rows[-1]['jvm_cpu_s']:.2f}s"
        )
    print(f"{args.variant}: {elapsed:.2f} s")
    write_results(Path(args.out), {"args": vars(args), "elapsed_s": elapsed, "stages": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
