"""Spark runtime benchmark (a command, not a test): ``python bench/runtime_bench.py``.

Per-key windowed counting (10 s windows) over ``--records`` records and ``--keys`` keys,
read from the same Parquet files (``maxFilesPerTrigger`` batches) by:

* **millwheel** — a ``Computation`` counting per key and window, emitting each window on
  a low-watermark timer, on the Spark runtime (applyInPandasWithState over key intervals),
  with exactly-once + strong productions (the default) and without (weak, no dedup);
* **native** — ``groupBy(window(ts, "10 seconds"), query).count()`` in update mode;
* **tws** — the same logic in ``transformWithStateInPandas`` (MapState per key, per-batch
  vectorised counts).

A warm-up run is discarded, repetitions are interleaved, and the table reports medians of
per-pair ratios; every variant's final counts must be identical. Also: the in-process
dispatch rate of the per-key step (no Spark) against a bare Python loop, and per-stage
latency p50/p95 of a two-stage pipeline in continuous mode. ``--write`` puts the figures
in the "Spark runtime" section of ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from millwheel import (  # noqa: E402
    MAX_TIMESTAMP,
    Computation,
    ComputationOptions,
    Record,
    Source,
    SourceBatch,
    StepRunner,
    Topology,
)

WINDOW = 10_000
START = 1_700_000_000_000


# ------------------------------------------------------------------------------------ data
def make_data(d: Path, records: int, keys: int, files: int, seed: int = 1) -> Path:
    """Stream-log Parquet files of ``{"query", "ts"}`` records, plus a plain ``query`` column."""
    import numpy as np

    out = d / "files"
    if (out / "_READY").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    per = records // files
    span = 100_000  # 100 s of event time: 10 windows
    for f in range(files):
        lo = START + f * span // files
        ts = np.sort(lo + rng.integers(0, span // files, per))
        q = rng.integers(0, keys, per)
        queries = [f"q{k}" for k in q.tolist()]
        values = [pickle.dumps({"query": s, "ts": t}, 5) for s, t in zip(queries, ts.tolist(), strict=True)]
        table = pa.table({
            "id": pa.array([f"r{f}-{i}" for i in range(per)], pa.string()),
            "ts": pa.array(ts, pa.int64()),
            "key": pa.nulls(per, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "wm": pa.nulls(per, pa.int64()),
            "query": pa.array(queries, pa.string()),
        })  # fmt: skip
        pq.write_table(table, out / f"f{f:05d}-m{int(ts.min())}.parquet")
    (out / "_READY").write_text("")
    return out


def expected_counts(files: Path) -> Counter:
    t = pq.read_table(files, columns=["ts", "query"]).to_pandas()
    t["w"] = t["ts"] // WINDOW * WINDOW
    return Counter({(q, int(w)): int(c) for (q, w), c in t.groupby(["query", "w"]).size().items()})


# ------------------------------------------------------------------------------ millwheel
class WindowCount(Computation):
    """Counts per key and 10 s window; emits a window once the low watermark passes it."""

    def process_record(self, record: Record) -> None:
        w = record.timestamp // WINDOW * WINDOW
        counts = self.state.get() or {}
        if w not in counts:
            self.set_timer(str(w), w + WINDOW)
        counts[w] = counts.get(w, 0) + 1
        self.state.set(counts)

    def process_timer(self, timer) -> None:
        counts = self.state.get()
        w = timer.timestamp - WINDOW
        self.produce("counts", (self.key, w, counts.pop(w)))
        if counts:
            self.state.set(counts)
        else:
            self.state.clear()


class Finished(Source):
    """An injector whose records are already in its stream log: its watermark is +inf."""

    def batches(self, injector="injector", stream="records"):
        yield SourceBatch([], MAX_TIMESTAMP)


def run_millwheel(spark, files: Path, work: Path, per_trigger: int, intervals: int, strong: bool) -> tuple[float, Counter]:
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    root = work / "mw"
    shutil.rmtree(root, ignore_errors=True)
    dest = root / "streams" / "events" / "events"
    dest.mkdir(parents=True)
    for f in files.iterdir():
        if f.suffix == ".parquet":
            os.link(f, dest / f.name)
    opts = ComputationOptions() if strong else ComputationOptions(exactly_once=False, strong_productions=False)
    t = Topology("bench")
    t.injector("events", Finished())
    t.computation(WindowCount, inputs={"events": lambda r: r.value["query"]}, outputs=["counts"], options=opts)
    settings = RuntimeSettings(drain=True, intervals=intervals, max_files_per_trigger=per_trigger, poll_ms=50, heartbeat_ms=100)
    rt = SparkRuntime(t, str(root), settings, spark=spark, log=lambda m: None)
    started = time.perf_counter()
    rt.run(timeout_s=1800)
    elapsed = time.perf_counter() - started
    got = Counter({(k, w): c for k, w, c in rt.values("counts")})
    return elapsed, got


# ------------------------------------------------------------------------------ native
def run_native(spark, files: Path, work: Path, per_trigger: int) -> tuple[float, Counter]:
    from pyspark.sql import functions as F

    out = work / "native"
    shutil.rmtree(out, ignore_errors=True)
    df = (
        spark.readStream.schema("ts long, query string").option("maxFilesPerTrigger", per_trigger).parquet(str(files))
        .withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "0 seconds")
        .groupBy(F.window("t", "10 seconds"), "query").count()
        .select("query", (F.unix_millis(F.col("window.start"))).alias("w"), "count")
    )  # fmt: skip

    def sink(batch, bid):
        batch.write.mode("overwrite").parquet(str(out / "data" / str(bid)))

    q = df.writeStream.outputMode("update").foreachBatch(sink).option("checkpointLocation", str(out / "ckpt")).trigger(availableNow=True)
    started = time.perf_counter()
    q.start().awaitTermination()
    elapsed = time.perf_counter() - started
    t = pq.read_table(out / "data").to_pandas()
    final = t.groupby(["query", "w"])["count"].max()
    return elapsed, Counter({(q_, int(w)): int(c) for (q_, w), c in final.items()})


# ---------------------------------------------------------------------------------- tws
def run_tws(spark, files: Path, work: Path, per_trigger: int) -> tuple[float, Counter]:
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    class Counts(StatefulProcessor):
        def init(self, handle):
            schema = StructType([StructField("count", LongType())])
            self.counts = handle.getMapState("counts", StructType([StructField("w", LongType())]), schema)

        def handleInputRows(self, key, rows, timerValues):
            out_w, out_c = [], []
            for pdf in rows:
                for w, n in (pdf["ts"] // WINDOW * WINDOW).value_counts().items():
                    k = (int(w),)
                    c = (self.counts.getValue(k)[0] if self.counts.containsKey(k) else 0) + int(n)
                    self.counts.updateValue(k, (c,))
                    out_w.append(int(w))
                    out_c.append(c)
            yield pd.DataFrame({"query": [key[0]] * len(out_w), "w": out_w, "count": out_c})

        def close(self):
            pass

    out = work / "tws"
    shutil.rmtree(out, ignore_errors=True)
    df = (
        spark.readStream.schema("ts long, query string").option("maxFilesPerTrigger", per_trigger).parquet(str(files))
        .withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "0 seconds")
    )  # fmt: skip
    res = df.groupBy("query").transformWithStateInPandas(
        statefulProcessor=Counts(), outputStructType="query string, w long, count long", outputMode="Update", timeMode="None"
    )

    def sink(batch, bid):
        batch.write.mode("overwrite").parquet(str(out / "data" / str(bid)))

    conf = spark.conf.get("spark.sql.streaming.stateStore.providerClass")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    try:
        q = res.writeStream.outputMode("update").foreachBatch(sink).option("checkpointLocation", str(out / "ckpt")).trigger(availableNow=True)
        started = time.perf_counter()
        q.start().awaitTermination()
        elapsed = time.perf_counter() - started
    finally:
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", conf)
    t = pq.read_table(out / "data").to_pandas()
    final = t.groupby(["query", "w"])["count"].max()
    return elapsed, Counter({(q_, int(w)): int(c) for (q_, w), c in final.items()})


# ---------------------------------------------------------------------------- latency
class Paced(Source):
    """``rate`` records/s in batches every ``every_s``, for ``seconds``; values carry the send time."""

    def __init__(self, rate: int, seconds: float, every_s: float = 0.2) -> None:
        self.rate, self.seconds, self.every_s = rate, seconds, every_s

    def batches(self, injector="injector", stream="records"):
        start = time.time()
        n = 0
        nxt = start
        while time.time() - start < self.seconds:
            if time.time() < nxt:
                yield SourceBatch([], int((nxt - self.every_s) * 1000))
                continue
            now = time.time()
            recs = [Record(None, {"k": i % 100, "sent": now}, int(now * 1000), f"p{n + i}") for i in range(int(self.rate * self.every_s))]
            n += len(recs)
            nxt += self.every_s
            yield SourceBatch(recs, int(now * 1000))
        yield SourceBatch([], MAX_TIMESTAMP)


class PassA(Computation):
    def process_record(self, record: Record) -> None:
        self.produce("a_out", {"sent": record.value["sent"]})


class PassB(Computation):
    def process_record(self, record: Record) -> None:
        self.produce("b_out", {"a_id": record.id})


def latency(spark, work: Path, rate: int, seconds: float) -> dict[str, tuple[float, float]]:
    """Per-stage latency p50/p95 (s) of injector -> A -> B in continuous mode (trigger 0)."""
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    root = work / "latency"
    shutil.rmtree(root, ignore_errors=True)
    t = Topology("latency")
    t.injector("events", Paced(rate, seconds))
    t.computation(PassA, inputs={"events": lambda r: r.value["k"]}, outputs=["a_out"])
    t.computation(PassB, inputs={"a_out": lambda r: r.id}, outputs=["b_out"], name="B")
    settings = RuntimeSettings(drain=True, intervals=8, poll_ms=20, heartbeat_ms=100, injector_batches_per_poll=1)
    rt = SparkRuntime(t, str(root), settings, spark=spark, log=lambda m: None)
    rt.run(timeout_s=seconds + 600)
    pub = {**rt.computations["PassA"].outbox.published_at, **rt.computations["B"].outbox.published_at}
    a_at: dict[str, float] = {}
    lat_a, lat_b = [], []
    for (stream, name), at in pub.items():
        if stream != "a_out":
            continue
        loc = rt.streams.location("a_out", "PassA").child(name)
        for r in pq.read_table(loc.path, columns=["id", "value"]).to_pylist():
            a_at[r["id"]] = at
            lat_a.append(at - pickle.loads(r["value"])["sent"])
    for (stream, name), at in pub.items():
        if stream != "b_out":
            continue
        loc = rt.streams.location("b_out", "B").child(name)
        for r in pq.read_table(loc.path, columns=["value"]).to_pylist():
            lat_b.append(at - a_at[pickle.loads(r["value"])["a_id"]])

    def pct(xs: list[float], p: float) -> float:
        s = sorted(xs)
        return s[max(0, min(len(s) - 1, int(round(p / 100 * len(s))) - 1))]

    return {"A": (pct(lat_a, 50), pct(lat_a, 95), len(lat_a)), "B": (pct(lat_b, 50), pct(lat_b, 95), len(lat_b))}


# --------------------------------------------------------------------------- dispatch
def dispatch(records: int, keys: int, exactly_once: bool) -> tuple[float, float]:
    """Records/s through ``StepRunner.step`` (state + timer calls) vs a bare dict loop."""
    import random

    rng = random.Random(3)
    per_key = max(1, records // keys)
    batches = []
    n = 0
    for k in range(keys):
        ts = sorted(START + rng.randrange(100_000) for _ in range(per_key))
        batches.append((f"q{k}", [Record(f"q{k}", None, t, f"r{n + i}") for i, t in enumerate(ts)]))
        n += per_key
    opts = ComputationOptions(exactly_once=exactly_once, strong_productions=False)
    runner = StepRunner(WindowCount(), name="WindowCount", outputs=["counts"], options=opts)
    started = time.perf_counter()
    for key, recs in batches:
        runner.step(key, None, recs, low_watermark=START - 1, now=0)
    mw = n / (time.perf_counter() - started)
    counts: dict = {}
    started = time.perf_counter()
    for key, recs in batches:
        d = counts.setdefault(key, {})
        for r in recs:
            w = r.timestamp // WINDOW * WINDOW
            d[w] = d.get(w, 0) + 1
    bare = n / (time.perf_counter() - started)
    return mw, bare


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--files", type=int, default=100)
    p.add_argument("--per-trigger", type=int, default=10)
    p.add_argument("--intervals", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--variants", default="mw_strong,mw_weak,native,tws")
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench"))
    p.add_argument("--write", action="store_true", help="write the table into docs/performance.md")
    p.add_argument("--latency-only", action="store_true", help="only the continuous-mode latency run")
    p.add_argument("--latency-rate", type=int, default=2_000, help="records/s in the latency run")
    p.add_argument("--latency-seconds", type=float, default=40)
    args = p.parse_args(argv)

    work = Path(args.work) / f"{args.records}-{args.keys}-{args.files}"
    files = make_data(work, args.records, args.keys, args.files)
    expected = expected_counts(files)
    from millwheel.runtime import spark_session

    spark = spark_session("local[2]")
    if args.latency_only:
        for stage, (p50, p95, n) in latency(spark, work, args.latency_rate, args.latency_seconds).items():
            print(f"per-stage latency, stage {stage} ({n} records, {args.latency_rate} records/s, trigger 0): p50 {p50:.2f}s, p95 {p95:.2f}s")
        return 0
    variants = args.variants.split(",")
    runners = {
        "mw_strong": lambda: run_millwheel(spark, files, work, args.per_trigger, args.intervals, True),
        "mw_weak": lambda: run_millwheel(spark, files, work, args.per_trigger, args.intervals, False),
        "native": lambda: run_native(spark, files, work, args.per_trigger),
        "tws": lambda: run_tws(spark, files, work, args.per_trigger),
    }
    times: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(args.reps + 1):
        order = variants[rep % len(variants):] + variants[: rep % len(variants)]
        for v in order:
            elapsed, got = runners[v]()
            ok = got == expected
            print(f"rep {rep}{' (warm-up, discarded)' if rep == 0 else ''}: {v:<10} {elapsed:7.2f}s  {args.records / elapsed:>10,.0f} rec/s  output {'OK' if ok else 'DIFFERS'}", flush=True)
            if not ok:
                print(f"  expected {len(expected)} windows, got {len(got)}; missing {list((expected - got).items())[:3]} extra {list((got - expected).items())[:3]}")
                return 1
            if rep > 0:
                times[v].append(elapsed)
    rates = {v: args.records / statistics.median(ts) for v, ts in times.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(tb / ta for ta, tb in zip(times[a], times[b], strict=True))

    lines = ["| variant | median records/s | vs native | vs TWS |", "|---|---:|---:|---:|"]
    for v in variants:
        vs_native = f"{ratio(v, 'native'):.2f}x" if "native" in times else "-"
        vs_tws = f"{ratio(v, 'tws'):.2f}x" if "tws" in times else "-"
        lines.append(f"| {v} | {rates[v]:,.0f} | {vs_native} | {vs_tws} |")
    if "mw_strong" in times and "mw_weak" in times:
        lines.append("")
        lines.append(f"exactly-once + strong productions cost {ratio('mw_weak', 'mw_strong'):.2f}x the time of weak/no-dedup (median of per-pair ratios)")
    for eo in (True, False):
        mw, bare = dispatch(min(args.records, 1_000_000), args.keys, eo)
        lines.append(f"in-process dispatch (StepRunner.step, state + timer calls, exactly_once={eo}): {mw:,.0f} records/s; bare dict loop: {bare:,.0f} records/s ({mw / bare:.2f}x)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
