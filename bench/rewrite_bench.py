"""What ``millwheel state rewrite`` costs (a command, not a test): ``python bench/rewrite_bench.py``.

A computation that keeps a count per key (exactly-once: each key also keeps its dedup ids;
``rescale_bench.py``'s load) is loaded with ``--keys`` distinct keys (default 1M) on 8 key
intervals (``local[2]``) and stops; then ``rewrite`` applies a function to every key (the
count times ten, every tenth key deleted) and ``--undo`` puts the old state back.
Measured, per layout:

* ``rewrite_s``: the command — publishing, reading every key through Spark's state data
  source (``read_s``), applying the function on Spark's Python workers (``apply_s``),
  building the new store with a scratch query and grafting it (``build_s``), ``run.json``
  and the swap — and ``us_per_key`` of it;
* ``undo_s``: ``--undo`` (a directory swap);
* ``resume_s`` / ``resume_plain_s``: the resumed run's wall time (start to drained, nothing
  new to read) on the rewritten store, and on the old one after the undo.

Figures go to stdout and ``bench/results/rewrite_<date>.json``; the machine's load average
is recorded with each run (the machine is shared: note it when comparing).
``--layout keys`` measures the per-key layout, ``--columnar`` a columnar computation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
# the load's classes live in rescale_bench: Spark's Python workers import it by name
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT / "bench"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)

from rescale_bench import held_keys, topology  # noqa: E402

from millwheel.runtime import RuntimeSettings, SparkRuntime, spark_session  # noqa: E402
from millwheel.runtime._state_rewrite import rewrite, undo  # noqa: E402


def times_ten(key, state, timers):
    """The per-record rewrite: every tenth key deleted, the others' counts times ten."""
    if key % 10 == 0:
        return None
    return state * 10, timers


def columnar_times_ten(key, rows, timers):
    if key % 10 == 0:
        return None
    return [{**r, "n": r["n"] * 10} for r in rows or []], timers


def one(spark, work: Path, keys: int, layout: str, columnar: bool) -> dict:
    run = work / f"run-{keys}-{layout}{'-columnar' if columnar else ''}"
    shutil.rmtree(run, ignore_errors=True)
    settings = RuntimeSettings(drain=True, intervals=8, state_layout=layout)
    t0 = time.perf_counter()
    SparkRuntime(topology(keys, columnar), str(run), settings, spark=spark).run(timeout_s=3600)
    load_s = time.perf_counter() - t0
    fn = columnar_times_ten if columnar else times_ten
    t0 = time.perf_counter()
    done = rewrite(str(run), "Count", fn, spark=spark)
    rewrite_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    SparkRuntime(topology(keys, columnar), str(run), settings, spark=spark).run(timeout_s=3600)
    resume_s = time.perf_counter() - t0
    held = held_keys(spark, run) if layout == "intervals" else None
    # the same again, undone: the resume on the old store is the plain one
    rewrite(str(run), "Count", fn, spark=spark)
    t0 = time.perf_counter()
    undo(str(run), "Count")
    undo_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    SparkRuntime(topology(keys, columnar), str(run), settings, spark=spark).run(timeout_s=3600)
    resume_plain_s = time.perf_counter() - t0
    shutil.rmtree(run, ignore_errors=True)
    read = done["keys"] + done["deleted"]
    assert read == keys, (read, keys)
    if held is not None:
        assert held == done["keys"], (held, done["keys"])
    return {
        "keys": keys,
        "layout": layout,
        "columnar": columnar,
        "apply": "mapInArrow",
        "load_s": round(load_s, 1),
        "rewrite_s": round(rewrite_s, 2),
        "us_per_key": round(rewrite_s / keys * 1e6, 2),
        "read_s": round(done["read_s"], 2),
        "apply_s": round(done["apply_s"], 2),
        "build_s": round(done["build_s"], 2),
        "kept": done["keys"],
        "deleted": done["deleted"],
        "undo_s": round(undo_s, 2),
        "resume_s": round(resume_s, 1),
        "resume_plain_s": round(resume_plain_s, 1),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg_at_end": [round(x, 1) for x in os.getloadavg()],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, nargs="+", default=[1_000_000])
    p.add_argument("--layout", choices=["intervals", "keys"], default="intervals")
    p.add_argument("--columnar", action="store_true")
    p.add_argument("--work", default="/tmp/millwheel-rewrite-bench")
    p.add_argument(
        "--out", default=None, help="the results file (default: bench/results/rewrite_<date>.json)"
    )
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    spark = spark_session("local[2]")
    out = Path(args.out or ROOT / "bench" / "results" / f"rewrite_{time.strftime('%Y%m%d')}.json")
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc["what"] = (
        "millwheel state rewrite of a stopped run (a count per key with its dedup ids, 8 key intervals, "
        "local[2]): every key through a function on Spark, the new store built and grafted; --undo; resumes"
    )
    runs = doc.setdefault("runs", [])
    for keys in args.keys:
        r = one(spark, work, keys, args.layout, args.columnar)
        print(json.dumps(r))
        runs[:] = [
            x
            for x in runs
            if (x["keys"], x["layout"], x["columnar"], x.get("apply"))
            != (keys, args.layout, args.columnar, r["apply"])
        ]
        runs.append(r)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
