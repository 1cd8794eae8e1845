"""Spark's and millwheel's windowed count, one run per process (run by
``bench/peers_bench.py`` with the project's virtualenv): ``bench/runtime_bench.py``'s
variants, called as they are there, on a fresh ``local[2]`` session.

* ``spark_native`` / ``spark_native_dedup`` — ``runtime_bench.run_native`` (the second
  with ``dropDuplicatesWithinWatermark("id")``); update mode, so a window's count may come
  out in several micro-batches: the job hands back each window's final count;
* ``spark_tws`` — ``runtime_bench.run_tws`` (``transformWithStateInPandas``; final counts
  likewise);
* ``mw_col_strong`` / ``mw_col_arrow_strong`` — ``ColumnarWindowCounter``, exactly-once
  + strong productions, on the default / the Arrow mapping; ``mw_strong`` — the per-record
  ``WindowCount`` computation, exactly-once + strong: each emits a window once, and the
  job hands back every row it emitted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent.parent)]

import runtime_bench as rb  # noqa: E402
from _job import finish  # noqa: E402

VARIANTS = [
    "spark_native",
    "spark_native_dedup",
    "spark_tws",
    "mw_col_strong",
    "mw_col_arrow_strong",
    "mw_strong",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=VARIANTS, required=True)
    p.add_argument(
        "--files",
        required=True,
        help="directory of the input Parquet files (runtime_bench.make_data)",
    )
    p.add_argument("--work", required=True, help="a directory for the run's checkpoints and output")
    p.add_argument("--out", required=True)
    p.add_argument("--per-trigger", type=int, default=10)
    p.add_argument("--intervals", type=int, default=16)
    args = p.parse_args()

    from millwheel.runtime import spark_session

    # the Python workers unpickle runtime_bench's key function by reference: bench/ on their path
    os.environ["PYTHONPATH"] = os.pathsep.join(
        x for x in (str(HERE.parent), os.environ.get("PYTHONPATH")) if x
    )
    spark = spark_session("local[2]")
    files, work, v = Path(args.files), Path(args.work), args.variant
    if v.startswith("spark_"):
        run = {
            "spark_native": rb.run_native,
            "spark_native_dedup": lambda *a: rb.run_native(*a, dedup=True),
            "spark_tws": rb.run_tws,
        }[v]
        _, got = run(spark, files, work, args.per_trigger)
        rows = [(k, w, c) for (k, w), c in got.items()]
    else:
        mapping = "arrow" if v == "mw_col_arrow_strong" else "default"
        rb.run_millwheel(
            spark,
            files,
            work,
            args.per_trigger,
            args.intervals,
            True,
            columnar=v != "mw_strong",
            mapping=mapping,
        )
        rows = rb.ROWS
    finish(rows, args.out)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
