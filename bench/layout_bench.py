"""State-layout building blocks on Spark (a command, not a test): ``python bench/layout_bench.py``.

What each way of keeping one row per key costs on this PySpark, measured before choosing
the layouts (``docs/performance.md``, "State layouts"):

1. ``applyInPandasWithState`` grouped by key (one Spark group and one GroupState row per
   key): wall time per group, for batches of ``--keys`` keys with one row each;
2. ``transformWithStateInPandas`` grouped by key interval with a MapState of key -> value:
   one ``getValue`` + ``updateValue`` per key as PySpark's client makes them (one round
   trip to the JVM state server each) against the same calls pipelined
   (``millwheel.runtime._mapstate._Pipeline``: a chunk of requests per round trip), in the
   same query, alternating batches; time inside the Python function per key.

Figures go to stdout and ``bench/results/layout.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from _spark_bench import write_results  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "layout.json"
ROCKSDB = {
    "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def _stream(spark, d: Path, schema: str):
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(d / "in"))


def per_key_groups(spark, work: Path, keys: int, batches: int) -> dict:
    from pyspark.sql.streaming.state import GroupStateTimeout

    d = work / "groups"
    shutil.rmtree(d, ignore_errors=True)
    (d / "in").mkdir(parents=True)
    for b in range(batches):
        ks = [f"k{i}".encode() for i in range(keys)]
        pq.write_table(
            pa.table({"key": pa.array(ks, pa.binary()), "v": pa.array([b] * keys, pa.int64())}),
            d / "in" / f"f{b:04d}.parquet",
        )
        time.sleep(0.01)

    def f(key, frames, state):
        n = sum(len(pdf) for pdf in frames)
        old = state.get[0] if state.exists else b""
        state.update((old[:50] + b"x",))
        yield pd.DataFrame({"n": [n]})

    out = (
        _stream(spark, d, "key binary, v long")
        .groupBy("key")
        .applyInPandasWithState(f, "n long", "s binary", "append", GroupStateTimeout.NoTimeout)
    )
    times: list[float] = []
    last = [time.perf_counter()]

    def sink(batch, bid):
        batch.count()
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    out.writeStream.foreachBatch(sink).option("checkpointLocation", str(d / "ck")).trigger(
        availableNow=True
    ).start().awaitTermination()
    per_group = [t / keys * 1e6 for t in times[1:]]  # the first batch also starts the query
    return {"keys_per_batch": keys, "batches": len(times), "us_per_group": per_group}


def mapstate(spark, work: Path, keys: int, batches: int) -> dict:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from millwheel.runtime._spark_internals import MapStatePipeline as _Pipeline

    d = work / "mapstate"
    shutil.rmtree(d, ignore_errors=True)
    (d / "in").mkdir(parents=True)
    for b in range(batches):
        ks = [
            f"k{(b // 2) * keys + i}".encode() for i in range(keys)
        ]  # each key twice: inserted, then updated
        mode = "plain" if b % 4 < 2 else "pipelined"
        pq.write_table(
            pa.table(
                {
                    "interval": pa.array([i % 16 for i in range(keys)], pa.int32()),
                    "key": pa.array(ks, pa.binary()),
                    "mode": [mode] * keys,
                }
            ),
            d / "in" / f"f{b:04d}.parquet",
        )
        time.sleep(0.01)

    class P(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle):
            self.m = handle.getMapState("envs", "key binary", "env binary")

        def handleInputRows(self, key, rows, timerValues):
            pdfs = list(rows)
            ks = [k for p in pdfs for k in p["key"].tolist()]
            mode = pdfs[0]["mode"].iloc[0]
            t = time.perf_counter()
            if mode == "plain":
                for k in ks:
                    v = self.m.getValue((k,))
                    self.m.updateValue((k,), ((v[0] if v else b"") + b"x" * 100,))
            else:
                pipe = _Pipeline(self.m)
                got = pipe.get_many(ks)
                pipe.write_many([(k, (got[k] or b"") + b"x" * 100) for k in ks], [])
            yield pd.DataFrame({"mode": [mode], "n": [len(ks)], "t": [time.perf_counter() - t]})

        def close(self):
            pass

    for k, v in ROCKSDB.items():
        spark.conf.set(k, v)
    out = (
        _stream(spark, d, "interval int, key binary, mode string")
        .groupBy("interval")
        .transformWithStateInPandas(
            statefulProcessor=P(),
            outputStructType="mode string, n long, t double",
            outputMode="Update",
            timeMode="None",
        )
    )
    rows: list[tuple[str, int, float]] = []

    def sink(batch, bid):
        r = batch.collect()
        rows.append((r[0].mode, sum(x.n for x in r), sum(x.t for x in r)))

    out.writeStream.foreachBatch(sink).option("checkpointLocation", str(d / "ck")).trigger(
        availableNow=True
    ).start().awaitTermination()
    return {
        mode: [round(t / n * 1e6, 1) for m, n, t in rows if m == mode]
        for mode in ("plain", "pipelined")
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench" / "layout"))
    args = p.parse_args(argv)
    from millwheel.runtime import spark_session

    spark = spark_session("local[2]")
    work = Path(args.work)
    groups = per_key_groups(spark, work, args.keys, max(3, args.batches // 2))
    print(
        f"applyInPandasWithState, one group per key: {', '.join(f'{x:,.0f}' for x in groups['us_per_group'])} us per group (batches after the first)",
        flush=True,
    )
    ms = mapstate(spark, work, args.keys, args.batches)
    print(
        f"transformWithStateInPandas MapState get+update per key: one round trip per call {ms['plain']} us; pipelined {ms['pipelined']} us"
    )
    write_results(
        RESULTS,
        {
            "args": vars(args),
            "apply_in_pandas_with_state_per_key_groups": groups,
            "tws_mapstate_us_per_key": ms,
        },
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
