"""The log-file injector's reader in process: lines per CPU second (a command, not a test).

    .venv/bin/python bench/logfile_reader_bench.py                          # this checkout
    .venv/bin/python bench/logfile_reader_bench.py --variant main=../main --variant mine=.

Runs what a Spark task of the log-file injector runs (``LogFileStreamReader.read`` of
``millwheel/runtime/_logfiles.py``: parse each line, make records and dead letters, key
them for their consumers, build the Arrow batches with pickled or declared-field values)
over every partition of one batch, in one process, no Spark, for two inputs:

* ``zeitgeist`` — the bundled Zeitgeist sample (241 files, 202,337 lines; the stream
  declares its fields, so values are columns), keyed for its two consumers;
* ``photon_queries`` — the query logs of the Photon bench's sample (120,000 lines at the
  default rate; pickled values), keyed for the joiner.

``--spark`` runs the injector's query alone instead (``local[2]``, the bundled sample's
JVM options, workers warmed as ``millwheel run`` warms them; each batch into
``foreachBatch`` → ``df.toArrow()``, the driver outbox's path): the batch's ``addBatch``
and the CPU seconds of the driver JVM, of its Python processes (the data source's
planner and readers) and of the driver's Python, per query run — the first run of a
session (cold) apart from the others. CPU seconds hold on a shared machine where wall
times do not; wrap it in ``flock`` like any Spark command.

Each variant (``LABEL=CHECKOUT``: a directory holding ``millwheel/`` and ``topologies/``)
runs in its own process with ``PYTHONPATH`` set to it, variants alternating, ``--reps``
times each; a figure is the median of its repetitions' process CPU time (the first
repetition of each process is a warm-up and not counted). Prints lines per CPU second
and µs per line; writes ``bench/results/logfile_reader.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _spark_bench import tree_cpu

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ("zeitgeist", "photon_queries")


def _reader(dataset: str, data: str) -> Any:
    """The reader a Spark task of ``dataset``'s injector runs, with the injector's options."""
    from millwheel.runtime._keying import Keyer
    from millwheel.runtime._logfiles import LogFileStreamReader, keyer_options

    if dataset == "zeitgeist":
        from topologies.zeitgeist import build

        topology, injector = build(), "queries"
    else:
        from topologies.photon import build

        topology, injector = build(data), "queries"
    topology.validate()
    spec = topology.injectors[injector]
    options = dict(spec.source.options())
    options.update(injector=injector, stream=spec.stream, partitions="2", finite="1")
    options.update(keyer_options(Keyer.of(topology, 16), spec.stream))
    reader = LogFileStreamReader(options)
    reader._bench_options = options  # type: ignore[attr-defined]  # what --spark starts its query with
    return reader


def worker(dataset: str, data: str, reps: int) -> dict[str, Any]:
    """In the variant's process: CPU seconds of reading one batch's every partition."""
    reader = _reader(dataset, data)
    start = reader.initialOffset()
    partitions = reader.partitions(start, reader.latestOffset(start))
    cpu: list[float] = []
    rows = 0
    for rep in range(reps + 1):
        t0 = time.process_time()
        rows = sum(b.num_rows for p in partitions for b in reader.read(p))
        if rep:  # the first is a warm-up
            cpu.append(time.process_time() - t0)
    return {"rows": rows, "cpu_s": cpu}


def _tree_cpu(root: int) -> tuple[float, float]:
    """CPU seconds of process ``root`` and of all its descendants together."""
    cpu = tree_cpu(root)
    return cpu.get(root, 0.0), sum(v for pid, v in cpu.items() if pid != root)


def spark_worker(dataset: str, data: str, reps: int) -> dict[str, Any]:
    """In the variant's process: the injector's query alone on Spark, ``reps + 1`` times."""
    from millwheel.runtime._logfiles import FORMAT, LogFileDataSource
    from millwheel.runtime._session import spark_session, warm_python_workers
    from topologies.zeitgeist import SAMPLE_SPARK_CONF

    reader = _reader(dataset, data)
    spark = spark_session("local[2]", conf=dict(SAMPLE_SPARK_CONF))
    spark.dataSource.register(LogFileDataSource)
    warm_python_workers(spark)
    jvm = spark.sparkContext._gateway.proc.pid
    options = reader._bench_options
    runs = []
    for _ in range(reps + 1):
        rows = [0]

        def sink(df: Any, _batch: int, rows: list[int] = rows) -> None:
            rows[0] += df.toArrow().num_rows

        with tempfile.TemporaryDirectory(prefix="reader-bench-ck-") as ck:
            j0, p0, d0, w0 = *_tree_cpu(jvm), time.process_time(), time.perf_counter()
            q = (
                spark.readStream.format(FORMAT)
                .options(**options)
                .load()
                .writeStream.foreachBatch(sink)
            )
            q = q.option("checkpointLocation", ck).trigger(availableNow=True).start()
            q.awaitTermination()
            (j1, p1), d1, w1 = _tree_cpu(jvm), time.process_time(), time.perf_counter()
            add = sum(
                p["durationMs"].get("addBatch", 0) for p in q.recentProgress if p["numInputRows"]
            )
        runs.append(
            {
                "rows": rows[0],
                "wall_s": round(w1 - w0, 2),
                "add_batch_s": add / 1000,
                "jvm_cpu_s": round(j1 - j0, 2),
                "python_workers_cpu_s": round(p1 - p0, 2),
                "driver_python_cpu_s": round(d1 - d0, 2),
            }
        )
    spark.stop()
    return {"rows": runs[0]["rows"], "runs": runs}


def spark_figures(runs: list[dict[str, Any]], per_session: int) -> dict[str, Any]:
    """Medians of the cold runs (each session's first) and of the warm ones."""
    cold = [r for i, r in enumerate(runs) if i % per_session == 0]
    warm = [r for i, r in enumerate(runs) if i % per_session]
    keys = ("add_batch_s", "wall_s", "jvm_cpu_s", "python_workers_cpu_s", "driver_python_cpu_s")

    def med(rs):
        return {k: round(statistics.median(r[k] for r in rs), 2) for k in keys} if rs else None

    return {"cold": med(cold), "warm": med(warm), "runs": runs}


def photon_sample(directory: Path) -> str:
    """The Photon bench's throughput sample (``bench/photon_bench.py``: seed 3, 1,000 queries/s, 120 s)."""
    from topologies.photon.generator import GeneratorConfig, generate

    if not (directory / "queries").is_dir():
        generate(directory, GeneratorConfig(seed=3, rate=1000.0, duration_s=120.0))
    return str(directory)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="LABEL=CHECKOUT (repeatable; default: this checkout)",
    )
    p.add_argument(
        "--reps", type=int, default=3, help="timed repetitions per process (after one warm-up)"
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="processes per variant and dataset, alternating"
    )
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "logfile_reader.json"))
    p.add_argument(
        "--spark", action="store_true", help="the injector's query alone on Spark (see above)"
    )
    p.add_argument("--worker", nargs=2, metavar=("DATASET", "DATA"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        run = spark_worker if args.spark else worker
        print(json.dumps(run(args.worker[0], args.worker[1], args.reps)))
        return 0
    if args.spark and args.out == str(ROOT / "bench" / "results" / "logfile_reader.json"):
        args.out = str(ROOT / "bench" / "results" / "logfile_reader_spark.json")
    variants = dict(v.split("=", 1) for v in args.variant) or {"this": str(ROOT)}
    py = sys.executable
    results: dict[str, Any] = {
        "what": (
            "the injector's query alone on local[2] (foreachBatch -> toArrow): per query run, addBatch and CPU seconds; the first run of a session cold"
            if args.spark
            else "LogFileStreamReader.read of one batch's every partition, in process (no Spark); CPU seconds"
        ),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_1min": round(os.getloadavg()[0], 2),
        "datasets": {},
    }
    with tempfile.TemporaryDirectory(prefix="reader-bench-") as tmp:
        sys.path.insert(0, str(ROOT))
        photon = photon_sample(Path(tmp) / "photon") if "photon_queries" in args.datasets else ""
        for dataset in args.datasets.split(","):
            data = photon if dataset == "photon_queries" else ""
            got: dict[str, list[float]] = {label: [] for label in variants}
            rows: dict[str, int] = {}
            for _ in range(args.rounds):
                for label, checkout in variants.items():
                    env = {**os.environ, "PYTHONPATH": str(Path(checkout).resolve())}
                    cmd = [
                        py,
                        str(Path(__file__).resolve()),
                        "--worker",
                        dataset,
                        data or "-",
                        "--reps",
                        str(args.reps),
                    ] + (["--spark"] if args.spark else [])
                    out = subprocess.run(
                        cmd, cwd=checkout, env=env, capture_output=True, text=True, check=True
                    )
                    one = json.loads(out.stdout.strip().splitlines()[-1])
                    got[label] += one["runs"] if args.spark else one["cpu_s"]
                    rows[label] = one["rows"]
            if args.spark:
                results["datasets"][dataset] = {
                    label: spark_figures(runs, args.reps + 1) for label, runs in got.items()
                }
                for label, fig in results["datasets"][dataset].items():
                    print(f"{dataset:15s} {label:8s} cold {fig['cold']}  warm {fig['warm']}")
                continue
            figures = {}
            for label, cpu in got.items():
                med = statistics.median(cpu)
                figures[label] = {
                    "rows": rows[label],
                    "cpu_s": [round(c, 3) for c in cpu],
                    "median_cpu_s": round(med, 3),
                    "lines_per_cpu_s": round(rows[label] / med),
                    "us_per_line": round(med / rows[label] * 1e6, 2),
                }
                print(
                    f"{dataset:15s} {label:8s} {rows[label]:>8,} rows  {figures[label]['lines_per_cpu_s']:>9,} lines/CPU s  {figures[label]['us_per_line']:5.2f} µs/line"
                )
            results["datasets"][dataset] = figures
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
