"""What ``millwheel rescale`` costs (a command, not a test): ``python bench/rescale_bench.py``.

For each held-key count, a computation that keeps a count per key (exactly-once: each
key also keeps its dedup ids) is loaded with that many distinct keys on 8 key intervals
(``local[2]``) and stopped; then ``rescale`` takes it to 16 intervals, and the run is
resumed with nothing new to read, so its first micro-batch is the state move. Measured:

* ``rescale_s``: the command (publishing, reading the state through Spark's state data
  source, writing the heartbeat file, ``run.json``), and ``read_s`` of it;
* ``move_file_mb``: the heartbeat file's size;
* ``resume_s`` / ``resume_plain_s``: the resumed run's wall time (start to drained) after
  the rescale, and of the same resume without one (measured first): the difference is
  what the move batch costs.

Figures go to stdout and ``bench/results/rescale.json``. ``--keys`` overrides the counts.

``--layout keys`` (or ``intervals``) measures a layout change instead (``_relayout.py``):
the run is loaded in the other layout with 8 intervals and ``rescale --layout`` moves it
(``relayout_s``: the command — publishing, reading the state, ``build_s`` of the query that
builds the new store, the graft, ``run.json``; ``read_s``); the resume after it (whose first
batch loads the new store) is timed against a plain resume as above. Figures go to
``bench/results/relayout.json``.
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

from millwheel import Computation, Record, SampleSource, Topology  # noqa: E402
from millwheel.runtime import RuntimeSettings, SparkRuntime, spark_session  # noqa: E402
from millwheel.runtime._rescale import rescale  # noqa: E402


class Count(Computation):
    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)


def topology(keys: int) -> Topology:
    records = [Record(None, {"k": i}, 1_000 + i % 1_000, f"r{i}") for i in range(keys)]
    t = Topology("rescale_bench")
    t.injector("in", SampleSource(records, batch_size=max(keys // 4, 1)))
    t.computation(Count, inputs={"in": lambda r: r.value["k"]})
    return t


def one(spark, work: Path, keys: int) -> dict:
    run = work / f"run-{keys}"
    shutil.rmtree(run, ignore_errors=True)
    settings = RuntimeSettings(drain=True, intervals=8)
    t0 = time.perf_counter()
    SparkRuntime(topology(keys), str(run), settings, spark=spark).run(timeout_s=3600)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    SparkRuntime(topology(keys), str(run), settings, spark=spark).run(timeout_s=3600)
    plain_s = time.perf_counter() - t0
    done = rescale(str(run), "Count", 16, spark=spark)
    size = os.path.getsize(run / "heartbeats" / "Count" / done["file"]) / 1e6
    t0 = time.perf_counter()
    rt = SparkRuntime(topology(keys), str(run), settings, spark=spark)
    rt.run(timeout_s=3600)
    resume_s = time.perf_counter() - t0
    held = len(rt.envelopes("Count"))
    assert held == keys, f"{held} keys after the move, {keys} before"
    shutil.rmtree(run, ignore_errors=True)
    return {
        "keys": keys, "from": 8, "to": 16, "load_s": round(load_s, 1), "rescale_s": round(done["seconds"], 2),
        "read_s": round(done["read_s"], 2), "move_file_mb": round(size, 1), "resume_plain_s": round(plain_s, 1),
        "resume_s": round(resume_s, 1), "move_batch_s": round(resume_s - plain_s, 1),
    }  # fmt: skip


def one_layout(spark, work: Path, keys: int, layout: str) -> dict:
    run = work / f"relayout-{keys}"
    shutil.rmtree(run, ignore_errors=True)
    other = "intervals" if layout == "keys" else "keys"
    settings = RuntimeSettings(drain=True, intervals=8, state_layout=other)
    t0 = time.perf_counter()
    SparkRuntime(topology(keys), str(run), settings, spark=spark).run(timeout_s=3600)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    SparkRuntime(topology(keys), str(run), settings, spark=spark).run(timeout_s=3600)
    plain_s = time.perf_counter() - t0
    done = rescale(str(run), "Count", layout=layout, spark=spark)
    t0 = time.perf_counter()
    rt = SparkRuntime(topology(keys), str(run), settings, spark=spark)
    rt.run(timeout_s=3600)
    resume_s = time.perf_counter() - t0
    held = len(rt.envelopes("Count"))
    assert held == keys == done["keys"], f"{held} keys after the move, {keys} before"
    shutil.rmtree(run, ignore_errors=True)
    return {
        "keys": keys, "from": other, "to": layout, "intervals": 8, "load_s": round(load_s, 1),
        "relayout_s": round(done["seconds"], 2), "read_s": round(done["read_s"], 2), "build_s": round(done["build_s"], 2),
        "resume_plain_s": round(plain_s, 1), "resume_s": round(resume_s, 1), "first_batch_extra_s": round(resume_s - plain_s, 1),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--keys", type=int, nargs="*", default=[100_000, 1_000_000])
    p.add_argument("--work", default="/tmp/millwheel-rescale-bench")
    p.add_argument("--layout", choices=("intervals", "keys"), default=None, help="measure a change to this state layout instead")
    args = p.parse_args()
    spark = spark_session("local[2]")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = []
    for keys in args.keys:
        r = one(spark, work, keys) if args.layout is None else one_layout(spark, work, keys, args.layout)
        print(json.dumps(r), flush=True)
        out.append(r)
    path = ROOT / "bench" / "results" / ("rescale.json" if args.layout is None else "relayout.json")
    kept = json.loads(path.read_text())["runs"] if path.exists() else []
    fresh = {(r["keys"], r.get("to")) for r in out}
    runs = sorted([r for r in kept if (r["keys"], r.get("to")) not in fresh] + out, key=lambda r: (str(r.get("to")), r["keys"]))  # other figures stay
    what = "millwheel rescale 8 -> 16 key intervals, local[2], interval-row layout"
    if args.layout is not None:
        what = "millwheel rescale --layout (intervals <-> keys), 8 key intervals, local[2]"
    result = {"what": what, "runs": runs}
    path.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
