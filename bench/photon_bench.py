"""Photon benchmark (a command, not a test): ``python bench/photon_bench.py``.

1. **Throughput, side by side in one run** on the same generated logs, on one local Spark
   session (``local[2]``):

   * **millwheel Photon, per record** (``photon``) — the per-record ``Joiner`` on the Spark
     runtime, exactly-once dedup, strong productions, every click committed to the real
     IdRegistry service over HTTP (one ``commit_many`` per micro-batch and key interval),
     until drained;
   * **millwheel Photon, columnar** (``photon_col``, the default joiner) — the same topology
     with ``ColumnarJoiner`` (``topologies/photon/columnar.py``): the same guarantees and
     registry commits, a batch of query ids per call;
   * **the same on the Arrow mapping** (``photon_arrow``: ``PhotonConfig(joiner_mapping="arrow")``)
     — the joiner's state in versioned files, not Spark's state store;
   * **Spark native** — ``readStream.json`` of both directories, ``withWatermark`` on both
     sides, ``dropDuplicatesWithinWatermark`` on the click and query ids, and an inner
     stream-stream join on the query id with a time-range condition (clicks within 60 s
     of their query), ``trigger(availableNow=True)``.

   Records/s = log lines read (queries + clicks, duplicates and malformed lines included)
   / wall time from the start of the run to the last output. A warm-up round is
   discarded, repetitions are interleaved, the ratio is the median of per-pair ratios.
   Both answers are checked against the batch join in pandas. ``--stages`` adds, for each
   measured run, where its time went: each streaming query's micro-batches (Spark's
   progress reports: count, rows, ``durationMs`` summed by phase) and the CPU seconds of
   every process of the run by kind (the JVM, the Python workers, the Python Data
   Sources' planner processes, this driver, the registry service), from ``/proc``.
2. **Latency in continuous mode**: a writer appends the lines of a generated sample to
   growing, rotating log files at their arrival times (a steady paced rate), a live
   Photon pipeline (trigger 0) joins them, and each click's latency is the wall time its
   joined event became visible (its output file published after the batch commit) minus
   the wall time its line was written. p50 / p90 / p99, and the Spark progress of each query.
3. **Profile**: cProfile of the joiner's Python work in process (the harness, same step code).
4. **Log-store lookups** (``lookups``): the LogsEventStore (§3.4.2) alone on the sample's
   query logs, its index warm: lookups per CPU second (best of 3) of 5,000 logged query
   ids (hits) and of 5,000 ids that are not logged (misses: every candidate file checked).

Writes ``bench/results/photon.json`` (``--out``); ``--variants photon,photon_col,native`` picks the
throughput variants (``--out bench/results/photon_columnar.json`` for the columnar comparison).
``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _spark_bench import in_repo  # noqa: E402

from topologies.photon import (  # noqa: E402
    GeneratorConfig,
    PhotonConfig,
    batch_join,
    build,
    evaluate,
    generate,
    replay,
)
from topologies.photon.drivers import REINJECT, prepare_run, read_run, run_spark  # noqa: E402
from topologies.photon.generator import load_truth  # noqa: E402
from topologies.photon.registry import RegistryFactory  # noqa: E402

QUERY_SCHEMA = "query_id string, ts long, advertiser_id string, ad_text string, terms array<string>"
CLICK_SCHEMA = "click_id string, query_id string, ts long, ad_slot int"


def lines_of(data: Path) -> int:
    return sum(
        len(p.read_bytes().splitlines())
        for log in ("queries", "clicks")
        for p in (data / log).glob("*.jsonl")
    )


# ------------------------------------------------------------------------------ millwheel
def run_photon(
    data: Path, work: Path, intervals: int, *, columnar: bool, mapping: str = "default"
) -> tuple[float, dict[str, Any]]:
    from id_registry import embedded_registry
    from millwheel.runtime import RuntimeSettings

    run = work / "photon-run"
    shutil.rmtree(run, ignore_errors=True)
    with embedded_registry() as service:
        factory = RegistryFactory(service.url, str(Path(service.data_dir) / "secret"))
        settings = RuntimeSettings(
            intervals=intervals, poll_ms=50, heartbeat_ms=100, max_restarts=500
        )
        started = time.perf_counter()
        config = PhotonConfig(columnar_joiner=columnar, joiner_mapping=mapping)
        result = run_spark(
            data,
            run,
            config=config,
            settings=settings,
            pipeline="bench",
            registry=factory,
            registry_url=service.url,
            timeout_s=3600,
        )
        elapsed = time.perf_counter() - started
    report = evaluate(result, data, load_truth(data))
    return elapsed, {
        "ok": report["ok"],
        "joined": report["joined"]["output"],
        "expected": report["joined"]["expected"],
        "duplicates": report["duplicates_in_output"],
        "registry_commits": result.metrics["Joiner"].get("once_committed"),
    }


# ---------------------------------------------------------------------------------- native
def run_native(spark: Any, data: Path, work: Path) -> tuple[float, dict[str, Any]]:
    from pyspark.sql import functions as F

    out = work / "native"
    shutil.rmtree(out, ignore_errors=True)
    queries = (
        spark.readStream.schema(QUERY_SCHEMA)
        .json(str(data / "queries"))
        .where("query_id IS NOT NULL AND ts IS NOT NULL")
        .withColumn("query_time", F.timestamp_millis("ts"))
        .withWatermark("query_time", "30 seconds")
        .dropDuplicatesWithinWatermark(["query_id"])
        .select(
            F.col("query_id").alias("q_id"),
            "query_time",
            F.col("ts").alias("query_ts"),
            "advertiser_id",
            "ad_text",
            "terms",
        )
    )
    clicks = (
        spark.readStream.schema(CLICK_SCHEMA)
        .json(str(data / "clicks"))
        .where("click_id IS NOT NULL AND ts IS NOT NULL AND query_id IS NOT NULL")
        .withColumn("click_time", F.timestamp_millis("ts"))
        .withWatermark("click_time", "10 seconds")
        .dropDuplicatesWithinWatermark(["click_id"])
    )
    joined = clicks.join(
        queries,
        F.expr(
            "query_id = q_id AND click_time >= query_time AND click_time <= query_time + interval 60 seconds"
        ),
    ).select(
        "click_id",
        "query_id",
        "ad_slot",
        "advertiser_id",
        "ad_text",
        "terms",
        "query_ts",
        F.col("ts").alias("click_ts"),
    )

    def sink(batch: Any, bid: int) -> None:
        batch.write.mode("overwrite").parquet(str(out / "data" / str(bid)))

    q = (
        joined.writeStream.outputMode("append")
        .foreachBatch(sink)
        .option("checkpointLocation", str(out / "ckpt"))
        .trigger(availableNow=True)
    )
    started = time.perf_counter()
    q.start().awaitTermination()
    elapsed = time.perf_counter() - started
    import pyarrow.parquet as pq

    parts = [p for p in (out / "data").rglob("*.parquet")] if (out / "data").exists() else []
    rows = [r for p in parts for r in pq.read_table(p).to_pylist()]
    ids = [r["click_id"] for r in rows]
    expected = {j["click_id"] for j in batch_join(data).joined}
    return elapsed, {
        "joined": len(rows),
        "expected": len(expected),
        "exact_ids": set(ids) == expected,
        "duplicates": len(ids) - len(set(ids)),
    }


VARIANTS = ("photon", "photon_col", "photon_arrow", "native")


# ---------------------------------------------------------------------------------- stages
def _process_kind(cmd: str) -> str:
    for marker, kind in (
        ("java", "jvm"),
        ("python_streaming_source_runner", "python planners (one per log injector)"),
        ("pyspark.daemon pyspark.worker", "python workers"),
        ("pyspark.daemon", "python data-source workers"),
        ("id_registry", "registry service"),
    ):
        if marker in cmd:
            return kind
    return "other"


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of this process and every process under it, by pid (Linux ``/proc``)."""
    rows: dict[int, tuple[int, float, str]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        rows[int(pid)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, cmd)
    mine, grew = {os.getpid()}, True
    while grew:
        kids = {p for p, (parent, _, _) in rows.items() if parent in mine} - mine
        mine |= kids
        grew = bool(kids)
    return {
        p: ("driver" if p == os.getpid() else _process_kind(rows[p][2]), rows[p][1])
        for p in mine
        if p in rows
    }


class CpuWatch(threading.Thread):
    """CPU seconds of a run's processes by kind: :func:`cpu_by_process` every second, each
    process's last reading kept (a log injector's planner process ends with its query; it
    is idle by then). Reading ``/proc`` costs the driver ~0.1 s of CPU a second: the
    headline figures come from runs without ``--stages``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.before = cpu_by_process()
        self.seen = dict(self.before)
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.seen.update(cpu_by_process())

    def stop(self) -> dict[str, float]:
        self.done.set()
        self.join()
        self.seen.update(cpu_by_process())
        out: dict[str, float] = {}
        for pid, (kind, cpu) in self.seen.items():
            out[kind] = out.get(kind, 0.0) + cpu - self.before.get(pid, (kind, 0.0))[1]
        return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


class Stages:
    """Every streaming query's progress reports during a run (a ``StreamingQueryListener``)."""

    def __init__(self, spark: Any) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        reports = self.reports = []  # type: list[dict[str, Any]]

        class _Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                p = event.progress
                reports.append(
                    {
                        "name": p.name,
                        "rows": p.numInputRows,
                        "ms": dict(p.durationMs),
                        "at": p.timestamp,
                        "wm": (p.eventTime or {}).get("watermark"),
                    }
                )

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        self.listener = _Listener()
        spark.streams.addListener(self.listener)
        self.spark = spark

    def take(self) -> dict[str, Any]:
        """The reports since the last call, summed by query: micro-batches with data, rows, ms by phase."""
        time.sleep(0.5)  # the listener's events arrive asynchronously
        out: dict[str, Any] = {}
        reports, self.reports[:] = list(self.reports), []
        for r in reports:
            if not r["rows"] and "addBatch" not in r["ms"]:
                continue  # an idle poll
            q = out.setdefault(
                r["name"] or "native",
                {"batches": 0, "rows": 0, "ms": {}, "batch_ms": [], "each": []},
            )
            q["batches"] += 1
            q["rows"] += r["rows"]
            q["batch_ms"].append(r["ms"].get("triggerExecution", 0))
            # each batch: when it started, its rows, its ms, the event-time watermark it ran under
            q["each"].append([r["at"], r["rows"], r["ms"].get("triggerExecution", 0), r["wm"]])
            for k, v in r["ms"].items():
                q["ms"][k] = q["ms"].get(k, 0) + v
        return out

    def close(self) -> None:
        self.spark.streams.removeListener(self.listener)


def throughput(
    spark: Any,
    data: Path,
    work: Path,
    reps: int,
    intervals: int,
    variants: tuple[str, ...] = VARIANTS,
    *,
    stages: bool = False,
) -> dict[str, Any]:
    lines = lines_of(data)
    runs: dict[str, list[float]] = {v: [] for v in variants}
    checks: dict[str, Any] = {}
    breakdown: dict[str, list[Any]] = {v: [] for v in variants}
    listener = Stages(spark) if stages else None
    try:
        for rep in range(reps + 1):  # round 0 is the warm-up
            order = (
                list(variants) if rep % 2 == 0 else list(reversed(variants))
            )  # interleaved: drift hits every variant
            for variant in order:
                watch = CpuWatch() if stages else None
                if listener is not None:
                    listener.take()
                if variant == "native":
                    elapsed, check = run_native(spark, data, work)
                else:
                    elapsed, check = run_photon(
                        data,
                        work,
                        intervals,
                        columnar=variant != "photon",
                        mapping="arrow" if variant == "photon_arrow" else "default",
                    )
                cpu = watch.stop() if watch is not None else {}
                print(
                    f"  {'warm-up' if rep == 0 else f'rep {rep}'} {variant}: {elapsed:.1f}s, {lines / elapsed:,.0f} lines/s, {check}",
                    flush=True,
                )
                checks[variant] = check
                if rep:
                    runs[variant].append(elapsed)
                if listener is not None and rep:
                    got = {
                        "cpu_s": cpu,
                        "cpu_total_s": round(sum(cpu.values()), 2),
                        "queries": listener.take(),
                    }
                    breakdown[variant].append(got)
                    print(f"    cpu s {got['cpu_total_s']}: {got['cpu_s']}", flush=True)
                    for name, q in got["queries"].items():
                        print(
                            f"    {name}: {q['batches']} batches, {q['rows']:,} rows, batch ms {q['batch_ms']}, addBatch {q['ms'].get('addBatch', 0)} ms",
                            flush=True,
                        )
    finally:
        if listener is not None:
            listener.close()
    out: dict[str, Any] = {
        "lines": lines,
        "variants": list(variants),
        "seconds": runs,
        "checks": checks,
    }
    if stages:
        out["stages"] = breakdown
    for v in variants:
        out[f"{v}_lines_per_s"] = lines / statistics.median(runs[v])
    if "native" in variants:
        for v in variants:
            if (
                v != "native"
            ):  # the median of per-repetition ratios (each pair measured side by side)
                out[f"ratio_{v}_over_native"] = statistics.median(
                    n / p for p, n in zip(runs[v], runs["native"], strict=True)
                )
    if "photon" in variants and "photon_col" in variants:
        out["ratio_photon_col_over_photon"] = statistics.median(
            p / c for p, c in zip(runs["photon"], runs["photon_col"], strict=True)
        )
    return out


# --------------------------------------------------------------------------------- latency
class _Writer(threading.Thread):
    """Appends a sample's lines to growing, rotating files at their arrival times (shifted to now)."""

    def __init__(self, sample: Path, live: Path, lead_s: float) -> None:
        super().__init__(daemon=True)
        self.truth = load_truth(sample)
        self.sample, self.live = sample, live
        self.shift = time.time() * 1000 + lead_s * 1000 - self.truth["generator"]["start_ms"]
        self.written: dict[str, float] = {}

    def run(self) -> None:
        plan = []
        for log in ("queries", "clicks"):
            (self.live / log).mkdir(parents=True, exist_ok=True)
            for f in self.truth["files"][log]:
                lines = (self.sample / log / f["name"]).read_text().splitlines()
                span = f["written_to_ms"] - f["written_from_ms"]
                for i, line in enumerate(lines):
                    plan.append(
                        (f["written_from_ms"] + span * i / max(1, len(lines)), log, f["name"], line)
                    )
        plan.sort()
        handles: dict[tuple[str, str], Any] = {}
        for at_ms, log, name, line in plan:
            wait = (at_ms + self.shift) / 1000 - time.time()
            if wait > 0:
                time.sleep(wait)
            fh = handles.get((log, name))
            if fh is None:
                fh = handles[(log, name)] = open(self.live / log / name, "a", encoding="utf-8")  # noqa: SIM115
            fh.write(line + "\n")
            fh.flush()
            if log == "clicks" and line.startswith('{"click_id"'):
                self.written.setdefault(json.loads(line)["click_id"], time.time())
        for fh in handles.values():
            fh.close()
        for log in ("queries", "clicks"):
            (self.live / log / "_DONE").write_text("")


def latency(spark: Any, work: Path, rate: float, seconds: int, intervals: int) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from millwheel.runtime import RuntimeSettings, SparkRuntime

    sample, live, run = work / "lat-sample", work / "lat-live", work / "lat-run"
    for d in (sample, live, run):
        shutil.rmtree(d, ignore_errors=True)
    generate(sample, GeneratorConfig(seed=7, rate=rate, duration_s=seconds))
    (live / "queries").mkdir(parents=True)
    (live / "clicks").mkdir(parents=True)
    from id_registry import embedded_registry

    cfg = PhotonConfig(idle_finish_ms=2_000)
    with embedded_registry() as service:
        prepare_run(run, live, cfg, "latency", service.url)
        t = build(live, config=cfg, reinject_dir=run / REINJECT, finite=False)
        factory = RegistryFactory(service.url, str(Path(service.data_dir) / "secret"))
        settings = RuntimeSettings(
            intervals=intervals,
            poll_ms=20,
            heartbeat_ms=100,
            pipeline="latency",
            registry=factory,
            max_restarts=500,
        )
        rt = SparkRuntime(t, str(run), settings, spark=spark, log=lambda m: None)
        rt.start()
        writer = _Writer(sample, live, lead_s=2.0)
        writer.start()
        try:
            deadline = time.monotonic() + seconds + 900
            while not rt.drained() and time.monotonic() < deadline:
                rt.poll()
                time.sleep(settings.poll_ms / 1000)
            progress = {name: _progress(q.query) for name, q in rt.computations.items()}
            progress.update(
                {
                    f"injector.{n}": _progress(i.query)
                    for n, i in rt.injectors.items()
                    if getattr(i, "query", None)
                }
            )
            published = dict(rt.computations["Joiner"].outbox.published_at)
        finally:
            rt.stop()
    lat: list[float] = []
    for (stream, name), at in published.items():
        if stream != "joined_clicks":
            continue
        loc = rt.streams.location("joined_clicks", "Joiner").child(name)
        for v in pq.read_table(loc.path, columns=["value"]).column("value").to_pylist():
            import pickle

            cid = pickle.loads(v)["click_id"]
            if cid in writer.written:
                lat.append(at - writer.written[cid])
    s = sorted(lat)

    def pct(p: float) -> float:
        return s[max(0, min(len(s) - 1, int(round(p / 100 * len(s))) - 1))] if s else float("nan")

    report = evaluate(read_run(run), live, load_truth(sample))
    return {
        "rate_queries_per_s": rate,
        "seconds": seconds,
        "clicks": len(lat),
        "p50_s": pct(50),
        "p90_s": pct(90),
        "p99_s": pct(99),
        "max_s": s[-1] if s else None,
        "join_ok": report["ok"],
        "progress": progress,
    }


def _progress(query: Any) -> dict[str, float]:
    """Median durations (ms) of a streaming query's recent micro-batches, by phase."""
    if query is None:
        return {}
    phases: dict[str, list[float]] = {}
    for p in query.recentProgress:
        for k, v in (p.get("durationMs") or {}).items():
            phases.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in phases.items()} | {
        "batches": len(query.recentProgress)
    }


# --------------------------------------------------------------------------------- profile
def profile(data: Path) -> dict[str, Any]:
    prof = cProfile.Profile()
    started = time.perf_counter()
    prof.enable()
    result = replay(data, mode="batch")
    prof.disable()
    elapsed = time.perf_counter() - started
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    lines = lines_of(data)
    return {
        "harness_seconds": elapsed,
        "harness_lines_per_s": lines / elapsed,
        "joined": len(result.joined),
        "top_tottime": buf.getvalue(),
    }


def lookups(data: Path, n: int = 5_000) -> dict[str, Any]:
    import random

    from topologies.photon.eventstore import LogsEventStore

    logs = data / "queries"
    ids = [
        json.loads(line)["query_id"]
        for p in sorted(logs.glob("*.jsonl"))
        for line in p.read_text().splitlines()
        if line.startswith('{"query_id"')
    ]
    hits = random.Random(1).sample(ids, min(n, len(ids)))
    misses = [q[:-1] + "x" for q in hits]
    store = LogsEventStore(logs)
    for q in hits:  # every candidate file indexed: what is measured is the lookup
        store.lookup(q)
    out: dict[str, Any] = {}
    for name, qs in (("hits", hits), ("misses", misses)):
        best = float("inf")
        for _ in range(3):
            c = time.process_time()
            for q in qs:
                store.lookup(q)
            best = min(best, time.process_time() - c)
        out[f"{name}_per_cpu_s"] = round(len(qs) / best)
    print(
        f"log-store lookups per CPU s: hits {out['hits_per_cpu_s']:,}, misses {out['misses_per_cpu_s']:,}",
        flush=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=1_000.0, help="queries/s of the throughput sample")
    p.add_argument("--duration-s", type=int, default=120)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--intervals", type=int, default=8)
    p.add_argument("--latency-rate", type=float, default=400.0)
    p.add_argument("--latency-s", type=int, default=90)
    p.add_argument(
        "--skip", default="", help="comma-separated: throughput, latency, profile, lookups"
    )
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated throughput variants of {VARIANTS}",
    )
    p.add_argument(
        "--stages",
        action="store_true",
        help="throughput: each measured run's micro-batches per query and CPU seconds per process kind",
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "photon.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.rate, args.duration_s, args.reps, args.latency_rate, args.latency_s = (
            200.0,
            20,
            1,
            100.0,
            20,
        )
    skip = set(args.skip.split(",")) - {""}
    from millwheel.runtime import spark_session

    work = Path(tempfile.mkdtemp(prefix="photon-bench-"))
    data = work / "sample"
    truth = generate(data, GeneratorConfig(seed=3, rate=args.rate, duration_s=args.duration_s))
    out: dict[str, Any] = {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": os.getloadavg(),
        "sample": {
            "queries": truth["queries"],
            "clicks": truth["clicks"],
            "lines": lines_of(data),
            "rate": args.rate,
            "duration_s": args.duration_s,
        },
        "config": dataclasses.asdict(PhotonConfig()),
    }
    spark = spark_session("local[2]")
    try:
        if "throughput" not in skip:
            print(f"throughput on {out['sample']}", flush=True)
            variants = tuple(v for v in args.variants.split(",") if v)
            unknown = set(variants) - set(VARIANTS)
            if unknown:
                p.error(f"unknown variants {sorted(unknown)}; known: {VARIANTS}")
            out["throughput"] = throughput(
                spark, data, work, args.reps, args.intervals, variants, stages=args.stages
            )
        if "latency" not in skip:
            print(f"latency at {args.latency_rate} queries/s for {args.latency_s}s", flush=True)
            out["latency"] = latency(spark, work, args.latency_rate, args.latency_s, args.intervals)
        if "profile" not in skip:
            out["profile"] = profile(data)
        if "lookups" not in skip:
            out["lookups"] = lookups(data)
    finally:
        out["load_after"] = os.getloadavg()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(in_repo(json.dumps(out, indent=1, default=str)))
        shutil.rmtree(work, ignore_errors=True)
    tp, lat = out.get("throughput"), out.get("latency")
    if tp:
        rates = ", ".join(f"{v} {tp[f'{v}_lines_per_s']:,.0f}" for v in tp["variants"])
        ratios = ", ".join(f"{k[6:]} {v:.2f}x" for k, v in tp.items() if k.startswith("ratio_"))
        print(f"throughput (lines/s): {rates}; {ratios} (target: photon_col >= 1.0x native)")
    if lat:
        print(
            f"latency: p50 {lat['p50_s']:.2f}s p90 {lat['p90_s']:.2f}s p99 {lat['p99_s']:.2f}s over {lat['clicks']} clicks (target p90 <= 3 s)"
        )
    if "profile" in out:
        print(out["profile"]["top_tottime"])
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
