"""SparkSource throughput: records per second into a stream log, and through a per-key count.

    PYTHONPATH=. python bench/spark_io_bench.py [--count 200000] [--rows-per-batch 50000]

The shipped Python Data Source (``examples/sequence_source.py``) read by a ``SparkSource``
on ``local[2]``: once into the stream log alone (the injector: the source, the conversion
on the executors, the outbox), once into a per-key count per second. Prints each run's
records, seconds and records per second, and writes ``bench/results/spark_io.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.sequence_source import FORMAT, SequenceDataSource  # noqa: E402
from millwheel import SparkSource, Topology  # noqa: E402
from millwheel.runtime import RuntimeSettings, SparkRuntime, spark_session  # noqa: E402
from tests.runtime.spark_io_driver import SecondCounts  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=200_000, help="events the source serves")
    p.add_argument("--rows-per-batch", type=int, default=50_000, help="events per micro-batch")
    args = p.parse_args()
    spark = spark_session("local[2]")
    opts = {
        "count": args.count,
        "rows_per_batch": args.rows_per_batch,
        "partitions": 2,
        "keys": 100,
        "step_ms": 1,
    }
    results = {}
    for variant in ("injector", "count"):
        src = SparkSource(
            lambda s: (
                s.readStream.format(FORMAT).options(**{k: str(v) for k, v in opts.items()}).load()
            ),
            data_sources=[SequenceDataSource],
            id="seq",
            timestamp="ts",
            offset_watermark="lw",
        )
        t = Topology(f"bench-{variant}")
        t.injector("seq", src, stream="events")
        if variant == "count":
            t.computation(
                SecondCounts, inputs={"events": lambda r: r.value["key"]}, outputs=["counts"]
            )
        root = tempfile.mkdtemp(prefix="mw-io-bench-")
        started = time.perf_counter()
        SparkRuntime(t, root, RuntimeSettings(intervals=4), spark=spark).run(timeout_s=1800)
        took = time.perf_counter() - started
        shutil.rmtree(root, ignore_errors=True)
        results[variant] = {
            "records": args.count,
            "seconds": round(took, 1),
            "records_per_s": round(args.count / took),
        }
        print(
            f"{variant:<9} {args.count:>9,} records in {took:6.1f}s: {args.count / took:>9,.0f} records/s",
            flush=True,
        )
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/spark_io.json", "w") as f:
        json.dump({"options": opts, **results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
