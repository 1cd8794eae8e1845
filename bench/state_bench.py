"""State-growth benchmark (a command, not a test): ``python bench/state_bench.py``.

How the time of a micro-batch that touches 10,000 keys grows with the number of keys the
computation *holds* (MillWheel keeps per-key rows in Bigtable, §7.1: a batch should cost
what it touches). For each state layout (``RuntimeSettings.state_layout``) and each held
count, a computation that keeps a running count per key (exactly-once: each key also
keeps its dedup ids and Bloom filter) is loaded with ``held`` distinct keys in large
batches, then runs ``--batches`` batches of ``--touched`` records, each on a different
key drawn from the held ones. The figure is the median ``triggerExecution`` of those
batches (Spark's own measure of a micro-batch, commit included), and its ratio to the
same layout's batch at the smallest held count, measured in the same run.

Defaults: layouts ``intervals`` (the default layout) at 10k and 1M held keys on Spark's
HDFS-backed state store (the session default) and on RocksDB with changelog
checkpointing, ``keys`` (always RocksDB + changelog) at 10k, 1M and 10M; 16 key
intervals; ``local[2]``. ``--quick`` runs 10k and 100k. Figures go to stdout and
``bench/results/state.json``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from _spark_bench import Finished, run_collecting, write_results  # noqa: E402

from millwheel import Computation, Record, Topology  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "state.json"
START = 1_700_000_000_000


class Tally(Computation):
    """A running count per key: the state every held key keeps."""

    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)


def _write(dest: Path, name: str, keys: np.ndarray, first_ts: int, first_id: int) -> int:
    n = len(keys)
    vals = [pickle.dumps({"k": int(k)}, 5) for k in keys.tolist()]
    table = pa.table(
        {
            "id": pa.array([f"r{first_id + i}" for i in range(n)], pa.string()),
            "ts": pa.array(np.arange(first_ts, first_ts + n, dtype=np.int64)),
            "key": pa.nulls(n, pa.binary()),
            "value": pa.array(vals, pa.binary()),
            "wm": pa.nulls(n, pa.int64()),
        }
    )
    tmp = dest / f".{name}.tmp"
    pq.write_table(table, tmp)
    tmp.rename(dest / f"{name}-m{first_ts}.parquet")
    time.sleep(0.01)  # file sources take files oldest first: keep modification times apart
    return first_ts + n


PROVIDERS = {
    "hdfs": {
        "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    },
    "rocksdb": {
        "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    },
}


def run(
    spark,
    work: Path,
    layout: str,
    provider: str,
    held: int,
    touched: int,
    batches: int,
    intervals: int,
    load_batch: int,
    seed: int,
) -> dict:
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    for k, v in PROVIDERS[provider].items():  # the interval layout takes the session's provider
        spark.conf.set(k, v)
    root = work / f"{layout}-{provider}-{held}"
    shutil.rmtree(root, ignore_errors=True)
    dest = root / "streams" / "events" / "events"
    dest.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    ts, rid = START, 0
    order = rng.permutation(held)
    for i, lo in enumerate(range(0, held, load_batch)):
        part = order[lo : lo + load_batch]
        ts = _write(dest, f"a{i:05d}", part, ts, rid)
        rid += len(part)
    loads = -(-held // load_batch)
    for b in range(batches):
        part = rng.choice(held, size=touched, replace=False)
        ts = _write(dest, f"b{b:05d}", part, ts, rid)
        rid += touched
    t = Topology("state")
    t.injector("events", Finished())
    t.computation(Tally, inputs={"events": lambda r: r.value["k"]}, outputs=[])
    settings = RuntimeSettings(
        drain=True,
        intervals=intervals,
        max_files_per_trigger=1,
        poll_ms=50,
        heartbeat_ms=100,
        state_layout=layout,
    )
    rt = SparkRuntime(t, str(root), settings, spark=spark, log=lambda m: None)
    started = time.perf_counter()
    progress = run_collecting(rt, timeout_s=24 * 3600, poll_s=0.05).get("Tally", {})
    elapsed = time.perf_counter() - started
    data = [p for _, p in sorted(progress.items()) if p["numInputRows"] > 0]
    # a data batch also reads the query's heartbeat rows (one per key interval at most)
    measured = [p for p in data if touched <= p["numInputRows"] <= touched + intervals + 8][
        -batches:
    ]
    times = [p["durationMs"]["triggerExecution"] for p in measured]
    add = [p["durationMs"].get("addBatch", 0) for p in measured]
    ops = [p["stateOperators"][0] for p in measured if p["stateOperators"]]
    state_bytes = sum(
        f.stat().st_size
        for f in (root / "checkpoints" / "Tally" / "state").rglob("*")
        if f.is_file()
    )
    return {
        "layout": layout,
        "provider": provider,
        "held": held,
        "touched": touched,
        "load_batches": loads,
        "measured_batches": len(times),
        "batch_ms_median": statistics.median(times) if times else None,
        "batch_ms": times,
        "add_batch_ms_median": statistics.median(add) if add else None,
        "commit_ms_median": statistics.median([o.get("commitTimeMs", 0) for o in ops])
        if ops
        else None,
        "state_rows": ops[-1].get("numRowsTotal") if ops else None,
        "checkpoint_state_bytes": state_bytes,
        "run_s": round(elapsed, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--intervals-held", default="10000,1000000", help="held counts for the interval-row layout"
    )
    p.add_argument(
        "--interval-providers",
        default="hdfs,rocksdb",
        help="state stores for the interval-row layout",
    )
    p.add_argument(
        "--keys-held", default="10000,1000000,10000000", help="held counts for the per-key layout"
    )
    p.add_argument("--touched", type=int, default=10_000)
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--intervals", type=int, default=16)
    p.add_argument("--load-batch", type=int, default=500_000)
    p.add_argument("--quick", action="store_true", help="10k and 100k held keys, both layouts")
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench" / "state"))
    p.add_argument(
        "--out", default=str(RESULTS), help="results file (a partial run: give another one)"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.intervals_held = args.keys_held = "10000,100000"
    work = Path(args.work)
    from millwheel.runtime import spark_session

    spark = spark_session(
        "local[2]", conf={"spark.driver.memory": os.environ.get("MILLWHEEL_DRIVER_MEMORY", "6g")}
    )
    plan = [
        ("intervals", pr, int(h))
        for pr in args.interval_providers.split(",")
        for h in args.intervals_held.split(",")
        if h
    ]
    plan += [("keys", "rocksdb", int(h)) for h in args.keys_held.split(",") if h]
    results = []
    for layout, provider, held in plan:
        r = run(
            spark,
            work,
            layout,
            provider,
            held,
            args.touched,
            args.batches,
            args.intervals,
            args.load_batch,
            seed=7,
        )
        base = next((x for x in results if (x["layout"], x["provider"]) == (layout, provider)), r)
        r["vs_smallest_held"] = (
            round(r["batch_ms_median"] / base["batch_ms_median"], 2)
            if r["batch_ms_median"] and base["batch_ms_median"]
            else None
        )
        results.append(r)
        print(
            f"{layout:<9} {provider:<7} held {held:>10,}  batch of {args.touched:,} touched: median {r['batch_ms_median']} ms "
            f"({r['vs_smallest_held']}x the smallest held)  commit {r['commit_ms_median']} ms  state on disk {r['checkpoint_state_bytes'] / 1e6:,.0f} MB  "
            f"run {r['run_s']} s",
            flush=True,
        )
        shutil.rmtree(work / f"{layout}-{provider}-{held}", ignore_errors=True)
    write_results(Path(args.out), {"args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
