"""Spark runtime benchmark (a command, not a test): ``python bench/runtime_bench.py``.

Per-key windowed counting (10 s windows) over ``--records`` records and ``--keys`` keys,
read from the same Parquet files (``maxFilesPerTrigger`` batches) by:

* **millwheel** — a ``Computation`` counting per key and window, emitting each window on
  a low-watermark timer, on the Spark runtime: the default interval-row layout
  (applyInPandasWithState over key intervals) with exactly-once + strong productions (the
  default options, ``mw_strong``) and without (weak, no dedup, ``mw_weak``), and the
  per-key layout (``state_layout="keys"``, ``mw_keys``) with exactly-once + strong. The
  files are written as a millwheel producer writes them, keyed for their consumer
  (``key:WindowCount`` / ``interval:WindowCount``, ``millwheel/runtime/_keying.py``), as
  native Spark's input has its ``query`` column; ``mw_unkeyed`` reads the same records
  without those columns, so the consumer runs its own Python keying pass (the runtime
  before producer keying, and what files from an older writer still get);
* **the runtime's floor** (not in the default list; ``bench/_floor.py``): ``mw_noop``, a
  computation that does nothing with its records (weak, no dedup), and ``mw_floor``, the
  per-key step skipped altogether: what the runtime costs around the user's code and
  around the step;
* **columnar** (not in the default list) — ``ColumnarWindowCounter`` on the default mapping
  (``mw_col_strong``, ``mw_col_weak``: the step reads its records from the batch's files;
  the ``mw_col_rows_*`` side-by-side went with ``RuntimeSettings.columnar_input``) and on
  the opt-in Arrow mapping
  (``ComputationOptions(mapping="arrow")``: ``mw_col_arrow_strong``, ``mw_col_arrow_weak``);
* **native** — ``groupBy(window(ts, "10 seconds"), query).count()`` in update mode
  (``native_dedup``: with ``dropDuplicatesWithinWatermark("id")`` first);
* **tws** — the same logic in ``transformWithStateInPandas`` (MapState per key, per-batch
  vectorised counts).

A warm-up run is discarded, repetitions are interleaved, and the table reports medians of
per-pair ratios; every variant's final counts must be identical. For the millwheel runs it
also reports where a micro-batch's time goes (Spark's ``durationMs`` of the data batches:
``addBatch`` is the jobs, the rest is offsets, planning and commit logs).

Also: the in-process dispatch rate of the per-key step (no Spark): records per CPU second
(``time.process_time``, best of 5, so other processes on a shared machine do not count)
and per wall second, against a bare Python loop. Latency is ``bench/latency_bench.py``.
Figures go to stdout and ``bench/results/runtime.json``.
"""

from __future__ import annotations

import argparse
import json
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
from _spark_bench import (  # noqa: E402
    Finished,
    data_args,
    link_stream,
    read_input,
    run_collecting,
    write_results,
)

from millwheel import Computation, ComputationOptions, DedupOptions, Record, Topology  # noqa: E402
from millwheel._step import StepRunner  # noqa: E402

WINDOW = 10_000
#: how long record ids are kept for exactly-once (``DedupOptions.slack_ms``; ``--slack-ms``)
SLACK_MS = DedupOptions().slack_ms
#: how often a key's old ids are collected (``DedupOptions.gc_interval_ms``; ``--gc-interval-ms``)
GC_INTERVAL_MS = DedupOptions().gc_interval_ms
START = 1_700_000_000_000


# ------------------------------------------------------------------------------------ data
def make_data(
    d: Path, records: int, keys: int, files: int, intervals: int, seed: int = 1
) -> tuple[Path, Path]:
    """Stream-log Parquet files of ``{"query", "ts"}`` records, plus a plain ``query`` column:
    keyed for ``WindowCount`` as its producer would write them, and the same without the key
    columns (``files-unkeyed``)."""
    import numpy as np

    from millwheel.runtime._keying import Keyer

    out, bare = d / f"files-i{intervals}", d / "files-unkeyed"
    if (out / "_READY").exists() and (bare / "_READY").exists():
        return out, bare
    for x in (out, bare):
        shutil.rmtree(x, ignore_errors=True)
        x.mkdir(parents=True)
    keyer = Keyer({"events": [("WindowCount", _query)]}, intervals)
    rng = np.random.default_rng(seed)
    per = records // files
    span = 100_000  # 100 s of event time: 10 windows
    for f in range(files):
        lo = START + f * span // files
        ts = np.sort(lo + rng.integers(0, span // files, per))
        q = rng.integers(0, keys, per)
        queries = [f"q{k}" for k in q.tolist()]
        values = [
            pickle.dumps({"query": s, "ts": t}, 5)
            for s, t in zip(queries, ts.tolist(), strict=True)
        ]
        table = pa.table(
            {
                "id": pa.array([f"r{f}-{i}" for i in range(per)], pa.string()),
                "ts": pa.array(ts, pa.int64()),
                "key": pa.nulls(per, pa.binary()),
                "value": pa.array(values, pa.binary()),
                "wm": pa.nulls(per, pa.int64()),
                "query": pa.array(queries, pa.string()),
            }
        )
        name = f"f{f:05d}-m{int(ts.min())}.parquet"
        pq.write_table(table, bare / name)
        recs = [Record(None, {"query": s}, 0, "") for s in queries]
        for field, array in zip(
            keyer.arrow_fields(["WindowCount"]),
            keyer.arrays([("events", r) for r in recs], ["WindowCount"]),
            strict=True,
        ):
            table = table.append_column(field, array)
        pq.write_table(table, out / name)
    for x in (out, bare):
        (x / "_READY").write_text("")
    return out, bare


def _query(r: Record) -> str:
    return r.value["query"]


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


def run_millwheel(
    spark,
    files: Path,
    work: Path,
    per_trigger: int,
    intervals: int,
    strong: bool,
    layout: str = "intervals",
    comp: type[Computation] | None = None,
    columnar: bool = False,
    mapping: str = "default",
) -> tuple[float, Counter]:
    """One millwheel run; its output windows (``comp``, a computation without output: the
    records it took in, processed and dead-lettered, from its metrics; ``columnar``: the
    same count by ``computations.columnar_windowing.ColumnarWindowCounter``, on ``mapping``:
    ``ComputationOptions.mapping``)."""
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    root = work / "mw"
    link_stream(files, root, "events", "events")
    opts = (
        ComputationOptions(
            dedup=DedupOptions(slack_ms=SLACK_MS, gc_interval_ms=GC_INTERVAL_MS), mapping=mapping
        )
        if strong
        else ComputationOptions(exactly_once=False, strong_productions=False, mapping=mapping)
    )
    t = Topology("bench")
    t.injector("events", Finished())
    # named as the consumer the files are keyed for (``make_data``), whatever the class
    if columnar:
        from computations.columnar_windowing import ColumnarWindowCounter

        params = {"window_ms": WINDOW, "output": "counts", "trailing_empty": 0}
        t.computation(
            ColumnarWindowCounter,
            name="WindowCount",
            inputs={"events": _query},
            outputs=["counts"],
            options=opts,
            params=params,
        )
    else:
        t.computation(
            comp or WindowCount,
            name="WindowCount",
            inputs={"events": _query},
            outputs=["counts"],
            options=opts,
        )
    settings = RuntimeSettings(
        drain=True,
        intervals=intervals,
        max_files_per_trigger=per_trigger,
        poll_ms=50,
        heartbeat_ms=100,
        state_layout=layout,
    )
    rt = SparkRuntime(t, str(root), settings, spark=spark, log=lambda m: None)
    started = time.perf_counter()
    progress = run_collecting(rt, timeout_s=1800, poll_s=settings.poll_ms / 1000).get(
        "WindowCount", {}
    )
    elapsed = time.perf_counter() - started
    if columnar:
        ROWS[:] = [(v["key"], v["window_start"], v["count"]) for v in rt.values("counts")]
    elif comp is None:
        ROWS[:] = [tuple(v) for v in rt.values("counts")]
    if comp is None:
        got = Counter({(k, w): c for k, w, c in ROWS})
    else:
        m = rt.computations["WindowCount"].metrics
        got = Counter({k: m[k] for k in ("records_in", "processed", "dead_letters")})
    BREAKDOWN.append(_breakdown(progress))
    return elapsed, got


#: per millwheel run: where the data batches' time went (Spark's durationMs, summed)
BREAKDOWN: list[dict] = []
#: the last millwheel run's output, ``(key, window start, count)`` as emitted (the counts
#: above keep one per window: ``peers_bench`` also checks that none came twice)
ROWS: list[tuple[str, int, int]] = []


def _breakdown(progress: dict[int, dict]) -> dict:
    data = [p for p in progress.values() if read_input(p)]
    out: dict = {"batches": len(progress), "data_batches": len(data)}
    for k in (
        "triggerExecution",
        "addBatch",
        "latestOffset",
        "queryPlanning",
        "walCommit",
        "commitOffsets",
    ):
        out[f"{k}_ms"] = sum(p["durationMs"].get(k, 0) for p in progress.values())
    ops = [p["stateOperators"][0] for p in progress.values() if p["stateOperators"]]
    out["state_commit_ms"] = sum(o.get("commitTimeMs", 0) for o in ops)
    return out


# ------------------------------------------------------------------------------ native
def run_native(
    spark, files: Path, work: Path, per_trigger: int, dedup: bool = False
) -> tuple[float, Counter]:
    """Spark's own windowed count; ``dedup``: with ``dropDuplicatesWithinWatermark("id")``
    first (native Spark's nearest to exactly-once input)."""
    from pyspark.sql import functions as F

    out = work / ("native_dedup" if dedup else "native")
    shutil.rmtree(out, ignore_errors=True)
    df = (
        spark.readStream.schema("id string, ts long, query string")
        .option("maxFilesPerTrigger", per_trigger)
        .parquet(str(files))
        .withColumn("t", F.timestamp_millis("ts"))
        .withWatermark("t", "0 seconds")
    )
    if dedup:
        df = df.dropDuplicatesWithinWatermark(["id"])
    df = (
        df.groupBy(F.window("t", "10 seconds"), "query")
        .count()
        .select("query", (F.unix_millis(F.col("window.start"))).alias("w"), "count")
    )

    def sink(batch, bid):
        batch.write.mode("overwrite").parquet(str(out / "data" / str(bid)))

    q = (
        df.writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", str(out / "ckpt"))
        .trigger(availableNow=True)
    )
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
            self.counts = handle.getMapState(
                "counts", StructType([StructField("w", LongType())]), schema
            )

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
        spark.readStream.schema("ts long, query string")
        .option("maxFilesPerTrigger", per_trigger)
        .parquet(str(files))
        .withColumn("t", F.timestamp_millis("ts"))
        .withWatermark("t", "0 seconds")
    )
    res = df.groupBy("query").transformWithStateInPandas(
        statefulProcessor=Counts(),
        outputStructType="query string, w long, count long",
        outputMode="Update",
        timeMode="None",
    )

    def sink(batch, bid):
        batch.write.mode("overwrite").parquet(str(out / "data" / str(bid)))

    conf = spark.conf.get("spark.sql.streaming.stateStore.providerClass")
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    try:
        q = (
            res.writeStream.outputMode("update")
            .foreachBatch(sink)
            .option("checkpointLocation", str(out / "ckpt"))
            .trigger(availableNow=True)
        )
        started = time.perf_counter()
        q.start().awaitTermination()
        elapsed = time.perf_counter() - started
    finally:
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", conf)
    t = pq.read_table(out / "data").to_pandas()
    final = t.groupby(["query", "w"])["count"].max()
    return elapsed, Counter({(q_, int(w)): int(c) for (q_, w), c in final.items()})


# --------------------------------------------------------------------------- dispatch
def dispatch(records: int, keys: int, exactly_once: bool, reps: int = 5) -> dict:
    """Records/s through ``StepRunner.step`` (state + timer calls) vs a bare dict loop: best
    of ``reps``, per CPU second and per wall second."""
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

    def step_all() -> None:
        runner = StepRunner(WindowCount(), name="WindowCount", outputs=["counts"], options=opts)
        for key, recs in batches:
            runner.step(key, None, recs, low_watermark=START - 1, now=0)

    def bare() -> None:
        counts: dict = {}
        for key, recs in batches:
            d = counts.setdefault(key, {})
            for r in recs:
                w = r.timestamp // WINDOW * WINDOW
                d[w] = d.get(w, 0) + 1

    out = {}
    for name, fn in (("step", step_all), ("bare", bare)):
        cpu = wall = float("inf")
        for _ in range(reps):
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - w0)
        out[f"{name}_records_per_cpu_s"] = round(n / cpu)
        out[f"{name}_records_per_wall_s"] = round(n / wall)
    return out


RESULTS = ROOT / "bench" / "results" / "runtime.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_args(p, records=1_000_000, keys=10_000, files=100)
    p.add_argument("--variants", default="mw_strong,mw_unkeyed,mw_weak,mw_keys,native,tws")
    p.add_argument(
        "--dispatch-only",
        action="store_true",
        help="only the in-process dispatch figures (no Spark)",
    )
    p.add_argument(
        "--slack-ms",
        type=int,
        default=DedupOptions().slack_ms,
        help="exactly-once id horizon (DedupOptions.slack_ms)",
    )
    p.add_argument(
        "--gc-interval-ms",
        type=int,
        default=DedupOptions().gc_interval_ms,
        help="how often a key's old ids are collected (DedupOptions.gc_interval_ms)",
    )
    p.add_argument("--out", default=None, help="results file (default bench/results/runtime.json)")
    p.add_argument(
        "--no-dispatch", action="store_true", help="skip the in-process dispatch figures"
    )
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench"))
    args = p.parse_args(argv)
    global SLACK_MS, GC_INTERVAL_MS  # noqa: PLW0603 - a command's settings, read by run_millwheel
    SLACK_MS, GC_INTERVAL_MS = args.slack_ms, args.gc_interval_ms

    results: dict = {"args": vars(args)}
    if args.dispatch_only and RESULTS.exists():
        # keep the last throughput run (its arguments and figures): only dispatch is measured again
        kept = json.loads(RESULTS.read_text())
        results = {
            "args": kept.get("args"),
            "throughput": kept.get("throughput"),
            "dispatch_args": vars(args),
        }
    lines = []
    if not args.dispatch_only:
        work = Path(args.work) / f"{args.records}-{args.keys}-{args.files}"
        files, unkeyed = make_data(work, args.records, args.keys, args.files, args.intervals)
        expected = expected_counts(files)
        from millwheel.runtime import spark_session

        variants = args.variants.split(",")
        floors = {}
        if "mw_noop" in variants or "mw_floor" in variants:
            # the Python workers import _floor by name (see its docstring): bench/ on their path
            os.environ["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p
            )
            from _floor import Floor, Noop

            floors = {"mw_noop": Noop, "mw_floor": Floor}
        spark = spark_session("local[2]")
        runners = {
            "mw_strong": lambda: run_millwheel(
                spark, files, work, args.per_trigger, args.intervals, True
            ),
            "mw_unkeyed": lambda: run_millwheel(
                spark, unkeyed, work, args.per_trigger, args.intervals, True
            ),
            "mw_weak": lambda: run_millwheel(
                spark, files, work, args.per_trigger, args.intervals, False
            ),
            "mw_keys": lambda: run_millwheel(
                spark, files, work, args.per_trigger, args.intervals, True, layout="keys"
            ),
            "mw_noop": lambda: run_millwheel(
                spark, files, work, args.per_trigger, args.intervals, False, comp=floors["mw_noop"]
            ),
            "mw_floor": lambda: run_millwheel(
                spark, files, work, args.per_trigger, args.intervals, False, comp=floors["mw_floor"]
            ),
            "native": lambda: run_native(spark, files, work, args.per_trigger),
            "native_dedup": lambda: run_native(spark, files, work, args.per_trigger, dedup=True),
            "mw_col_strong": lambda: run_millwheel(
                spark, files, work, args.per_trigger, args.intervals, True, columnar=True
            ),
            "mw_col_weak": lambda: run_millwheel(
                spark, files, work, args.per_trigger, args.intervals, False, columnar=True
            ),
            "mw_col_arrow_strong": lambda: run_millwheel(
                spark,
                files,
                work,
                args.per_trigger,
                args.intervals,
                True,
                columnar=True,
                mapping="arrow",
            ),
            "mw_col_arrow_weak": lambda: run_millwheel(
                spark,
                files,
                work,
                args.per_trigger,
                args.intervals,
                False,
                columnar=True,
                mapping="arrow",
            ),
            "tws": lambda: run_tws(spark, files, work, args.per_trigger),
        }
        times: dict[str, list[float]] = {v: [] for v in variants}
        breakdowns: dict[str, list[dict]] = {v: [] for v in variants}
        for rep in range(args.reps + 1):
            order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
            for v in order:
                elapsed, got = runners[v]()
                ok = got == (
                    Counter({"records_in": args.records, "processed": args.records})
                    if v in floors
                    else expected
                )
                print(
                    f"rep {rep}{' (warm-up, discarded)' if rep == 0 else ''}: {v:<10} {elapsed:7.2f}s  {args.records / elapsed:>10,.0f} rec/s  output {'OK' if ok else 'DIFFERS'}",
                    flush=True,
                )
                if not ok:
                    print(
                        f"  expected {len(expected)} windows, got {len(got)}; missing {list((expected - got).items())[:3]} extra {list((got - expected).items())[:3]}"
                    )
                    return 1
                if rep > 0:
                    times[v].append(elapsed)
                    if v.startswith("mw"):
                        breakdowns[v].append(BREAKDOWN[-1])
        rates = {v: args.records / statistics.median(ts) for v, ts in times.items()}

        def ratio(a: str, b: str) -> float:
            return statistics.median(tb / ta for ta, tb in zip(times[a], times[b], strict=True))

        lines += ["| variant | median records/s | vs native | vs TWS |", "|---|---:|---:|---:|"]
        lines[0] = "| variant | median records/s | vs native | vs native+dedup | vs TWS |"
        lines[1] = "|---|---:|---:|---:|---:|"
        for v in variants:
            vs_native = f"{ratio(v, 'native'):.2f}x" if "native" in times else "-"
            vs_dedup = f"{ratio(v, 'native_dedup'):.2f}x" if "native_dedup" in times else "-"
            vs_tws = f"{ratio(v, 'tws'):.2f}x" if "tws" in times else "-"
            lines.append(f"| {v} | {rates[v]:,.0f} | {vs_native} | {vs_dedup} | {vs_tws} |")
        if "mw_strong" in times and "mw_weak" in times:
            lines.append("")
            lines.append(
                f"exactly-once + strong productions cost {ratio('mw_weak', 'mw_strong'):.2f}x the time of weak/no-dedup (median of per-pair ratios)"
            )
        for v, bs in breakdowns.items():
            if bs:
                b = bs[-1]
                lines.append(
                    f"{v} (last repetition): {b['data_batches']} data batches of {b['batches']}; triggerExecution {b['triggerExecution_ms']} ms = addBatch {b['addBatch_ms']} + latestOffset {b['latestOffset_ms']} + planning {b['queryPlanning_ms']} + walCommit {b['walCommit_ms']} + commitOffsets {b['commitOffsets_ms']} (+ other); state store commits {b['state_commit_ms']} ms"
                )
        results["throughput"] = {
            "seconds": times,
            "records_per_s": {v: round(r) for v, r in rates.items()},
            "vs_native": {v: round(ratio(v, "native"), 3) for v in variants}
            if "native" in times
            else None,
            "vs_native_dedup": {v: round(ratio(v, "native_dedup"), 3) for v in variants}
            if "native_dedup" in times
            else None,
            "vs_tws": {v: round(ratio(v, "tws"), 3) for v in variants} if "tws" in times else None,
            "breakdown": breakdowns,
        }
    results["dispatch"] = {}
    for eo in () if args.no_dispatch else (True, False):
        d = dispatch(min(args.records, 1_000_000), args.keys, eo)
        results["dispatch"]["exactly_once" if eo else "no_dedup"] = d
        lines.append(
            f"in-process dispatch (StepRunner.step, state + timer calls, exactly_once={eo}): {d['step_records_per_cpu_s']:,} records per CPU s "
            f"({d['step_records_per_wall_s']:,} per wall s); bare dict loop {d['bare_records_per_cpu_s']:,} per CPU s"
        )
    print("\n".join(lines))
    write_results(Path(args.out) if args.out else RESULTS, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
