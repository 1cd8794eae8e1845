"""What bootstrapping a computation's state costs (a command, not a test): ``python bench/bootstrap_bench.py``.

``--keys`` keys (default 1M) of initial state, each a count (per-record: an int through the
pickle codec, with a low-watermark timer on one key in ten; columnar: one state row), are
loaded:

* **harness** (``millwheel/testing/_initial.py``): building a harness whose topology names
  the state as an iterable (per-record) or a pandas DataFrame (columnar): ``load_s``;
* **Spark** (``local[2]``, 8 key intervals; ``millwheel/runtime/_state_load.py``): the load
  command into a run directory whose computation has not run (``load_s``: reading the
  source, each key's envelope or store, the heartbeat file, ``run.json``; ``file_mb``), then
  the run to drained with nothing else to read, whose first micro-batch installs the state
  (``run_s``), against the same run without a load (``run_plain_s``: the faster of two,
  measured first): the difference is what installing costs in the first batch.

Per key: ``us_per_key`` of each. Figures go to stdout and
``bench/results/bootstrap_<date>.json``, with the machine's load average before and after
(a loaded machine's figures are upper bounds). ``--kinds record columnar``,
``--backends harness spark`` choose what runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from millwheel import ColumnarComputation, Computation, Topology  # noqa: E402
from millwheel._sources import SampleSource  # noqa: E402


class Count(Computation):
    def process_record(self, record):  # noqa: ANN001, ANN201
        self.state.set(self.state.get(0) + 1)

    def process_timer(self, timer):  # noqa: ANN001, ANN201
        self.produce("counts", self.state.get())


class ColCount(ColumnarComputation):
    record_columns = ("key",)

    def process_batch(self, batch):  # noqa: ANN001, ANN201
        pass


def _source(kind: str, keys: int):  # noqa: ANN202
    if kind == "record":
        return [
            (f"k{i}", i, {"t": 2_000_000_000_000}) if i % 10 == 0 else (f"k{i}", i)
            for i in range(keys)
        ]
    import pandas as pd

    return pd.DataFrame({"key": [f"k{i}" for i in range(keys)], "count": range(keys)})


def _topology(kind: str, initial=None) -> Topology:  # noqa: ANN001
    t = Topology("bootstrap_bench")
    t.injector("in", SampleSource([]))
    cls = Count if kind == "record" else ColCount
    t.computation(cls, name="C", inputs=["in"], outputs=["counts"], initial_state=initial)
    return t


def harness(kind: str, keys: int) -> dict:
    from millwheel.testing import Harness

    src = _source(kind, keys)
    t0 = time.perf_counter()
    topo = _topology(kind, src)
    check_s = time.perf_counter() - t0
    h = Harness(topo)
    load_s = time.perf_counter() - t0
    assert len(h.keys("C")) == keys
    return {
        "backend": "harness",
        "kind": kind,
        "keys": keys,
        "check_s": round(check_s, 2),
        "load_s": round(load_s, 2),
        "us_per_key": round(load_s / keys * 1e6, 2),
    }


def spark_run(kind: str, keys: int, spark, base: Path) -> dict:  # noqa: ANN001
    from millwheel.runtime import RuntimeSettings, SparkRuntime
    from millwheel.runtime._state_load import load

    settings = RuntimeSettings(drain=True, intervals=8)
    plains = []
    for i in range(2):  # the faster of two: the first also warms the session's workers
        t0 = time.perf_counter()
        SparkRuntime(_topology(kind), str(base / f"plain_{kind}_{i}"), settings, spark=spark).run(
            timeout_s=3600
        )
        plains.append(time.perf_counter() - t0)
    run_plain_s = min(plains)
    root = base / f"loaded_{kind}"
    # the run directory pinned (its injector alone ran), the computation never started
    only = SparkRuntime(
        _topology(kind),
        str(root),
        RuntimeSettings(drain=False, intervals=8, only=("in",)),
        spark=spark,
    )
    only.start()
    only.stop()
    src = _source(kind, keys)
    spec = _topology(kind).computations["C"]
    t0 = time.perf_counter()
    done = load(str(root), spec, src)
    load_s = time.perf_counter() - t0
    f = root / "heartbeats" / "C" / done["file"]
    file_mb = f.stat().st_size / 1e6
    t0 = time.perf_counter()
    SparkRuntime(_topology(kind), str(root), settings, spark=spark).run(timeout_s=3600)
    run_s = time.perf_counter() - t0
    return {
        "backend": "spark",
        "kind": kind,
        "keys": keys,
        "load_s": round(load_s, 2),
        "read_s": round(done["read_s"], 2),
        "file_mb": round(file_mb, 1),
        "run_s": round(run_s, 2),
        "run_plain_s": round(run_plain_s, 2),
        "install_s": round(run_s - run_plain_s, 2),
        "us_per_key": round(load_s / keys * 1e6, 2),
        "install_us_per_key": round((run_s - run_plain_s) / keys * 1e6, 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--kinds", nargs="+", default=["record", "columnar"])
    p.add_argument("--backends", nargs="+", default=["harness", "spark"])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    load_before = os.getloadavg()
    rows = []
    for kind in args.kinds:
        if "harness" in args.backends:
            rows.append(harness(kind, args.keys))
            print(json.dumps(rows[-1]), flush=True)
    if "spark" in args.backends:
        from millwheel.runtime import spark_session

        spark = spark_session("local[2]")
        base = Path(tempfile.mkdtemp(prefix="bootstrap_bench_"))
        try:
            for kind in args.kinds:
                rows.append(spark_run(kind, args.keys, spark, base))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    out = (
        Path(args.out)
        if args.out
        else (
            Path(__file__).parent
            / "results"
            / f"bootstrap_{time.strftime('%Y%m%d', time.gmtime())}.json"
        )
    )
    result = {
        "what": "bootstrapping initial state: harness load, `millwheel state load` and the first batch that installs it (bench/bootstrap_bench.py)",
        "machine": {
            "cores": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "note": "a shared 2-core machine with other work running: figures are upper bounds",
        },
        "runs": rows,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
