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
    return LogFileStreamReader(options)


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


def photon_sample(directory: Path) -> str:
    """The Photon bench's throughput sample (``bench/photon_bench.py``: seed 3, 1,000 queries/s, 120 s)."""
    from topologies.photon.generator import GeneratorConfig, generate

    if not (directory / "queries").is_dir():
        generate(directory, GeneratorConfig(seed=3, rate=1000.0, duration_s=120.0))
    return str(directory)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", action="append", default=[], help="LABEL=CHECKOUT (repeatable; default: this checkout)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per process (after one warm-up)")
    p.add_argument("--rounds", type=int, default=2, help="processes per variant and dataset, alternating")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "logfile_reader.json"))
    p.add_argument("--worker", nargs=2, metavar=("DATASET", "DATA"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.reps)))
        return 0
    variants = dict(v.split("=", 1) for v in args.variant) or {"this": str(ROOT)}
    py = sys.executable
    results: dict[str, Any] = {
        "what": "LogFileStreamReader.read of one batch's every partition, in process (no Spark); CPU seconds",
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
                    cmd = [py, str(Path(__file__).resolve()), "--worker", dataset, data or "-", "--reps", str(args.reps)]
                    out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, check=True)
                    one = json.loads(out.stdout.strip().splitlines()[-1])
                    got[label] += one["cpu_s"]
                    rows[label] = one["rows"]
            figures = {}
            for label, cpu in got.items():
                med = statistics.median(cpu)
                figures[label] = {"rows": rows[label], "cpu_s": [round(c, 3) for c in cpu], "median_cpu_s": round(med, 3),
                                  "lines_per_cpu_s": round(rows[label] / med), "us_per_line": round(med / rows[label] * 1e6, 2)}  # fmt: skip
                print(f"{dataset:15s} {label:8s} {rows[label]:>8,} rows  {figures[label]['lines_per_cpu_s']:>9,} lines/CPU s  {figures[label]['us_per_line']:5.2f} µs/line")
            results["datasets"][dataset] = figures
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
